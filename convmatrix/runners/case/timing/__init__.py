"""Timing: the scopes of docs/spec.md §5, the timer, the performance model and calibration,
and the regression statistics that ``convmatrix diff`` applies to stored timings.

- measuring (torch): ``measure`` (warm-up, repetitions, the cold call apart), ``scopes``
  (kernel, op, subgraph), ``cases`` (every scope of one case, interleaved, with its bound),
  ``calibrate`` (measured rates), ``perfmodel`` (flops and bytes of a case), ``subgraph``;
- judging (pure, no torch): ``compare`` (two runs), ``pooled`` (the pair as a whole),
  ``history`` (a baseline window against confirming runs).

Nothing is imported here, so that reading stored timings never imports torch.
"""
