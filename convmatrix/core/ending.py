"""How a process of convmatrix ends: its work delivered, then ``os._exit``, no teardown.

An interpreter that imported torch spends about 0.6 s after its last ``atexit`` hook freeing
its modules and objects (``benchmarks/bench_ending.py``: a process that imported torch and
convmatrix's run and took one backward, median 0.59 s from its last statement to its parent
seeing it exit; 0.03 s through ``end_process``). Nobody needs that work, and somebody waits
for it: the shell for the command, and the xdist controller for each worker (it waits on
every worker's exit before it closes the run). At ``-n 1`` a run spent about 1 s of 7-11 s on
the two teardowns in series.

Two ways to end, one function (``end_process``):

- a process that ran no kernel (the command's process under ``-n N``, ``convmatrix
  history``, ...) first does what Python does before its teardown: ``threading``'s exit
  (its callbacks, then the joins of non-daemon threads), then the ``atexit`` hooks (Ray's
  shutdown, logging's flush);
- a process that ran a kernel (``-n 0``, an xdist worker, a Ray actor's case process) does
  neither: a thread or a hook the kernel left may sleep forever, and the run's status must
  not wait on it (tests/test_hostile_kernels.py). A worker's main code is execnet's, not
  ours: it ends at the moment that code returns (``end_when_main_returns``), before Python
  joins threads.

Both flush stdout and stderr. Files are the writers' to close: nothing of convmatrix leaves
one open for the teardown to flush.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

__all__ = ["end_process", "end_when_main_returns", "threads_left"]


def threads_left() -> list[threading.Thread]:
    """The live non-daemon threads besides the main one: what Python joins before exiting."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and t.is_alive() and not t.daemon]


def end_process(code: int, *, ran_kernel: bool) -> NoReturn:
    """End this process with ``code`` now (see the module's docstring for what runs first)."""
    if not ran_kernel:
        # Python's own exit, in its order, up to the teardown this skips: the threading
        # module's exit callbacks (they stop ``concurrent.futures`` pools, whose idle
        # workers a plain join would wait on for ever), the joins, then the atexit hooks.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream: nothing left to flush
            stream.flush()
    os._exit(code)


def end_when_main_returns(code: int = 0) -> None:
    """End this process with ``code`` as soon as its main code returns, before Python joins
    its threads or runs its ``atexit`` hooks, as a process that ran a kernel ends. For a
    process whose main code is not ours (an xdist worker runs execnet's loop until the
    controller lets it go). ``threading._register_atexit`` is CPython's hook for that moment
    (``concurrent.futures`` uses it): a plain ``atexit`` hook comes after the joins, and
    after every hook registered later (a kernel's)."""
    threading._register_atexit(end_process, code, ran_kernel=True)  # type: ignore[attr-defined]
