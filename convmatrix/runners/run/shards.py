"""``--shard I/N --run-label L``: one CI job per host, every job writing into one run.

Shard ``I`` of ``N`` runs the cases whose id (a hash) is ``I`` modulo ``N``
(``store.Shard.owns``): shards are disjoint, together complete, and agree without talking to
each other. They find their run in the shared database by ``L`` (the first to start creates
it). ``--shard auto[/N]`` takes the index, and the count where the CI has one, from the CI's
own variables:

- Kubernetes Indexed Job: ``JOB_COMPLETION_INDEX``; no count variable: ``--shard auto/N``
  with N the Job's ``.spec.completions``.
- Slurm job array: ``SLURM_ARRAY_TASK_ID`` - ``SLURM_ARRAY_TASK_MIN``, of
  ``SLURM_ARRAY_TASK_COUNT``.
- Buildkite parallel job: ``BUILDKITE_PARALLEL_JOB`` of ``BUILDKITE_PARALLEL_JOB_COUNT``.

Without ``--run-label`` the label comes from the CI's id of the whole job where there is one
(``BUILDKITE_BUILD_ID``, ``SLURM_ARRAY_JOB_ID``), so every shard of one build agrees.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from convmatrix.core.errors import UsageError
from convmatrix.runners.run.store import Shard

__all__ = ["CI_INDEX", "parse_shard"]

# (index variable, count variable or None, variable whose value is subtracted or None, label)
CI_INDEX = (
    ("JOB_COMPLETION_INDEX", None, None, None),
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_JOB_ID"),
    ("BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT", None, "BUILDKITE_BUILD_ID"),
)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--shard: {what} {text!r} is not a whole number") from None


def _from_ci(count: int | None, env: Mapping[str, str]) -> tuple[int, int, str | None]:
    for index_var, count_var, base_var, label_var in CI_INDEX:
        if env.get(index_var, "").strip() == "":
            continue
        index = _int(env[index_var], index_var)
        if base_var and env.get(base_var):
            index -= _int(env[base_var], base_var)
        if count is None and count_var and env.get(count_var):
            count = _int(env[count_var], count_var)
        if count is None:
            raise UsageError(f"--shard auto: {index_var} gives the index; give the count: auto/N")
        label = (
            f"{label_var.lower()}-{env[label_var]}" if label_var and env.get(label_var) else None
        )
        return index, count, label
    names = ", ".join(v for v, *_ in CI_INDEX)
    raise UsageError(f"--shard auto: none of {names} is set; give --shard I/N")


def parse_shard(
    spec: str | None, label: str | None, environ: Mapping[str, str] | None = None
) -> Shard | None:
    """The shard ``--shard`` and ``--run-label`` name; None when not sharded. ``UsageError``
    names the argument that is wrong."""
    if spec is None:
        if label is not None:
            raise UsageError("--run-label names the run of sharded jobs: give --shard I/N too")
        return None
    env = os.environ if environ is None else environ
    head, _, tail = spec.strip().partition("/")
    count = _int(tail, "the count") if tail else None
    if head == "auto":
        index, count, ci_label = _from_ci(count, env)
    else:
        if count is None:
            raise UsageError(f"--shard {spec!r}: give I/N (e.g. 0/4) or auto[/N]")
        index, ci_label = _int(head, "the index"), None
    if count < 1 or not 0 <= index < count:
        raise UsageError(
            f"--shard {spec!r}: the index must be in 0..N-1 and N >= 1 (got {index}/{count})"
        )
    label = label or ci_label
    if not label:
        raise UsageError("--shard needs --run-label LABEL: the name every shard finds the run by")
    return Shard(index, count, label)
