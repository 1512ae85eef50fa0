"""Every environment variable convmatrix reads, declared once, and the check run at start-up.

A variable read deep inside a run (``CONVMATRIX_CPU_CLOCK`` only when a case is timed, the
tiled kernel's geometry only when it is loaded) would otherwise be found wrong after minutes
of work, or blamed on a kernel: a typo in the clock recorded seven timing regressions, a
geometry of a billion-wide tile became a 25 TB allocation. ``check_environment`` looks at each
declared variable that is set, before any work, and refuses the first bad one in one line
naming it (``convmatrix`` runs it once per command; ``RunOptions.checked`` for every door of a
run). The modules that read a variable keep their own parsing; the names, the checks and the
bounds are here.

No torch and no database driver at import: ``convmatrix --help`` stays fast.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from convmatrix.core.errors import UsageError

__all__ = [
    "GEOMETRY_KEYS",
    "GEOMETRY_LIMITS",
    "MAX_THREADS",
    "THREADS_ENV",
    "THREAD_COUNT_VARIABLES",
    "VARIABLES",
    "Variable",
    "check_environment",
    "check_geometry_value",
    "check_thread_count",
    "check_threads",
    "thread_limit",
]

# The tiled kernel's geometry: textual keys -> Geometry fields, and each field's upper bound.
# A tile is one unit of on-chip work: 65536 time steps or channels is far past any device's
# on-chip memory, and P partial groups of an FP32 workspace of (P, C, K+1) stay under 1024.
GEOMETRY_KEYS = {
    "T": "time_tile",
    "tile": "time_tile",
    "time_tile": "time_tile",
    "C_t": "channel_tile",
    "ctile": "channel_tile",
    "channel_tile": "channel_tile",
    "vec": "vector_width",
    "vector_width": "vector_width",
    "P": "partial_groups",
    "partial_groups": "partial_groups",
}
GEOMETRY_LIMITS = {
    "time_tile": 1 << 16,
    "channel_tile": 1 << 16,
    "vector_width": 1 << 10,
    "partial_groups": 1 << 10,
}
THREADS_ENV = "CONVMATRIX_THREADS"  # the thread policy (runners.run.threads)
# Thread counts of one process. Every thread-count variable (``--threads`` included) is
# refused above ``thread_limit()``: THREADS_PER_CORE threads a core this process may run on,
# never above MAX_THREADS. More is a typo, not a machine: OMP_NUM_THREADS=100000 made torch
# segfault at its first parallel region (-n 0: blamed on the case) and xdist workers die at
# start (-n 2: a run left ``running`` with no result), before anything could say why.
MAX_THREADS = 1024
THREADS_PER_CORE = 64
# The thread counts the libraries under torch read when they load (OpenMP, MKL, OpenBLAS,
# numexpr, Accelerate); ``OMP_NUM_THREADS`` may be nested (``4,2``: 4 outer, 2 inner each).
THREAD_COUNT_VARIABLES = (
    "OMP_NUM_THREADS",
    "OMP_THREAD_LIMIT",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
MAX_RETRY_S = 24 * 3600.0  # CONVMATRIX_DB_RETRY_S: a day of retrying is already too long


def check_geometry_value(key: str, value: int) -> str | None:
    """Why ``key=value`` is not a tiled geometry field, or None."""
    name = GEOMETRY_KEYS.get(key)
    if name is None:
        return (
            f"unknown tiled geometry key {key!r}: use T, C_t, vec or P "
            "(time_tile, channel_tile, vector_width, partial_groups)"
        )
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return f"tiled geometry {key}={value!r}: must be a positive integer"
    if value > GEOMETRY_LIMITS[name]:
        return f"tiled geometry {key}={value}: at most {GEOMETRY_LIMITS[name]}"
    return None


def thread_limit(cores: int | None = None) -> int:
    """The most threads one process may be given: ``THREADS_PER_CORE`` a core it may run on
    (its affinity mask), at most ``MAX_THREADS``."""
    if cores is None:
        affinity = getattr(os, "sched_getaffinity", None)
        cores = len(affinity(0)) if affinity else (os.cpu_count() or 1)
    return min(MAX_THREADS, max(1, cores) * THREADS_PER_CORE)


def check_threads(text: str) -> str | None:
    """Why ``text`` is not a thread policy (``--threads``, ``CONVMATRIX_THREADS``), or None."""
    value = text.strip().lower()
    if value in ("auto", "torch"):
        return None
    limit = thread_limit()
    if not value.isdigit() or not 1 <= int(value) <= limit:
        return f"give auto, torch or a number of threads from 1 to {limit} (this machine's cap)"
    return None


def check_thread_count(text: str, nested: bool = True) -> str | None:
    """Why ``text`` is not a thread count a library should start with, or None; ``nested``:
    OpenMP's ``4,2`` (4 outer threads, 2 inner each: their product counts)."""
    parts = [part.strip() for part in text.split(",")] if nested else [text.strip()]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        return "give a whole number of threads >= 1" + (" (or nested: N,M)" if nested else "")
    total = math.prod(int(part) for part in parts)
    limit = thread_limit()
    if total > limit:
        return (
            f"{total} threads a process is past this machine's cap of {limit} "
            f"({THREADS_PER_CORE} a core, at most {MAX_THREADS})"
        )
    return None


def _one_count(text: str) -> str | None:
    return check_thread_count(text, nested=False)


def _geometry(text: str) -> str | None:
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep:
            return f"expected key=value, got {item!r}"
        try:
            value = int(raw.strip())
        except ValueError:
            return f"{key.strip()}={raw.strip()!r} is not an integer"
        why = check_geometry_value(key.strip(), value)
        if why:
            return why
        values[GEOMETRY_KEYS[key.strip()]] = value
    ctile, vec = values.get("channel_tile"), values.get("vector_width")
    if ctile is not None and vec is not None and ctile % vec:
        return f"the channel tile C_t={ctile} is not a multiple of the vector width vec={vec}"
    return None


def _choice(*allowed: str) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        if text.strip().lower() in allowed:
            return None
        return f"choose one of {', '.join(a for a in allowed if a)}"

    return check


def _seconds(upper: float) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        try:
            value = float(text)
        except ValueError:
            return "give a number of seconds"
        if not math.isfinite(value) or not 0 <= value <= upper:
            return f"give a number of seconds from 0 to {upper:g}"
        return None

    return check


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def _database_url(text: str) -> str | None:
    if _URL.match(text.strip()):
        return None
    return "not a database URL (e.g. sqlite:///convmatrix.db or postgresql://user@host/db)"


def _web_url(text: str) -> str | None:
    if re.match(r"^https?://[^\s/]+", text.strip()):
        return None
    return "give the http(s) URL `convmatrix serve` answers at"


@dataclass(frozen=True)
class Variable:
    """One variable: what it sets, who reads it, and its check (None: any value)."""

    name: str
    what: str
    read_by: str
    check: Callable[[str], str | None] | None = None
    secret: bool = False  # may hold a password: never shown


VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable(
            "CONVMATRIX_DB",
            "the results database URL when --db is not given",
            "db.engine",
            _database_url,
            secret=True,
        ),
        Variable(
            "CONVMATRIX_CPU_CLOCK",
            "the clock of cpu timings: process (default) or wall",
            "core.devices",
            _choice("", "process", "wall"),
        ),
        Variable(
            "CONVMATRIX_TILED_GEOMETRY",
            "the tiled kernel's geometry, e.g. T=128,C_t=16,vec=8,P=2 (bounded per field)",
            "kernels.builtin.tiled",
            _geometry,
        ),
        Variable(
            "CONVMATRIX_BASE_URL",
            "where the job summary links to `convmatrix serve` when --base-url is not given",
            "runners.options",
            _web_url,
        ),
        Variable(
            "CONVMATRIX_PROGRESS_S",
            "seconds between progress lines (0: every case)",
            "runners.run.progress",
            _seconds(MAX_RETRY_S),
        ),
        Variable(
            "CONVMATRIX_DB_RETRY_S",
            "how long results the database refuses are retried before they go to the "
            "run's journal (default 60)",
            "db.writer",
            _seconds(MAX_RETRY_S),
        ),
        Variable(
            "CONVMATRIX_REFERENCE_CACHE",
            "the reference cache's directory when --reference-cache is not given (off: none)",
            "runners.run.controller",
        ),
        Variable(
            "CONVMATRIX_SERVE_TOKEN",
            "the bearer token `convmatrix serve` takes writes with when --token-file is not given",
            "service.access",
            secret=True,
        ),
        Variable(
            THREADS_ENV,
            "the thread policy of CPU runs when --threads is not given: auto (one intra-op "
            "thread a worker, passive wait), torch (torch's default) or threads a worker",
            "runners.run.threads",
            check_threads,
        ),
        Variable(
            "OMP_NUM_THREADS",
            "OpenMP's thread count: when set, each process of a run gets it (it beats --threads)",
            "runners.run.threads",
            check_thread_count,
        ),
        *(
            Variable(name, "a thread count a library under torch reads", "torch", _one_count)
            for name in THREAD_COUNT_VARIABLES
            if name != "OMP_NUM_THREADS"
        ),
        Variable(
            "OMP_WAIT_POLICY",
            "OpenMP's wait (ACTIVE spins, PASSIVE sleeps); a run sets PASSIVE when it is unset",
            "runners.run.threads",
        ),
        Variable(
            "GITHUB_STEP_SUMMARY",
            "the CI job summary file when --summary is not given",
            "runners.options",
        ),
        Variable(
            "TRITON_INTERPRET",
            "Triton's CPU interpreter (set by the fla adapter unless 0/false/off/no)",
            "kernels.adapters.triton_interpreter",
            _choice("", "0", "1", "true", "false", "on", "off", "yes", "no"),
        ),
    )
}


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """``UsageError`` (exit 2), one line naming the variable, for the first declared variable
    that is set to something its reader would refuse; nothing when all are fine."""
    env = os.environ if environ is None else environ
    for variable in VARIABLES.values():
        value = env.get(variable.name)
        if not value or not value.strip() or variable.check is None:
            continue  # unset, or empty: the reader's default
        why = variable.check(value)
        if why and variable.secret:  # a URL that is not one may still hold a password
            raise UsageError(
                f"environment variable {variable.name} (value not shown: it may hold a "
                f"password): {why}"
            )
        if why:
            shown = value if len(value) <= 80 else value[:80] + "..."
            raise UsageError(f"environment variable {variable.name}={shown!r}: {why}")
