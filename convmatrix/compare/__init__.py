"""Judging two runs: what changed between a baseline and a new run of the same kernel, matrix
and device, case by case (cases matched by their stable id).

Pure and torch-free: records in (``convmatrix.core.records``), plain records out. The diff
report (``reports.diff``), the regression scan and confirmation (``service``) all judge
through here, so a change is called the same thing wherever it is shown.

- ``runs``: ``compare_runs`` — outcome sections (new failures, fixed, ...), error changes and
  timing changes of two runs, under ``DiffOptions``;
- ``errors``: the error rule (one output of one case, base against head);
- ``timing``: the timing statistics (``pairs``: two runs; ``pooled``: the pair as a whole;
  ``history``: a baseline window against confirming runs; ``rules``: their parameters).
"""
