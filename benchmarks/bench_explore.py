"""Which seeded bugs ``convmatrix explore`` finds within a budget, how soon, beside the matrices.

    python benchmarks/bench_explore.py [--bugs NAME,...|size|catalogue|all] [--budget 2m]
                                       [--max-elements 1e6] [--size-budget 5m]
                                       [--size-max-elements 5e7] [-n 2] [--seed 0]
                                       [--matrices smoke,nightly] [--adequacy DIR] [--out DIR]

Per bug, ``convmatrix explore --kernel seeded:NAME --max-failures 1 --no-shrink`` runs as a
fresh process (as a user types it) on a fresh SQLite file; the bug is **found** when it exits
1 within the budget and the correct kernel ``tiled`` does not fail the cases it wrote the
same way (``ProbeOutcome.same_failure``: a failure of ``tiled``'s own, such as the memory
budget a 4e7-element case exceeds on CPU where the process's memory holds the float64
reference too, leaves a find of failing outputs standing), and its **time to the first
failure** is the
search's own clock at the end of the round that failed (rounds of ``--round``, 10 s here: the
figure is at most one round late), start-up excluded. The size bugs (``SIZE_BUGS``) get
``--size-budget`` and ``--size-max-elements`` (issue 25: 5 minutes at 5e7 on 2 cores), the
others ``--budget`` and ``--max-elements`` (issue 25: 2 minutes a bug, >= 90% found).

Beside each bug: whether ``smoke`` and ``nightly`` kill it and their time to first kill, read
from ``convmatrix adequacy`` reports (``DIR/adequacy-<matrix>.json``, ``--adequacy DIR``:
reused when present, else run here for the same bugs). Prints a markdown table and the
found share per catalogue, and writes ``OUT/bench-explore.json``. The machine's load average
is printed too: on a shared machine the wall seconds move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SUMMARY = re.compile(
    r"(\d+) cases in (\d+) rounds, (\d+)s, \d+ failed(?: \(first after ([\d.]+)s\))?"
)


def _catalogues() -> tuple[list[str], list[str]]:
    from convmatrix.kernels.doubles.seeded import CATALOGUE

    try:
        from convmatrix.kernels.doubles.seeded.size_bugs import SIZE_BUGS
    except ImportError:  # before the size bugs
        SIZE_BUGS = ()
    size = [cls.bug.name for cls in SIZE_BUGS]
    return [n for n in CATALOGUE if n not in size], size


def tiled_fails_alike(found: Path, signature: str) -> bool:
    """Whether the correct kernel fails a case of ``found`` as the find did (then the find
    is no evidence of the bug). Judged as a run judges, in this process."""
    from convmatrix.matrix import expand_matrix, load_matrix
    from convmatrix.runners.options import RunOptions
    from convmatrix.search.probe import Probe, ProbeOutcome

    probe = Probe(RunOptions(kernel="tiled", matrix=str(found), device="cpu"))
    find = ProbeOutcome(True, signature.partition(":")[0], signature, 0.0)
    cases = expand_matrix(load_matrix(str(found)), probe.kernel).cases
    return any(probe.judge(case).same_failure(find) for case in cases)


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)([smh]?)", text.strip())
    if not match:
        raise SystemExit(f"bad duration {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def explore_bug(name: str, budget: str, max_elements: str, args: argparse.Namespace) -> dict:
    """One bug's search in a fresh process; what its summary line says."""
    with tempfile.TemporaryDirectory(prefix="bench-explore-") as scratch:
        argv = [sys.executable, "-m", "convmatrix", "explore", "--kernel", f"seeded:{name}",
                "--budget", budget, "--max-elements", max_elements, "--seed", str(args.seed),
                "-n", args.workers, "--device", "cpu", "--max-failures", "1", "--no-shrink",
                "--round", args.round, "--db", f"sqlite:///{Path(scratch) / 'e.db'}",
                "--out", str(Path(scratch) / "found.yaml")]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        wall = time.perf_counter() - start
        base = (
            None  # the failing cases on the correct kernel: a find is the bug's only if it passes
        )
        found = Path(scratch) / "found.yaml"
        finding = re.search(r"^1\. (\S+)\s+(.+?)\s+\(", done.stdout, re.M)
        if done.returncode == 1 and found.exists() and finding:
            base = not tiled_fails_alike(found, finding.group(2))
    match = _SUMMARY.search(done.stdout)
    if done.returncode not in (0, 1) or match is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"bug": name, "error": " | ".join(tail), "wall_s": wall}
    cases, rounds, elapsed, first = match.groups()
    return {
        "bug": name, "found": done.returncode == 1 and base is True, "base_passes": base,
        "first_s": float(first) if first else None,
        "cases": int(cases), "rounds": int(rounds), "search_s": float(elapsed),
        "wall_s": wall, "budget": budget, "max_elements": max_elements,
        "case": finding.group(1) if finding else None,
        "signature": finding.group(2) if finding else None,
    }  # fmt: skip


def adequacy(
    matrix: str, bugs: list[str], folder: Path, workers: str, size: bool
) -> dict[str, dict]:
    """``convmatrix adequacy`` per bug row, read from ``folder/adequacy-<matrix>.json`` (run
    here for ``bugs`` when the file is missing)."""
    path = folder / f"adequacy-{matrix}.json"
    if not path.exists():
        db = f"sqlite:///{folder / ('adequacy-' + matrix + '.db')}"
        argv = [sys.executable, "-m", "convmatrix", "adequacy", "--matrix", matrix, "--bugs",
                ",".join(bugs), "-n", workers, "--db", db, "--out", str(folder)]  # fmt: skip
        argv += ["--catalogue", "all"] if size else []
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode not in (0, 1) or not path.exists():
            print(f"adequacy {matrix}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
            return {}
    view = json.loads(path.read_text())
    return {b["name"]: b for b in view.get("bugs", [])}


def _cell(row: dict | None) -> str:
    if not row:
        return "-"
    if not row.get("killed"):
        return "missed"
    first = row.get("first_kill_s")
    return "killed" + (f" {first:.1f}s" if first is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bugs", default="all", help="NAME,... or size, catalogue, all")
    parser.add_argument("--budget", default="2m")
    parser.add_argument("--max-elements", default="1e6")
    parser.add_argument("--size-budget", default="5m")
    parser.add_argument("--size-max-elements", default="5e7")
    parser.add_argument("--round", default="10s")
    parser.add_argument("-n", dest="workers", default="2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--matrices", default="smoke,nightly", help="'' for none")
    parser.add_argument("--adequacy", type=Path, help="folder of adequacy-<matrix>.json")
    parser.add_argument("--out", type=Path, default=Path("reports"))
    args = parser.parse_args()
    regular, size = _catalogues()
    chosen = {"all": regular + size, "size": size, "catalogue": regular}.get(args.bugs)
    if chosen is None:
        chosen = [n.strip() for n in args.bugs.split(",") if n.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    folder = args.adequacy or args.out
    matrices = [m for m in args.matrices.split(",") if m]
    with_size = any(b in size for b in chosen)
    beside = {m: adequacy(m, chosen, folder, args.workers, with_size) for m in matrices}
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    header = "| bug | budget | max elements | explore | first failure (s) | cases | "
    header += " | ".join(matrices) + (" |" if matrices else "")
    print(header)
    print("|" + "---|" * (6 + len(matrices)))
    for name in chosen:
        is_size = name in size
        budget = args.size_budget if is_size else args.budget
        limit = args.size_max_elements if is_size else args.max_elements
        row = explore_bug(name, budget, limit, args)
        row["size_bug"] = is_size
        row["load"] = os.getloadavg()[0]
        rows.append(row)
        if "error" in row:
            verdict, first, cases = "ERROR " + row["error"][:60], "-", "-"
        else:
            verdict = "found" if row["found"] else "missed"
            if row["base_passes"] is False:
                verdict = "FALSE (tiled fails it alike)"
            first = f"{row['first_s']:.0f}" if row["first_s"] is not None else "-"
            cases = str(row["cases"])
        cells = [_cell(beside[m].get(name)) for m in matrices]
        print(f"| {name} | {budget} | {limit} | {verdict} | {first} | {cases} | "
              + " | ".join(cells) + (" |" if cells else ""), flush=True)  # fmt: skip
    for label, names in (("catalogue", regular), ("size", size)):
        ran = [r for r in rows if r["bug"] in names and "error" not in r]
        if ran:
            found = sum(r["found"] for r in ran)
            print(f"{label}: explore found {found}/{len(ran)} = {100 * found / len(ran):.0f}%")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    (args.out / "bench-explore.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
