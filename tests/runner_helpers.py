"""Helpers for the runner tests: start real pytest / convmatrix processes, read their run back.

Every run is a real subprocess with real xdist workers and a real database; the planted
kernels in ``tests/resources/kernels`` are importable there as ``bad_kernels:NAME``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from convmatrix.db import Session, list_runs, load_results, open_database

RESOURCES = Path(__file__).parent / "resources"
KERNELS = RESOURCES / "kernels"
TINY = RESOURCES / "matrices" / "tiny.matrix.yaml"
TINY_L7 = "fwd_bwd-K4-L7-C6-B2-chlast-channelslice-silu-bias-f32w32-init-final-dF-8538cd"
LIMIT_S = 300  # a hung harness fails the test instead of hanging the suite


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has ended: only its exit status is left)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def child_env(**extra: str) -> dict[str, str]:
    """This environment minus the outer xdist worker's variables, plus the planted kernels."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CONVMATRIX_DB"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(KERNELS), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def pytest_cmd(*args: str) -> list[str]:
    neutral = ["-c", os.devnull, "--rootdir", ".", "-p", "no:cacheprovider", "-p", "no:benchmark"]
    return [sys.executable, "-m", "pytest", *neutral, *args]


def tiny_copy(where: Path) -> str:
    """The tiny matrix copied into ``where`` (node ids are relative to the rootdir there)."""
    shutil.copy(TINY, where / TINY.name)
    return TINY.name


def convmatrix_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "convmatrix", *args]


def run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, env=child_env(**env), capture_output=True, text=True, timeout=LIMIT_S
    )


def runs(url: str):
    engine = open_database(url)
    try:
        with Session(engine) as session:
            return list(reversed(list_runs(session, kinds=None)))  # oldest first, every kind
    finally:
        engine.dispose()


def results(url: str, run_id: int):
    engine = open_database(url)
    try:
        with Session(engine) as session:
            return load_results(session, run_id)
    finally:
        engine.dispose()
