"""Harness overhead: ``convmatrix run`` vs a bare loop doing the same work. Targets: whole
command <= 1.15x the bare loop; per case at most 1.5 ms beyond a one-thread bare loop.

    python benchmarks/bench_harness.py [--matrix benchmarks/harness.matrix.yaml|nightly]
                                       [--kernel torch] [--rounds 2] [--workers 0 1] [--probe]

The bare loop, in this process, does per case the work of a case and nothing else
(``execute.case_work``: inputs, kernel, float64 reference, torch path, metrics, property
checks, verdict), twice: at torch's default threads (what the harness gave its processes
before the thread policy) and at one thread (what a run's processes get now,
``runners.run.threads``). The harness is the whole ``convmatrix run`` command as a user starts it:
interpreter and torch start-up, pytest collection, xdist workers (``-n 1``; ``-n 0`` runs
in-process), the guards around each case (its processes, memory, process state), the verdict,
the database writes and the summary. The reference cache is off on both sides. Rounds
alternate bare / harness so the machine's other load falls on both; the best of each is kept.

The one-thread loop is timed twice: in this process right after the default-thread loop
(warm: every case has run once already) and in a fresh process (cold: each case's first run,
as in the command, which runs each case once). A case's first run in a process costs 2-5 ms
more than its second here (lazy initialisation in torch and the case's code paths), so the
warm loop charges that to the harness; the cold loop is the like-for-like comparison. Both
are printed.

Per ``-n``: the whole command over each bare loop, and the steady state, where the command's
fixed start-up (measured as a run of one case, minus that case's share of the bare loop) is
taken off: what each further case costs under the harness, as a ratio and in milliseconds
beyond the one-thread bare loop (cold and warm).

``--probe``: one more run per ``-n`` and round with ``harness_probe`` loaded (this folder's
pytest plugin), which measures inside the run, per item, the item's whole pytest protocol
minus the case's own work (``execute._execute``), on the wall clock and in CPU time of the
process; on a shared host the whole command's wall time varies by more than the 1.5 ms a case
it is meant to resolve, the probe's per-item medians do not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from convmatrix.runners.case.execute import case_work
from convmatrix.runners.options import RunOptions
from convmatrix.runners.run.controller import prepare
from convmatrix.runners.run.store import MemoryStore

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


def cold_bare_loop(matrix: str, kernel_spec: str) -> float:
    """Seconds for the one-thread bare loop in a fresh process (each case's first run there,
    as in the command): only the loop is timed, not the process's start-up."""
    cmd = [sys.executable, __file__, "--matrix", matrix, "--kernel", kernel_spec, "--cold-child"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def harness(
    matrix: str, kernel_spec: str, workers: int, *case: str, probe: str | None = None
) -> float:
    """Seconds of wall time for the ``convmatrix run`` command, start-up included;
    ``probe``: the file ``harness_probe`` appends its per-item measures to."""
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    if probe is not None:
        env["PYTEST_ADDOPTS"] = "-p harness_probe"
        env["CONVMATRIX_PROBE_OUT"] = probe
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "convmatrix", "run", "--matrix", matrix]
        cmd += ["--kernel", kernel_spec, "-n", str(workers), "--db", f"sqlite:///{tmp}/h.db"]
        cmd += ["--reference-cache", "off"]
        cmd += [item for c in case for item in ("--case", c)]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: cases failed, the run itself completed
        sys.exit(f"convmatrix run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed


def _ms(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (seconds), in milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def probe_lines(path: str, workers: int) -> list[str]:
    """What ``harness_probe`` measured in one run: per process, the harness's part of each
    item (median, p10, p90; wall and CPU), the recording of each result where it is recorded,
    and the case work's median."""
    lines = []
    for row in map(json.loads, Path(path).read_text().splitlines()):
        who = "the run's process" if row["process"] == "main" else f"worker {row['process']}"
        if workers and row["process"] == "main":
            who = "the controller"
        items, reports, work = row["items"], row["reports"], row["work"]
        if items:
            wall, cpu = [i[0] for i in items], [i[1] for i in items]
            lines.append(
                f"  {who}: harness a case (protocol - work), {len(items)} items: CPU median "
                f"{_ms(cpu, 0.5):.2f} ms (p10 {_ms(cpu, 0.1):.2f}, p90 {_ms(cpu, 0.9):.2f}); "
                f"wall median {_ms(wall, 0.5):.2f} ms (p10 {_ms(wall, 0.1):.2f}, "
                f"p90 {_ms(wall, 0.9):.2f}); the work itself: CPU median "
                f"{statistics.median(w[1] for w in work) * 1e3:.2f} ms"
            )
        if row.get("gaps"):
            wall, cpu = [g[0] for g in row["gaps"]], [g[1] for g in row["gaps"]]
            lines.append(
                f"  {who}: between one item and the next: CPU median {_ms(cpu, 0.5):.2f} ms, "
                f"wall median {_ms(wall, 0.5):.2f} ms (p90 {_ms(wall, 0.9):.2f})"
            )
        if reports:
            cpu = [r[1] for r in reports]
            lines.append(
                f"  {who}: handling a result's report: CPU median {_ms(cpu, 0.5):.2f} ms "
                f"(p10 {_ms(cpu, 0.1):.2f}, p90 {_ms(cpu, 0.9):.2f})"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default=str(HERE / "harness.matrix.yaml"))
    parser.add_argument("--kernel", default="torch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--probe", action="store_true", help="also measure inside the run")
    parser.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_child:  # cold_bare_loop's fresh process
        print(bare_loop(args.matrix, args.kernel, 1)[0])
        return
    options = RunOptions(matrix=args.matrix, kernel=args.kernel, workers=0).checked()
    first = next(iter(prepare(options, MemoryStore()).workloads.values())).cases[0].id
    bare: dict[str, list[float]] = {"default": [], "one": [], "cold one": []}
    whole = {n: [] for n in args.workers}
    fixed = {n: [] for n in args.workers}
    for round_ in range(args.rounds):
        seconds, n_cases = bare_loop(args.matrix, args.kernel, None)
        bare["default"].append(seconds)
        bare["one"].append(bare_loop(args.matrix, args.kernel, 1)[0])
        bare["cold one"].append(cold_bare_loop(args.matrix, args.kernel))
        probed: dict[int, list[str]] = {}
        for n in args.workers:
            whole[n].append(harness(args.matrix, args.kernel, n))
            fixed[n].append(harness(args.matrix, args.kernel, n, first))
            if args.probe:
                with tempfile.TemporaryDirectory() as tmp:
                    harness(args.matrix, args.kernel, n, probe=f"{tmp}/probe.jsonl")
                    probed[n] = probe_lines(f"{tmp}/probe.jsonl", n)
        line = ", ".join(f"-n {n} {whole[n][-1]:.1f} s (1 case {fixed[n][-1]:.1f} s)"
                         for n in args.workers)  # fmt: skip
        print(
            f"round {round_ + 1}: bare loop {bare['default'][-1]:.2f} s at "
            f"{torch.get_num_threads()} threads, {bare['one'][-1]:.2f} s at one "
            f"({bare['cold one'][-1]:.2f} s in a fresh process); convmatrix run {line}"
        )
        for n, lines in probed.items():
            print(f" probe -n {n}:", *lines, sep="\n")
    best = {name: min(times) for name, times in bare.items()}
    print(
        f"bare loop, {n_cases} cases (best of {args.rounds}): {best['default']:.2f} s at "
        f"{torch.get_num_threads()} threads, {best['one']:.2f} s at one (warm), "
        f"{best['cold one']:.2f} s at one in a fresh process (cold)"
    )
    for n in args.workers:
        total, startup = min(whole[n]), min(fixed[n]) - best["cold one"] / n_cases
        steady = total - startup
        for name, seconds in best.items():
            ratio = total / seconds
            verdict = "ok" if ratio <= TARGET else "above target"
            print(
                f"convmatrix run -n {n} vs the {name}-thread bare loop: {total:.2f} s, ratio "
                f"{ratio:.3f} (target <= {TARGET}: {verdict}); steady-state ratio "
                f"{steady / seconds:.3f}"
            )
        for name in ("cold one", "one"):
            extra_ms = (steady - best[name]) / n_cases * 1e3
            verdict = "ok" if extra_ms <= PER_CASE_MS else "above target"
            print(
                f"convmatrix run -n {n}: fixed start-up {startup:.2f} s; per case "
                f"{extra_ms:+.2f} ms beyond the {name}-thread bare loop (target <= "
                f"{PER_CASE_MS}: {verdict})"
            )


if __name__ == "__main__":
    main()
