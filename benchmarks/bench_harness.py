"""Harness overhead: ``convmatrix run`` vs a bare loop doing the same work. Targets: whole
command <= 1.15x the bare loop; per case at most 1.5 ms beyond a one-thread bare loop.

    python benchmarks/bench_harness.py [--matrix benchmarks/harness.matrix.yaml|nightly]
                                       [--kernel torch] [--rounds 2] [--workers 0 1]

The bare loop, in this process, does per case the work of a case and nothing else
(``execute.case_work``: inputs, kernel, float64 reference, torch path, metrics, property
checks, verdict), twice: at torch's default threads (what the harness gave its processes
before the thread policy) and at one thread (what a run's processes get now,
``runners.threads``). The harness is the whole ``convmatrix run`` command as a user starts it:
interpreter and torch start-up, pytest collection, xdist workers (``-n 1``; ``-n 0`` runs
in-process), the guards around each case (its processes, memory, process state), the verdict,
the database writes and the summary. The reference cache is off on both sides. Rounds
alternate bare / harness so the machine's other load falls on both; the best of each is kept.

Per ``-n``: the whole command over each bare loop, and the steady state, where the command's
fixed start-up (measured as a run of one case, minus that case's share of the bare loop) is
taken off: what each further case costs under the harness, as a ratio and in milliseconds
beyond the one-thread bare loop.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from convmatrix.runners.controller import prepare
from convmatrix.runners.execute import case_work
from convmatrix.runners.options import RunOptions
from convmatrix.runners.store import MemoryStore

HERE = Path(__file__).resolve().parent
TARGET = 1.15
PER_CASE_MS = 1.5


def bare_loop(matrix: str, kernel_spec: str, threads: int | None) -> tuple[float, int]:
    """(seconds, cases) for the work of every case, at ``threads`` torch threads (None:
    torch's default)."""
    options = RunOptions(matrix=matrix, kernel=kernel_spec, workers=0, reference_cache="off")
    prepared = prepare(options.checked(), MemoryStore())
    default = torch.get_num_threads()
    torch.set_num_threads(threads or default)
    try:
        start, count = time.perf_counter(), 0
        for workload in prepared.workloads.values():
            ctx = prepared.context(workload)
            for case in workload.cases:
                case_work(case, ctx)
                count += 1
        return time.perf_counter() - start, count
    finally:
        torch.set_num_threads(default)


def harness(matrix: str, kernel_spec: str, workers: int, *case: str) -> float:
    """Seconds of wall time for the ``convmatrix run`` command, start-up included."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "convmatrix", "run", "--matrix", matrix]
        cmd += ["--kernel", kernel_spec, "-n", str(workers), "--db", f"sqlite:///{tmp}/h.db"]
        cmd += ["--reference-cache", "off"]
        cmd += [item for c in case for item in ("--case", c)]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: cases failed, the run itself completed
        sys.exit(f"convmatrix run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default=str(HERE / "harness.matrix.yaml"))
    parser.add_argument("--kernel", default="torch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    options = RunOptions(matrix=args.matrix, kernel=args.kernel, workers=0).checked()
    first = next(iter(prepare(options, MemoryStore()).workloads.values())).cases[0].id
    bare: dict[str, list[float]] = {"default": [], "one": []}
    whole = {n: [] for n in args.workers}
    fixed = {n: [] for n in args.workers}
    for round_ in range(args.rounds):
        seconds, n_cases = bare_loop(args.matrix, args.kernel, None)
        bare["default"].append(seconds)
        bare["one"].append(bare_loop(args.matrix, args.kernel, 1)[0])
        for n in args.workers:
            whole[n].append(harness(args.matrix, args.kernel, n))
            fixed[n].append(harness(args.matrix, args.kernel, n, first))
        line = ", ".join(f"-n {n} {whole[n][-1]:.1f} s (1 case {fixed[n][-1]:.1f} s)"
                         for n in args.workers)  # fmt: skip
        print(
            f"round {round_ + 1}: bare loop {bare['default'][-1]:.2f} s at "
            f"{torch.get_num_threads()} threads, {bare['one'][-1]:.2f} s at one; "
            f"convmatrix run {line}"
        )
    best = {name: min(times) for name, times in bare.items()}
    print(
        f"bare loop, {n_cases} cases (best of {args.rounds}): {best['default']:.2f} s at "
        f"{torch.get_num_threads()} threads, {best['one']:.2f} s at one"
    )
    for n in args.workers:
        total, startup = min(whole[n]), min(fixed[n]) - best["one"] / n_cases
        steady = total - startup
        extra_ms = (steady - best["one"]) / n_cases * 1e3
        for name, seconds in best.items():
            ratio = total / seconds
            verdict = "ok" if ratio <= TARGET else "above target"
            print(
                f"convmatrix run -n {n} vs the {name}-thread bare loop: {total:.2f} s, ratio "
                f"{ratio:.3f} (target <= {TARGET}: {verdict}); steady-state ratio "
                f"{steady / seconds:.3f}"
            )
        verdict = "ok" if extra_ms <= PER_CASE_MS else "above target"
        print(
            f"convmatrix run -n {n}: fixed start-up {startup:.2f} s; per case "
            f"{extra_ms:+.2f} ms beyond the one-thread bare loop (target <= {PER_CASE_MS}: "
            f"{verdict})"
        )


if __name__ == "__main__":
    main()
