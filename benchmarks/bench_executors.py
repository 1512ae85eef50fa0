"""The Ray executor's overhead beside xdist's: start-up and per-case cost, as a ratio.

    python benchmarks/bench_executors.py [--matrix nightly] [--kernel torch] [--rounds 2] [-n 2]

Each measurement is the whole ``convmatrix run`` command (``--no-db``), as a user would time
it: ``--executor xdist -n N`` (N pytest-xdist workers) and ``--executor ray -n N`` (a local Ray
cluster of N ``cpu_slot`` units started by the command, N device actors, each running its cases
in a child process). Start-up is the command on one case of the matrix (``--case ID``); the
per-case cost is (whole matrix - one case) / (cases - 1). Rounds alternate the engines so the
machine's other load falls on both; the best of each is kept and Ray / xdist is printed.
"""

from __future__ import annotations

import argparse

import bench_scaling  # a sibling script (benchmarks/ is sys.path[0] when run as above)

ENGINES = ("xdist", "ray")


def timed_run(engine: str, matrix: str, kernel: str, workers: int, case: str | None) -> float:
    extra = ["--executor", engine, *(["--case", case] if case else [])]
    return bench_scaling.timed_run(matrix, kernel, workers, *extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="nightly")
    parser.add_argument("--kernel", default="torch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-n", dest="workers", type=int, default=2)
    args = parser.parse_args()
    from convmatrix.kernels.interface.registry import load
    from convmatrix.runners.run.workload import load_workload

    cases = load_workload(args.matrix, load(args.kernel)).cases
    first, n = cases[0].id, len(cases)
    one: dict[str, list[float]] = {e: [] for e in ENGINES}
    full: dict[str, list[float]] = {e: [] for e in ENGINES}
    for round_ in range(args.rounds):
        for engine in ENGINES:
            one[engine].append(timed_run(engine, args.matrix, args.kernel, args.workers, first))
            full[engine].append(timed_run(engine, args.matrix, args.kernel, args.workers, None))
            print(
                f"round {round_ + 1} {engine}: 1 case {one[engine][-1]:.1f} s, "
                f"{n} cases {full[engine][-1]:.1f} s",
                flush=True,
            )
    start = {e: min(one[e]) for e in ENGINES}
    per_case = {e: (min(full[e]) - start[e]) / max(1, n - 1) for e in ENGINES}
    print(f"{args.matrix} ({n} cases), -n {args.workers}, best of {args.rounds} rounds:")
    for e in ENGINES:
        print(f"  {e:5}: start-up {start[e]:.2f} s, per case {1000 * per_case[e]:.0f} ms")
    print(
        f"  ray / xdist: start-up x{start['ray'] / start['xdist']:.2f}, "
        f"per case x{per_case['ray'] / per_case['xdist']:.2f}"
    )


if __name__ == "__main__":
    main()
