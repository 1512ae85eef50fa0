"""Harness overhead: ``convmatrix run`` vs a bare loop doing the same work. Target <= 1.15.

    python benchmarks/bench_harness.py [--matrix benchmarks/harness.matrix.yaml]
                                       [--kernel torch] [--rounds 2] [--workers 0 1]

The bare loop, in this process, does per case exactly the calls a run makes: draw the inputs,
run the kernel forward and backward, the float64 reference, the torch path (not again when the
kernel is the torch path itself) and the three error metrics of every output. The harness is
the whole ``convmatrix run`` command as a user starts it: interpreter and torch start-up,
pytest collection, xdist workers (``-n 1``; ``-n 0`` runs in-process), guards, the verdict, the
database writes and the summary. Rounds alternate bare / harness so the machine's other load
falls on both; the best of each is kept.

Two ratios per ``-n``: the whole command over the bare loop, and the steady state, where the
command's fixed start-up (measured as a run of one case, minus that case's share of the bare
loop) is taken off: what each further case costs under the harness relative to bare.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from convmatrix.kernels.builtin.framework import TorchKernel
from convmatrix.kernels.interface.registry import load
from convmatrix.runners.execute import build_inputs
from convmatrix.runners.invoke import kernel_outputs, reference_outputs
from convmatrix.runners.metrics import error_metrics
from convmatrix.runners.workload import load_workload

HERE = Path(__file__).resolve().parent
TARGET = 1.15


def bare_loop(matrix: str, kernel_spec: str) -> tuple[float, int]:
    """(seconds, cases) for the kernel, reference, torch-path and metric calls of every case."""
    kernel = load(kernel_spec)
    framework = TorchKernel()
    cases = load_workload(matrix, kernel).cases
    cpu = torch.device("cpu")
    start = time.perf_counter()
    for case in cases:
        inputs = build_inputs(case, cpu)
        got = kernel_outputs(kernel, case, inputs)
        ref = reference_outputs(case, inputs)
        fw = got if type(kernel) is TorchKernel else kernel_outputs(framework, case, inputs)
        for name, r in ref.items():
            error_metrics(got[name], r)
            error_metrics(fw[name], r)
    return time.perf_counter() - start, len(cases)


def harness(matrix: str, kernel_spec: str, workers: int, *case: str) -> float:
    """Seconds of wall time for the ``convmatrix run`` command, start-up included."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "convmatrix", "run", "--matrix", matrix]
        cmd += ["--kernel", kernel_spec, "-n", str(workers), "--db", f"sqlite:///{tmp}/h.db"]
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
    first = load_workload(args.matrix, load(args.kernel)).cases[0].id
    bare: list[float] = []
    whole = {n: [] for n in args.workers}
    fixed = {n: [] for n in args.workers}
    for round_ in range(args.rounds):
        seconds, n_cases = bare_loop(args.matrix, args.kernel)
        bare.append(seconds)
        for n in args.workers:
            whole[n].append(harness(args.matrix, args.kernel, n))
            fixed[n].append(harness(args.matrix, args.kernel, n, first))
        line = ", ".join(f"-n {n} {whole[n][-1]:.1f} s (1 case {fixed[n][-1]:.1f} s)"
                         for n in args.workers)  # fmt: skip
        print(f"round {round_ + 1}: bare loop {bare[-1]:.1f} s, convmatrix run {line}")
    best = min(bare)
    per_case = best / n_cases
    print(f"bare loop, {n_cases} cases (best of {args.rounds}): {best:.2f} s")
    for n in args.workers:
        total, startup = min(whole[n]), min(fixed[n]) - per_case
        ratio = total / best
        steady = (total - startup) / best
        verdict = "ok" if ratio <= TARGET else "above target"
        print(
            f"convmatrix run -n {n}: {total:.2f} s, ratio {ratio:.3f} (target <= {TARGET}: "
            f"{verdict}); fixed start-up {startup:.2f} s; steady-state ratio {steady:.3f}"
        )


if __name__ == "__main__":
    main()
