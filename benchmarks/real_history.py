"""convmatrix over a real kernel history: fla's causal conv1d at each of its releases (or
commits), one matrix run per tree, all into one database, and a table of what was found.

    python benchmarks/real_history.py --releases /work/fla-releases/x \\
        --python /work/venv/bin/python --python /work/venvs/triton36/bin/python \\
        [--only 0.4.1 0.5.0 ...] [--matrix nightly] [--case ID ...] [-n 1] \\
        [--db sqlite:///real-history.db] [--repo /tmp/fla-history] \\
        [--bisect GOOD BAD CASE] [--out table.md]

Trees: ``--releases DIR`` takes every ``<dist>-<version>/`` below DIR that holds an ``fla/``
package (PyPI wheels unpacked: ``pip download --no-deps fla-core==X`` then unzip), in the
order of their release dates (the mtime of the wheel's METADATA); ``--clone REPO --commits
SHA...`` exports ``fla/`` at each commit of a local clone instead (``git archive``), in the
order given. Each tree goes on ``PYTHONPATH`` as a checkout would (the fla adapter finds its
layout by its files, ``convmatrix.kernels.adapters.fla.layout``).

Pythons: each ``--python`` is a virtual environment with convmatrix installed (``pip
install -e . --no-deps`` there) and some Triton; each tree runs under the first one whose
``fla`` kernel loads it (asked in a subprocess; the others' reasons go in the JSON). Which
Triton runs which fla era is measured that way (docs/peers.md keeps the table).

Bisect: ``--repo PATH`` builds a git repository with one commit per tree, in order (the
``fla/`` tree, the release date as the commit date, a tag ``fla-<label>`` each), so that
``convmatrix bisect`` can walk fla's release history; ``--bisect GOOD BAD CASE`` then runs it
between the tags of releases GOOD and BAD on one case, under BAD's Python.

Output: one markdown row per tree (label, date, layout, Triton, passed/failed/skipped/other,
alerts the run raised against the run before it, the failing cases with their failing
outputs) and the bisect result, printed and written to ``--out`` (and ``--out`` with
``.json``: every figure, the availability under each Python, the describe() of the kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_DESCRIBE = (
    "import json; from convmatrix.kernels import load; k = load('fla'); "
    "print(json.dumps({'reason': k.availability(), 'describe': dict(k.describe())}, default=str))"
)


@dataclass(frozen=True)
class Tree:
    label: str  # the release version, or the commit
    path: Path  # the directory that holds fla/
    date: str  # ISO date of the release (wheel METADATA mtime) or of the commit


@dataclass
class Row:
    tree: Tree
    python: str | None = None
    layout: str | None = None
    triton: str | None = None
    tried: dict[str, str | None] = field(default_factory=dict)  # python -> unavailable reason
    describe: dict[str, Any] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    failing: dict[str, list[str]] = field(default_factory=dict)  # case name -> outputs
    alerts: int = 0
    exit_code: int | None = None
    seconds: float = 0.0


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{REPO}"}


def release_trees(root: Path, only: list[str] | None) -> list[Tree]:
    """Every unpacked release below ``root`` with an ``fla/`` package, by release date."""
    found = []
    for path in sorted(root.iterdir()):
        meta = next(path.glob("*.dist-info/METADATA"), None)
        if not (path / "fla" / "modules").is_dir() or meta is None:
            continue  # flash-linear-attention >= 0.3.2: layers and models over fla-core
        label = path.name.rpartition("-")[2]
        if only and label not in only:
            continue
        stamp = datetime.fromtimestamp(meta.stat().st_mtime, tz=timezone.utc)
        found.append(Tree(label, path, stamp.date().isoformat()))
    return sorted(found, key=lambda t: (t.date, t.label))


def clone_trees(clone: Path, commits: list[str], into: Path) -> list[Tree]:
    """``fla/`` of each commit of a local clone, exported (``git archive``) below ``into``."""
    trees = []
    for commit in commits:
        sha = _git(clone, "rev-parse", "--short=12", commit).strip()
        date = _git(clone, "show", "-s", "--format=%cs", sha).strip()
        target = into / sha
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(clone), "archive", sha, "fla"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
        trees.append(Tree(sha, target, date))
    return trees


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode:
        raise SystemExit(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout


def choose_python(row: Row, pythons: list[str]) -> None:
    """The first Python whose fla kernel loads this tree; every answer kept in ``row``."""
    for python in pythons:
        done = subprocess.run(
            [python, "-c", _DESCRIBE], capture_output=True, text=True, env=_env(row.tree.path),
            timeout=600, check=False,
        )  # fmt: skip
        if done.returncode:
            row.tried[python] = f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
            continue
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        row.tried[python] = answer["reason"]
        row.layout = row.layout or answer["describe"].get("layout")
        if answer["reason"] is None:
            row.python, row.describe = python, answer["describe"]
            row.triton = answer["describe"].get("triton")
            return


def run_matrix(row: Row, args: argparse.Namespace) -> None:
    """One ``convmatrix run`` of the tree, recorded with the tree's label as its commit."""
    cmd = [
        row.python, "-m", "convmatrix", "run", "--matrix", args.matrix, "--kernel", "fla",
        "--db", args.db, "-n", str(args.workers), "--commit", f"fla-{row.tree.label}",
        "--label", f"real-history:{row.tree.label}",
    ]  # fmt: skip
    if args.case:
        cmd += ["--case", *args.case]
    start = time.perf_counter()
    log = Path(tempfile.gettempdir()) / f"real-history-{row.tree.label}.log"
    with log.open("w") as out:
        done = subprocess.run(
            cmd, env=_env(row.tree.path), stdout=out, stderr=subprocess.STDOUT, check=False
        )
    row.exit_code, row.seconds = done.returncode, time.perf_counter() - start
    print(f"  {row.tree.label}: exit {done.returncode} in {row.seconds:.0f} s (log {log})")


def read_results(rows: list[Row], db: str, python: str) -> None:
    """Outcomes, failing outputs and alerts of each tree's run (``convmatrix export``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "all.jsonl"
        subprocess.run(
            [python, "-m", "convmatrix", "export", "--all", "--db", db, "--out", str(out)],
            check=True, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
        )  # fmt: skip
        records = [json.loads(line) for line in out.read_text().splitlines()]
    by_commit = {f"fla-{row.tree.label}": row for row in rows}
    runs: dict[Any, Row] = {}
    for rec in records:
        meta = rec.get("meta") or {}
        plain = rec["kind"] == "run" and meta.get("kind") == "run"  # not the bisect steps
        if plain and meta.get("kernel_commit") in by_commit:
            runs[rec["id"]] = runs[rec["uid"]] = by_commit[meta["kernel_commit"]]
    for row in rows:
        row.outcomes, row.failing, row.alerts = {}, {}, 0
    for rec in records:
        if rec["kind"] == "result" and rec["run"] in runs:
            row, result = runs[rec["run"]], rec["result"]
            row.outcomes[result["outcome"]] = row.outcomes.get(result["outcome"], 0) + 1
            if result["outcome"] != "passed" and result["outcome"] != "skipped":
                bad = [o["output"] for o in result.get("outputs") or [] if not o.get("passed")]
                bad += [p["name"] for p in result.get("properties") or [] if not p["passed"]]
                row.failing[result["case"]["id"]] = bad or [result["outcome"]]
        elif rec["kind"] == "alert" and rec["run"] in runs:
            runs[rec["run"]].alerts += 1


def build_repo(trees: list[Tree], repo: Path) -> dict[str, str]:
    """A git repository with one commit per tree (its ``fla/``), in order; {label: sha}."""
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    shas = {}
    for tree in trees:
        shutil.rmtree(repo / "fla", ignore_errors=True)
        shutil.copytree(
            tree.path / "fla", repo / "fla", ignore=shutil.ignore_patterns("__pycache__")
        )
        stamp = f"{tree.date}T12:00:00+00:00"
        env = {**os.environ, "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
        env.update(GIT_AUTHOR_NAME="real_history", GIT_AUTHOR_EMAIL="real_history@localhost")
        env.update(GIT_COMMITTER_NAME="real_history", GIT_COMMITTER_EMAIL="real_history@localhost")
        _git(repo, "add", "-A", "fla", env=env)
        _git(
            repo,
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            f"fla {tree.label} ({tree.path.name})",
            env=env,
        )
        _git(repo, "tag", f"fla-{tree.label}")
        shas[tree.label] = _git(repo, "rev-parse", "HEAD").strip()
    return shas


def bisect(repo: Path, shas: dict[str, str], args: argparse.Namespace, python: str) -> str:
    """``convmatrix bisect`` between the tags of GOOD and BAD on CASE; its verdict in words."""
    good, bad, case = args.bisect
    cmd = [
        python, "-m", "convmatrix", "bisect", "--repo", str(repo), "--good", f"fla-{good}",
        "--bad", f"fla-{bad}", "--case", case, "--kernel", "fla", "--matrix", args.matrix,
        "--db", args.db,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    print(done.stdout + done.stderr)

    def named(sha: str) -> str:
        return next((label for label, full in shas.items() if full.startswith(sha)), sha)

    steps = [
        f"{named(m.group(1))} {m.group(2)}"
        for m in re.finditer(r"^  ([0-9a-f]+) (good|bad|skipped)", done.stdout, re.MULTILINE)
    ]
    found = re.search(r"first bad commit ([0-9a-f]{40})", done.stdout)
    where = f"{case} between {good} and {bad}, steps: {', '.join(steps) or 'none'}"
    if found is None:
        return f"{where}; no first bad commit (exit {done.returncode})"
    return f"{where}; first bad release: {named(found.group(1))}"


def table(rows: list[Row], bisected: str | None) -> str:
    head = (
        "| release / commit | date | layout | Triton | passed | failed | skipped | other | "
        "alerts | failing cases: outputs |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for row in rows:
        counts = Counter(row.outcomes)
        other = sum(v for k, v in counts.items() if k not in ("passed", "failed", "skipped"))
        failing = "; ".join(f"`{c[:6]}` {','.join(o)}" for c, o in sorted(row.failing.items()))
        if row.python is None:
            reasons = {r for r in row.tried.values() if r}
            failing = "not run: " + " / ".join(sorted(reasons))[:200]
        elif not row.outcomes:  # a usage error, an interrupted run: nothing was recorded
            failing = f"no results: convmatrix run exited {row.exit_code} (see its log)"
        lines.append(
            f"| {row.tree.label} | {row.tree.date} | {row.layout or '-'} | {row.triton or '-'} | "
            f"{counts['passed']} | {counts['failed']} | {counts['skipped']} | {other} | "
            f"{row.alerts} | {failing} |"
        )
    if bisected:
        lines.append(f"\nbisect: {bisected}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.db.startswith("sqlite:///") and not args.db.startswith("sqlite:////"):
        args.db = f"sqlite:///{Path(args.db[len('sqlite:///') :]).resolve()}"  # runs elsewhere
    with tempfile.TemporaryDirectory(prefix="real-history-") as tmp:
        if args.clone:
            trees = clone_trees(args.clone, args.commits, Path(tmp))
        else:
            trees = release_trees(args.releases, args.only)
        if not trees:
            raise SystemExit("no fla trees found (--releases DIR or --clone REPO --commits ...)")
        rows = [Row(tree) for tree in trees]
        for row in rows:
            choose_python(row, args.python)
            print(f"{row.tree.label} ({row.tree.date}): {row.layout}, python {row.python}")
            if row.python and not args.no_run:
                run_matrix(row, args)
        read_results(rows, args.db, args.python[0])
        bisected = None
        if args.repo:
            shas = build_repo(trees, args.repo)
            if args.bisect:
                bad = next(r for r in rows if r.tree.label == args.bisect[1])
                bisected = bisect(args.repo, shas, args, bad.python or args.python[0])
    text = table(rows, bisected)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
        dump = {"rows": [asdict(r) for r in rows], "bisect": bisected, "matrix": args.matrix}
        args.out.with_suffix(".json").write_text(json.dumps(dump, indent=1, default=str))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", type=Path, help="a directory of unpacked fla releases")
    parser.add_argument("--only", nargs="+", metavar="VERSION", help="only these releases")
    parser.add_argument("--clone", type=Path, help="a local clone of flash-linear-attention")
    parser.add_argument("--commits", nargs="+", default=[], help="commits of --clone, in order")
    parser.add_argument("--python", action="append", required=True, help="a Python to try")
    parser.add_argument("--matrix", default="nightly")
    parser.add_argument("--case", nargs="+", help="only these cases (ids)")
    parser.add_argument("-n", dest="workers", default="1", help="workers per run")
    parser.add_argument("--db", default="sqlite:///real-history.db")
    parser.add_argument("--repo", type=Path, help="build the one-commit-per-tree repo here")
    parser.add_argument("--bisect", nargs=3, metavar=("GOOD", "BAD", "CASE"))
    parser.add_argument("--no-run", action="store_true", help="only read the database")
    parser.add_argument("--out", type=Path, help="write the table here (and .json beside it)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
