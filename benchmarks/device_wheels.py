"""Prepare, here, what the device check needs on a GPU machine that has no network.

    python benchmarks/device_wheels.py [--out .whl] [--python 3.12]

The lent GPU machine (docs/devices.md) has torch, triton, pytest, pytest-xdist, jinja2,
pyyaml and nvcc, but no network and none of: SQLAlchemy (and greenlet, its C helper),
Alembic (and Mako), Starlette and uvicorn (``convmatrix serve``'s, for the summary's links),
fla-core (fla's Triton kernel), and Dao's ``causal-conv1d`` (a source distribution, built
there with its nvcc). This downloads exactly those, for the machine's Python and platform,
into one folder to carry (the device tool takes at most 64 MiB a call), checks the sdist's
sha256 against PyPI's, and prints the folder's size; ``device_check.py --wheels DIR``
installs from it. Nothing here is committed: the folder is ignored (``.gitignore``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

LIMIT_BYTES = 64 << 20  # what one call of the device tool carries
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")  # fmt: skip
# Binary wheels for the machine (name==version pins keep one of each: two stop the install).
WHEELS = (
    "sqlalchemy==2.0.*", "greenlet==3.*", "alembic==1.*", "mako==1.*", "starlette==1.*",
    "uvicorn==0.*", "fla-core==0.6.0",
)  # fmt: skip
SDIST = "causal-conv1d"  # Dao-AILab's; built on the machine (it has nvcc and torch)


def download_wheels(out: Path, python: str) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    for spec in WHEELS:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", python, "--implementation", "cp", *platforms, "-d", str(out),
             spec],
            check=True,
        )  # fmt: skip


def download_sdist(out: Path, name: str = SDIST) -> Path:
    """The newest source distribution of ``name`` from PyPI, its sha256 checked."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as page:
        info = json.load(page)
    (sdist,) = [f for f in info["urls"] if f["packagetype"] == "sdist"]
    target = out / sdist["filename"]
    with urllib.request.urlopen(sdist["url"], timeout=120) as data:
        body = data.read()
    if hashlib.sha256(body).hexdigest() != sdist["digests"]["sha256"]:
        sys.exit(f"{sdist['filename']}: sha256 differs from PyPI's")
    target.write_bytes(body)
    return target


def prepare(out: Path, python: str = "3.12") -> int:
    """Fill ``out``; its size in bytes (refused over the carry limit)."""
    out.mkdir(parents=True, exist_ok=True)
    download_wheels(out, python)
    download_sdist(out)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    if size > LIMIT_BYTES:
        sys.exit(f"{out}: {size / 2**20:.1f} MiB, over the {LIMIT_BYTES >> 20} MiB a call carries")
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".whl"))
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (3.12)")
    args = parser.parse_args()
    size = prepare(args.out, args.python)
    for path in sorted(args.out.iterdir()):
        print(f"  {path.name}  {path.stat().st_size / 1024:.0f} KiB")
    print(f"{args.out}: {size / 2**20:.1f} MiB (carry limit {LIMIT_BYTES >> 20} MiB)")


if __name__ == "__main__":
    main()
