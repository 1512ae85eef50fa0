"""The reference cache: what an entry weighs, what checking it costs, cold against warm.

    python benchmarks/bench_refcache.py [--parts bytes checksum phase run] [--cases 3]
                                        [--kernel torch] [--matrix production]

Every figure is a ratio or size measured side by side in this one process (nothing asserts
them; docs/benchmarks.md records them):

- ``bytes``: bytes per element of x (B*C*L) of an entry, version 2 (r in its stored dtype
  and the bound in float32: ``refcache.footprint``) against version 1 (r and its magnitudes in
  float64, shared tensors counted once, as ``torch.save`` wrote them), for fwd_bwd and fwd,
  float32 and bfloat16, with and without SiLU;
- ``checksum``: GB/s of CRC-32 (what an entry's blocks are checked with), BLAKE2b and SHA-256
  over a mapped entry, and what checking and keying cost against the warm reference phase;
- ``phase``: one case's reference phase in this process, at one thread, wall and CPU time:
  computed (cache off), cold (computed and stored), warm (read and checked), with the ratios;
- ``run``: ``--cases`` of ``--matrix``'s smallest ``--op`` cases (fwd_bwd, as issue 32 asks;
  ``any`` for the smallest of every op) run twice by the CLI (``-n`` workers, 1 by default)
  into an empty cache, then warm, with each run's recorded phases, the ratios and whether
  verdicts and bound usages are identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import replace
from pathlib import Path

import torch

from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.tolerances import Policy
from convmatrix.runners.case.execute import build_inputs
from convmatrix.runners.case.refcache.cache import ReferenceCache
from convmatrix.runners.case.refcache.directory import CacheDir
from convmatrix.runners.case.refcache.key import BoundSpec, cache_key
from convmatrix.runners.case.reference import channel_blocks, judged_blocks, reference_blocks

SPEC = BoundSpec(Capabilities(), Policy())
CPU = torch.device("cpu")
BASE = Case("bench", "fwd_bwd", 4, 256, 2, seqlen=4096, activation="silu", bias=True)


def _consume(case: Case, cache: ReferenceCache | None) -> tuple[float, float]:
    """(wall, CPU) seconds of judging's pass over ``case``'s reference blocks."""
    inputs = build_inputs(case, CPU)
    blocks = channel_blocks(case, inputs)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in judged_blocks(case, inputs, blocks, SPEC, cache=cache):
        pass
    return time.perf_counter() - wall, time.process_time() - cpu


def _v1_bytes(case: Case) -> int:
    """What version 1's ``torch.save`` wrote: every storage behind a block's references and
    magnitudes (float64) once (a view saves its whole storage; dx's elem is its mag)."""
    inputs = build_inputs(case, CPU)
    total = 0
    for _, (refs, mags) in reference_blocks(case, inputs, channel_blocks(case, inputs)):
        held = list(refs.values())
        held += [t for m in mags.values() for t in (m.mag, m.elem, m.zsens) if t is not None]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
        total += sum(storages.values())
    return total


def bytes_per_element(root: Path) -> None:
    print("bytes per element of x (B*C*L), C=256 L=4096 B=2 K=4:")
    print(f"  {'case':<28} {'version 1':>10} {'version 2':>10} {'ratio':>7}")
    for op in ("fwd_bwd", "fwd"):
        for dtype in ("float32", "bfloat16"):
            for act in ("silu", None):
                case = replace(BASE, op=op, x_dtype=dtype, activation=act)
                cache = ReferenceCache(root / f"{op}-{dtype}-{act}")
                _consume(case, cache)
                (entry,) = cache.directory.files()
                n = case.batch * case.dim * case.seqlen
                old, new = _v1_bytes(case) / n, entry.size / n
                name = f"{op} {dtype} {act or 'none'}"
                print(f"  {name:<28} {old:>10.2f} {new:>10.2f} {old / new:>6.1f}x")


def _rate(fn, data: memoryview) -> float:
    best = min(_timed(fn, data) for _ in range(3))
    return len(data) / best / 1e9


def _timed(fn, data: memoryview) -> float:
    start = time.perf_counter()
    fn(data)
    return time.perf_counter() - start


def checksum(root: Path) -> None:
    case = replace(BASE, dim=1024)
    cache = ReferenceCache(root / "checksum")
    _consume(case, cache)
    (f,) = cache.directory.files()
    path = cache.root / f.sub / f.name
    data = memoryview(path.read_bytes())
    print(f"checksums over a {f.size / 1e6:.0f} MB entry (GB/s, best of 3):")
    for name, fn in (("crc32", zlib.crc32), ("blake2b", lambda d: hashlib.blake2b(d).digest()),
                     ("sha256", lambda d: hashlib.sha256(d).digest())):  # fmt: skip
        print(f"  {name:<8} {_rate(fn, data):6.2f}")
    inputs = build_inputs(case, CPU)
    spans = [None if b is None else (b.start, b.stop) for b in channel_blocks(case, inputs)]
    start = time.perf_counter()
    key = cache_key(case, inputs, spans, SPEC)
    keyed = time.perf_counter() - start
    start = time.perf_counter()
    for _ in cache.read(key, spans):
        pass
    read = time.perf_counter() - start
    crc = len(data) / (_rate(zlib.crc32, data) * 1e9)
    print(f"  warm read of it (open, check every block): {read * 1e3:.0f} ms, of which CRC-32 "
          f"~{crc * 1e3:.0f} ms; its key (SHA-256 of the inputs): "
          f"{keyed * 1e3:.0f} ms")  # fmt: skip


def phase(root: Path, rounds: int = 3) -> None:
    case = replace(BASE, dim=1024)
    print(f"one case's reference phase (fwd_bwd f32 SiLU, B*C*L = {2 * 1024 * 4096:,}, one "
          f"thread), best of {rounds}, wall / CPU s:")  # fmt: skip
    took: dict[str, list[tuple[float, float]]] = {"off": [], "cold": [], "warm": []}
    for i in range(rounds):
        cache = ReferenceCache(root / f"phase{i}")
        took["off"].append(_consume(case, None))
        took["cold"].append(_consume(case, cache))
        took["warm"].append(_consume(case, cache))
    best = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in took.items()}
    for name, (w, c) in best.items():
        print(f"  {name:<5} {w:7.3f} / {c:7.3f}   x{best['off'][1] / c:.2f} of off's CPU time")


def smallest(matrix: str, kernel: str, n: int, op: str = "fwd_bwd") -> list[str]:
    done = subprocess.run([sys.executable, "-m", "convmatrix", "expand", matrix, "--kernel",
                           kernel, "--format", "jsonl"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    rows = [r for r in rows if r.get("op") != "update" and op in ("any", r.get("op"))]
    rows = [r for r in rows if r.get("expect", "ok") == "ok"]
    rows.sort(key=lambda r: r["batch"] * r["dim"] * (r.get("seqlen") or 1))
    return [r["id"] for r in rows[:n]]


def run(root: Path, matrix: str, kernel: str, n: int, op: str, workers: int) -> None:
    from convmatrix.db.database import Database
    from convmatrix.db.queries import load_results

    cases = smallest(matrix, kernel, n, op)
    db, cache = f"sqlite:///{root}/bench.db", str(root / "refs")
    walls = []
    for _ in range(2):
        argv = [sys.executable, "-m", "convmatrix", "run", "--matrix", matrix, "--kernel",
                kernel, "-n", str(workers), "--db", db, "--reference-cache", cache,
                *(a for c in cases for a in ("--case", c))]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
    with Database(db, existing=True) as database, database.reading() as session:
        runs = [load_results(session, run_id) for run_id in (1, 2)]
    phases = [{} for _ in runs]
    for total, results in zip(phases, runs, strict=True):
        for r in results:
            for name, s in r.phases.items():
                total[name] = total.get(name, 0.0) + s
    size, entries = CacheDir(Path(cache)).usage()
    print(f"{kernel} on {len(cases)} {matrix} {op} cases, -n {workers}; cold then warm "
          f"({entries} entries, {size / 1e9:.2f} GB)")  # fmt: skip
    for name in phases[0]:
        cold, warm = phases[0][name], phases[1].get(name, 0.0)
        ratio = f"x{cold / warm:.1f}" if warm > 0 else "-"
        print(f"  {name:<11} {cold:8.2f} s  {warm:8.2f} s  {ratio}")
    print(f"  {'wall':<11} {walls[0]:8.2f} s  {walls[1]:8.2f} s  x{walls[1] / walls[0]:.2f}")
    same = [[_verdict(r) for r in rs] for rs in runs]
    print(f"  verdicts and usages identical: {same[0] == same[1]}")


def _verdict(r) -> tuple:
    return r.case.id, r.outcome, [(o.output, o.bound_usage, o.e_abs) for o in r.outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["bytes", "checksum", "phase"],
                        choices=("bytes", "checksum", "phase", "run"))  # fmt: skip
    parser.add_argument("--matrix", default="production")
    parser.add_argument("--kernel", default="torch")
    parser.add_argument("--cases", type=int, default=3)
    parser.add_argument("--op", default="fwd_bwd", choices=("fwd_bwd", "fwd", "any"))
    parser.add_argument("-n", dest="workers", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the CPU time is then the work, whatever the machine's load
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "bytes" in args.parts:
            bytes_per_element(root)
        if "checksum" in args.parts:
            checksum(root)
        if "phase" in args.parts:
            phase(root)
        if "run" in args.parts:
            run(root, args.matrix, args.kernel, args.cases, args.op, args.workers)


if __name__ == "__main__":
    main()
