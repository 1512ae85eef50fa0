"""Property checks on the case's own work, and a sampled run's start-up: a checkout of the code
before (``--base``) and this one, side by side in one invocation.

    git worktree add --detach /tmp/cm-base <commit>
    python benchmarks/bench_properties.py --base /tmp/cm-base [--parts props,spread,coldwarm]
                                          [--kernels tiled,torch] [--sample 40] [--rounds 1]

``props``: the three smallest ``production`` fwd_bwd cases, ``convmatrix run -n 1 --case ...``
per kernel; per case the stored phases (wall seconds, as the run records them), the
properties phase over the kernel phase, and the kernel calls each check made. Target (issue
32): properties <= 2x kernel.

``spread``: ``dao-parity`` for ``tiled``, every k-th case id of its 9,756 (``--sample``),
``-n 2``: cases per minute, the kernel phase's share of the workers' wall time (the sum of
the kernel phases over run wall x workers, as the issue measured it) and of the cases' own
time, the start-up (command start to the run's first stored case) and the ``between`` phase.
Targets: >= 3x the cases per minute, kernel >= 30% of worker wall time.

``coldwarm``: the ``props`` cases under ``torch`` at ``-n 1``, into an empty reference cache
and again warm, per side: the whole command's wall and CPU seconds, and warm over cold.
Target: warm <= 0.5x cold.

Both sides run as a user starts them (a fresh ``python -m convmatrix`` in an empty directory,
``PYTHONPATH`` naming the side's checkout), the reference cache off but in ``coldwarm``, into
a fresh SQLite file each.
The machine is shared: rounds alternate base / new, every figure comes with the CPU seconds of
the command's whole process tree (``RUSAGE_CHILDREN``) and the load average, and ratios are
taken inside one run, where the load falls on both phases. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from convmatrix.db.database import Database
from convmatrix.db.queries import list_runs, load_results


def _env(root: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CONVMATRIX_"))}
    env["PYTHONPATH"] = root
    return env


def convmatrix(root: str, cwd: str, *args: str) -> tuple[float, float, str]:
    """(wall s, CPU s of the process tree, stdout) of one command run from ``root``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "convmatrix", *args], cwd=cwd, env=_env(root),
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        raise SystemExit(f"convmatrix {' '.join(args[:4])} ...: exit {done.returncode}\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")  # fmt: skip
    return wall, cpu, done.stdout


def expanded(root: str, cwd: str, matrix: str, kernel: str) -> list[dict[str, Any]]:
    out = convmatrix(root, cwd, "expand", matrix, "--kernel", kernel, "--format", "jsonl")[2]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def smallest_fwd_bwd(rows: list[dict[str, Any]], n: int) -> list[str]:
    rows = [r for r in rows if r["op"] == "fwd_bwd" and r.get("expect") == "ok"]
    rows.sort(key=lambda r: r["batch"] * r["dim"] * r["seqlen"])
    return [r["id"] for r in rows[:n]]


def spread(rows: list[dict[str, Any]], n: int) -> list[str]:
    """Every k-th case id: a spread over the whole grid (as benchmarks/device_check.py)."""
    step = max(1, len(rows) // n)
    return [r["id"] for r in rows[::step][:n]]


def stored(db: str) -> tuple[Any, list[Any]]:
    with Database(db, existing=True) as database, database.reading() as session:
        run = list_runs(session)[0]
        return run, load_results(session, run.id)


def run_side(
    root: str, matrix: str, kernel: str, ids: list[str], workers: int, cache: str = "off"
) -> dict:
    """One ``convmatrix run`` of ``ids`` from ``root`` into a fresh database; ``cache``: the
    reference cache directory (``off``: none)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/bench.db"
        load = os.getloadavg()[0]
        wall, cpu, _ = convmatrix(
            root, tmp, "run", "--matrix", matrix, "--kernel", kernel, "-n", str(workers),
            "--db", db, "--reference-cache", cache, *(a for c in ids for a in ("--case", c)),
        )  # fmt: skip
        run, results = stored(db)
    phases: dict[str, float] = {}
    for r in results:
        for name, s in r.phases.items():
            phases[name] = phases.get(name, 0.0) + s
    span = (run.finished_at - run.started_at).total_seconds() if run.finished_at else wall
    return {
        "root": root, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load": round(load, 1),
        "cases": len(results), "outcomes": sorted({r.outcome for r in results}),
        "phases": {k: round(v, 3) for k, v in phases.items()},
        # the command outside its run's span: start-up (interpreter, torch, planning) and end
        "outside_run_s": round(wall - span, 1),
        "per_case": [
            {"id": r.case.id, "phases": r.phases,
             "calls": {p.name: [getattr(p, "forward_calls", None),
                                getattr(p, "backward_calls", None)] for p in r.properties}}
            for r in results
        ],
    }  # fmt: skip


def props_part(args: argparse.Namespace, cwd: str) -> list[dict]:
    rows = expanded(args.new, cwd, "production", "tiled")
    ids = smallest_fwd_bwd(rows, 3)
    out = []
    for _ in range(args.rounds):
        for kernel in args.kernels.split(","):
            for side, root in (("base", args.base), ("new", args.new)):
                result = run_side(root, "production", kernel, ids, 1)
                result.update(part="props", side=side, kernel=kernel)
                for case in result["per_case"]:
                    p = case["phases"]
                    case["props_over_kernel"] = round(p["properties"] / p["kernel"], 2)
                print(json.dumps({k: v for k, v in result.items() if k != "phases"}), flush=True)
                out.append(result)
    return out


def coldwarm_part(args: argparse.Namespace, cwd: str) -> list[dict]:
    """The props cases under ``torch`` into an empty reference cache, then again warm, per
    side; the whole command's wall and CPU, and warm over cold."""
    ids = smallest_fwd_bwd(expanded(args.new, cwd, "production", "tiled"), 3)
    out = []
    for _ in range(args.rounds):
        for side, root in (("base", args.base), ("new", args.new)):
            row: dict[str, Any] = {"part": "coldwarm", "side": side}
            with tempfile.TemporaryDirectory() as cache:
                for kind in ("cold", "warm"):
                    result = run_side(root, "production", "torch", ids, 1, cache)
                    row[kind] = {k: result[k] for k in ("wall_s", "cpu_s", "load", "outcomes")}
            row["warm_over_cold"] = round(row["warm"]["wall_s"] / row["cold"]["wall_s"], 2)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def spread_part(args: argparse.Namespace, cwd: str) -> list[dict]:
    ids = spread(expanded(args.new, cwd, "dao-parity", "tiled"), args.sample)
    out = []
    for _ in range(args.rounds):
        for side, root in (("base", args.base), ("new", args.new)):
            result = run_side(root, "dao-parity", "tiled", ids, 2)
            p, wall = result["phases"], result["wall_s"]
            case_time = sum(v for k, v in p.items() if k != "between")
            result.update(
                part="spread", side=side,
                cases_per_min=round(60 * result["cases"] / wall, 1),
                kernel_share_of_worker_wall=round(p["kernel"] / (2 * wall), 3),
                kernel_share_of_case_time=round(p["kernel"] / case_time, 3),
            )  # fmt: skip
            result.pop("per_case")
            print(json.dumps(result), flush=True)
            out.append(result)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a checkout of the code before")
    parser.add_argument("--new", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--parts", default="props,spread")
    parser.add_argument("--kernels", default="tiled,torch")
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench-properties.json"))
    args = parser.parse_args()
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as cwd:  # python -m puts the cwd first on sys.path
        if "props" in args.parts:
            results += props_part(args, cwd)
        if "spread" in args.parts:
            results += spread_part(args, cwd)
        if "coldwarm" in args.parts:
            results += coldwarm_part(args, cwd)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
