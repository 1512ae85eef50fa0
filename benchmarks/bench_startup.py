"""Start-up of the ``convmatrix`` command: the time before a command does its own work.

    python benchmarks/bench_startup.py [--rounds 15]

Each command runs as a fresh process (``python -m convmatrix ...``), as a person types it,
in alternating rounds beside two yardsticks measured the same way: the bare interpreter
(``python -c pass``, the floor) and ``python -c 'import torch'`` (what every command paid
before the CLI imported only the chosen command). ``history`` reads an empty database with
the current schema (``db upgrade`` runs once, before timing); ``report``, ``regressions``
and ``diff`` read a small database of two runs, the second failing some cases (scanned, so
``regressions`` lists an alert; the report stored by one run before timing).
The package is byte-compiled first (``compileall``), as an installed package is: where
``PYTHONDONTWRITEBYTECODE`` is set (it is on the machines here) every fresh process would
otherwise compile its ~50 modules from source, 0.04-0.06 s of CPU that no user pays.
Medians over the rounds of each command's CPU time (user + system of the child process: the
shared host's load moves wall time by x1.5, CPU time far less) and wall time; target: ``--help``
and the commands that only read under 0.3 s of CPU on a 2-core machine (issue 34), shown beside
the bare interpreter's, and well under the torch import.

Two more yardsticks say what the database layer's imports cost: ``import sqlalchemy`` (Core)
and ``import sqlalchemy.orm`` (what the ORM adds on top): whether reading commands would gain
from a Core-only path (issue 26).
"""

from __future__ import annotations

import argparse
import compileall
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reports_support import synthetic_results, write_run  # tests' helpers

import convmatrix
from convmatrix.db import open_database

TARGET_CPU_S = 0.3
READING = (
    "convmatrix history --dtype bfloat16", "convmatrix report 2", "convmatrix regressions",
    "convmatrix diff 1 2",
)  # fmt: skip


def _cpu_of_children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _time(argv: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one fresh ``python ARGV`` process."""
    cpu, start = _cpu_of_children(), time.perf_counter()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"{argv} failed ({done.returncode}):\n{done.stderr}")
    return _cpu_of_children() - cpu, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    compileall.compile_dir(Path(convmatrix.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'empty.db'}"
        subprocess.run(
            [sys.executable, "-m", "convmatrix", "db", "upgrade", "--db", db], check=True
        )
        runs = f"sqlite:///{Path(tmp) / 'runs.db'}"
        engine = open_database(runs)
        write_run(engine, synthetic_results(200), commit="1" * 40)
        write_run(engine, synthetic_results(200, bug=lambda c: c.seqlen > 64), commit="2" * 40)
        engine.dispose()
        scan = ["-m", "convmatrix", "regressions", "scan", "2", "--db", runs]
        subprocess.run([sys.executable, *scan], check=True, capture_output=True)
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
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        wall: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, argv in commands.items():
                spent, elapsed = _time(argv)
                cpu[name].append(spent)
                wall[name].append(elapsed)
    med = {name: statistics.median(values) for name, values in cpu.items()}
    floor, torch_import = med["python -c pass"], med["python -c 'import torch'"]
    print(f"{'command':<40} {'CPU s':>8} {'min':>8} {'wall s':>8} {'vs torch import':>16}")
    for name, values in cpu.items():
        print(f"{name:<40} {med[name]:8.3f} {min(values):8.3f} "
              f"{statistics.median(wall[name]):8.3f} {med[name] / torch_import:16.2f}")  # fmt: skip
    orm = med["python -c 'import sqlalchemy.orm'"] - med["python -c 'import sqlalchemy'"]
    print(f"the ORM's import on top of Core: {orm:.3f} s of CPU")
    for name in ("convmatrix --help", *READING):
        verdict = "ok" if med[name] < TARGET_CPU_S else "OVER TARGET"
        print(f"{name}: {med[name]:.3f} s of CPU ({med[name] - floor:.3f} s above the bare "
              f"interpreter), target {TARGET_CPU_S} s: {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
