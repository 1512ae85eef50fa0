"""Start-up of the ``convmatrix`` command: the time before a command does its own work.

    python benchmarks/bench_startup.py [--rounds 15]

Each command runs as a fresh process (``python -m convmatrix ...``), as a person types it,
in alternating rounds beside two yardsticks measured the same way: the bare interpreter
(``python -c pass``, the floor) and ``python -c 'import torch'`` (what every command paid
before the CLI imported only the chosen command). ``history`` reads an empty database with
the current schema (``db upgrade`` runs once, before timing); ``report``, ``regressions``
and ``diff`` read a small database of two runs (the report stored by one run before timing).
Medians over the rounds; target: ``--help`` and the commands that only read under 0.5 s on a
2-core machine, and well under the torch import.

Two more yardsticks say what the database layer's imports cost: ``import sqlalchemy`` (Core)
and ``import sqlalchemy.orm`` (what the ORM adds on top): whether reading commands would gain
from a Core-only path (issue 26).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reports_support import synthetic_results, write_run  # tests' helpers

from convmatrix.db import open_database

TARGET_S = 0.5
READING = (
    "convmatrix history --dtype bfloat16", "convmatrix report 2", "convmatrix regressions",
    "convmatrix diff 1 2",
)  # fmt: skip


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"{argv} failed ({done.returncode}):\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'empty.db'}"
        subprocess.run(
            [sys.executable, "-m", "convmatrix", "db", "upgrade", "--db", db], check=True
        )
        runs = f"sqlite:///{Path(tmp) / 'runs.db'}"
        engine = open_database(runs)
        for commit in ("1" * 40, "2" * 40):
            write_run(engine, synthetic_results(200), commit=commit)
        engine.dispose()
        out = str(Path(tmp) / "out")
        report = ["-m", "convmatrix", "report", "2", "--db", runs, "--out", out]
        subprocess.run([sys.executable, *report], capture_output=True)  # stores the report
        commands = {
            "python -c pass": ["-c", "pass"],
            "python -c 'import torch'": ["-c", "import torch"],
            "convmatrix --help": ["-m", "convmatrix", "--help"],
            "convmatrix history --dtype bfloat16": [
                "-m", "convmatrix", "history", "--dtype", "bfloat16", "--db", db,
            ],
            "convmatrix expand smoke": ["-m", "convmatrix", "expand", "smoke"],
            "python -c 'import sqlalchemy'": ["-c", "import sqlalchemy"],
            "python -c 'import sqlalchemy.orm'": ["-c", "import sqlalchemy.orm"],
            "convmatrix report 2": report,
            "convmatrix regressions": [
                "-m", "convmatrix", "regressions", "--db", runs,
            ],
            "convmatrix diff 1 2": ["-m", "convmatrix", "diff", "1", "2", "--db", runs],
        }  # fmt: skip
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, argv in commands.items():
                samples[name].append(_time(argv))
    floor = statistics.median(samples["python -c pass"])
    torch_import = statistics.median(samples["python -c 'import torch'"])
    print(f"{'command':<40} {'median':>8} {'min':>8} {'vs torch import':>16}")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<40} {median:8.3f} {min(values):8.3f} {median / torch_import:16.2f}")
    core = statistics.median(samples["python -c 'import sqlalchemy'"])
    orm = statistics.median(samples["python -c 'import sqlalchemy.orm'"])
    print(f"the ORM's import on top of Core: {orm - core:.3f} s")
    for name in ("convmatrix --help", *READING):
        median = statistics.median(samples[name])
        verdict = "ok" if median < TARGET_S else "OVER TARGET"
        print(f"{name}: {median:.3f} s ({median - floor:.3f} s above the bare interpreter), "
              f"target {TARGET_S} s: {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
