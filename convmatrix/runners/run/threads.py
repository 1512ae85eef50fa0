"""The thread policy of a CPU run: how many intra-op threads each process that runs cases
gets, and how its idle OpenMP threads wait. One decision, made by the process that starts the
run and handed to every process that runs cases (``-n 0`` itself, xdist workers, Ray actors'
case children), recorded with the run (``RunMeta.options["facts"]["threads"]``).

Why one thread per worker by default (``auto``): the reference and the metrics run in channel
blocks, thousands of small parallel regions a case. torch's default (every core, OpenMP threads
spinning between regions) makes a second thread spin while another process holds the core:
beside one busy neighbour ``nightly -n 0`` took 60 s at two threads and 9 s at one. The
parallelism of a CPU run comes from workers (``-n N``), each with one thread; and every
process of the run starts with ``OMP_WAIT_POLICY=PASSIVE``, so a pool that does have several
threads (``--threads 4``) sleeps between regions instead of spinning (docs/benchmarks.md,
"Thread policy", has the figures).

Overrides, first that is set wins:

- ``OMP_NUM_THREADS`` in the environment: the user's explicit count, and their
  ``OMP_WAIT_POLICY`` (or none) with it;
- ``--threads N|auto|torch`` (``RunOptions.threads``);
- ``CONVMATRIX_THREADS`` (same values).

``torch`` is the policy of before: ``cores // workers`` threads a worker, torch's own default
in a ``-n 0`` process, OpenMP's default (spinning) wait.

Trap: OpenMP reads ``OMP_WAIT_POLICY`` once, when torch's library loads. ``convmatrix run``
exports it (``export``) before it imports torch, and every worker and case child inherits it;
a run started from Python or ``pytest --matrix`` has torch loaded already, so its own process
keeps the wait it has (it still gets its thread count; with one thread nothing waits), and
only the processes it starts get the policy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

from convmatrix.core.environment import THREADS_ENV, check_threads
from convmatrix.core.errors import UsageError

__all__ = ["WAIT_ENV", "ThreadSetting", "decide", "export", "use"]

WAIT_ENV = "OMP_WAIT_POLICY"
OMP_ENV = "OMP_NUM_THREADS"
PASSIVE = "PASSIVE"


@dataclass(frozen=True)
class ThreadSetting:
    """``spec``: auto, torch or a count; ``source``: what chose it (default, --threads,
    CONVMATRIX_THREADS, OMP_NUM_THREADS); ``wait``: the ``OMP_WAIT_POLICY`` of the run's
    processes (None: OpenMP's default)."""

    spec: str = "auto"
    source: str = "default"
    wait: str | None = PASSIVE

    def threads(self, workers: int, cores: int) -> int | None:
        """Intra-op threads of one process running cases, when ``workers`` processes share
        ``cores`` (``-n 0``: workers 0, the run's own process). None: torch's default."""
        if self.spec == "auto":
            return 1
        if self.spec == "torch":
            return None if workers == 0 else max(1, cores // workers)
        return int(self.spec)

    def environment(self) -> dict[str, str]:
        """What a process of the run is started with (its OpenMP reads it when it loads)."""
        return {WAIT_ENV: self.wait} if self.wait else {}

    def record(self, workers: int, cores: int) -> dict[str, Any]:
        """The policy as the run records it: what was asked and what each process got."""
        threads = self.threads(workers, cores)
        return {
            **asdict(self),
            "threads": threads if threads is not None else "torch default",
            "workers": workers,
            "cores": cores,
        }

    def handover(self) -> dict[str, Any]:
        """Plain values for a worker (``Prepared.handover``); ``ThreadSetting(**value)``."""
        return asdict(self)


def _omp_count(text: str) -> str | None:
    """The outer count of an ``OMP_NUM_THREADS`` value (``4`` or nested ``4,2``), or None."""
    first = text.split(",")[0].strip()
    return first if first.isdigit() and int(first) > 0 else None


def decide(given: str | None = None, environ: Mapping[str, str] | None = None) -> ThreadSetting:
    """The policy of a run: ``given`` (``--threads``) unless ``OMP_NUM_THREADS`` is set, else
    ``CONVMATRIX_THREADS``, else ``auto``. ``UsageError`` names a bad ``--threads``."""
    env = os.environ if environ is None else environ
    omp = _omp_count(env.get(OMP_ENV, ""))
    if omp is not None:  # the user's explicit count wins, with their wait policy (or none)
        return ThreadSetting(omp, OMP_ENV, env.get(WAIT_ENV) or None)
    if given is not None and str(given).strip():
        spec, source = str(given).strip().lower(), "--threads"
        why = check_threads(spec)
        if why:
            raise UsageError(f"--threads {given!r}: {why}")
    elif env.get(THREADS_ENV, "").strip():
        spec, source = env[THREADS_ENV].strip().lower(), THREADS_ENV  # checked at start-up
    else:
        spec, source = "auto", "default"
    wait = env.get(WAIT_ENV) or (None if spec == "torch" else PASSIVE)
    return ThreadSetting(spec, source, wait)


def export(policy: ThreadSetting, environ: MutableMapping[str, str] | None = None) -> None:
    """Put the policy's wait into the environment: this process's OpenMP when torch is not
    loaded yet, and every process started after (xdist workers, case children)."""
    env = os.environ if environ is None else environ
    env.update(policy.environment())


def use(policy: ThreadSetting, workers: int, cores: int) -> int:
    """Apply the policy to this process (it runs cases): the environment, torch's intra-op
    threads; the count it now has."""
    import torch

    export(policy)
    threads = policy.threads(workers, cores)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
