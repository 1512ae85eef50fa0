"""Start-up of the ``convmatrix`` command: the time before a command does its own work.

    python benchmarks/bench_startup.py [--rounds 15]

Each command runs as a fresh process (``python -m convmatrix ...``), as a person types it,
in alternating rounds beside two yardsticks measured the same way: the bare interpreter
(``python -c pass``, the floor) and ``python -c 'import torch'`` (what every command paid
before the CLI imported only the chosen command). ``history`` reads an empty database with
the current schema (``db upgrade`` runs once, before timing). Medians over the rounds;
target: ``--help`` and ``history --dtype bfloat16`` under 0.5 s on a 2-core machine, and
well under the torch import.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.5


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
        commands = {
            "python -c pass": ["-c", "pass"],
            "python -c 'import torch'": ["-c", "import torch"],
            "convmatrix --help": ["-m", "convmatrix", "--help"],
            "convmatrix history --dtype bfloat16": [
                "-m", "convmatrix", "history", "--dtype", "bfloat16", "--db", db,
            ],
            "convmatrix expand smoke": ["-m", "convmatrix", "expand", "smoke"],
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
    for name in ("convmatrix --help", "convmatrix history --dtype bfloat16"):
        median = statistics.median(samples[name])
        verdict = "ok" if median < TARGET_S else "OVER TARGET"
        print(f"{name}: {median:.3f} s ({median - floor:.3f} s above the bare interpreter), "
              f"target {TARGET_S} s: {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
