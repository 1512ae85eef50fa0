"""``convmatrix.run``: run a matrix against a kernel, record it, return its ``RunAccount``.

The one entry for running a matrix: ``convmatrix run`` calls it and exits with
``summary.exit_code``; Python callers (CI scripts, notebooks) call it directly::

    summary = convmatrix.run("smoke", "torch", workers=0, db="sqlite:///results.db")
    assert summary.passed, "\\n".join(summary.lines())

Bad input (an unknown kernel, a malformed matrix, a run ``resume`` does not name) raises
``UsageError`` before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from convmatrix.core.errors import UsageError
from convmatrix.core.verdict import RULES
from convmatrix.runners.account import RunAccount

__all__ = ["DEVICES", "run", "worker_count"]

DEVICES = ("auto", "cpu", "cuda", "mlu")


def worker_count(spec: str | int, device: str) -> int:
    """``-n``: a number of workers, or ``auto``: one per device (per core on CPU)."""
    if spec != "auto":
        try:
            n = int(spec)
        except ValueError:
            raise UsageError(f"-n {spec!r}: give a number of workers or 'auto'") from None
        if n < 0:
            raise UsageError(f"-n {n}: the number of workers cannot be negative")
        return n
    from convmatrix.core.devices import cpu_cores, discover, resolve_device

    kind = resolve_device(device).type
    return cpu_cores() if kind == "cpu" else max(1, discover(kind).count)


def run(
    matrix: str | None = None,
    kernel: str | None = None,
    *,
    device: str = "auto",
    workers: str | int = "auto",
    db: str | None = None,
    no_db: bool = False,
    label: str | None = None,
    commit: str | None = None,
    cases: Sequence[str] = (),
    resume: str | None = None,
    case_timeout: float | None = None,
    policy: str | None = None,
    engine: str = "xdist",
    address: str | None = None,
    shard: str | None = None,
    run_label: str | None = None,
    verbose: int = 0,
) -> RunAccount:
    """Run ``matrix`` (a built-in name or a file) against ``kernel`` (a registered name or
    ``package.module:attribute``) and record every result in ``db`` (default
    ``CONVMATRIX_DB``, else ``sqlite:///convmatrix.db``; nothing with ``no_db``).
    ``resume`` completes a stored run instead (its matrix and kernel by default).
    ``engine``: ``xdist`` (this host) or ``ray`` (a Ray cluster at ``address``, or a local
    one). ``shard`` (``I/N`` or ``auto``) with ``run_label``: run this shard's part of the
    run every shard labelled ``run_label`` writes into (``convmatrix.runners.shards``)."""
    if device not in DEVICES and device.split(":")[0] not in DEVICES:
        raise UsageError(f"--device {device!r}: one of {', '.join(DEVICES)}")
    if resume and no_db:
        raise UsageError("--resume needs the database; drop --no-db")
    if not resume and (not matrix or not kernel):
        raise UsageError("--matrix and --kernel are required (or --resume RUN)")
    if policy is not None and policy not in tuple(RULES):
        raise UsageError(f"--policy {policy!r}: one of {', '.join(tuple(RULES))}")
    from convmatrix.runners.controller import RunRequest
    from convmatrix.runners.executors import make_engine
    from convmatrix.runners.shards import parse_shard
    from convmatrix.runners.store import MemoryStore, RunStore

    if address and engine != "ray":
        raise UsageError("--address is the Ray cluster's: give it with --engine ray")
    chosen_shard = parse_shard(shard, run_label)
    if chosen_shard is not None and no_db:
        raise UsageError("--shard writes into a shared database; drop --no-db")

    request = RunRequest(
        matrix=matrix,
        kernel=kernel,
        device=device,
        label=label,
        commit=commit,
        cases=list(cases),
        resume=resume,
        case_timeout=case_timeout,
        workers=worker_count(workers, device),
        policy=policy,
        shard=chosen_shard,
        engine=engine,
    )
    if no_db:
        store: RunStore = MemoryStore()
    else:
        from convmatrix.db.run_store import DatabaseStore

        store = DatabaseStore(db)
    return make_engine(engine, verbose=verbose, address=address).run(request, store)
