"""False positives and power of the timing-regression rules, from real A/A and A/B runs.

    python benchmarks/bench_timing_aa.py [--matrix perf] [--kernel tiled] [--runs 6]
        [--slowed 2] [--percent 150] [-n 2] [--db URL]

Runs ``convmatrix run`` ``--runs`` times with the same kernel (A/A: nothing changed, so every
claimed regression is a false positive), then ``--slowed`` times with the same kernel made
``--percent`` % as slow (``convmatrix.kernels.doubles.slowed``: A/B, every kernel timing really is
1.5x slower). Then, on the stored timings:

- pair rule (``convmatrix diff``), with and without the framework-path control: for each
  consecutive A/A pair the share of compared kernel timings claimed as regressions (and
  improvements); for each slowed run against the last A/A run the share claimed (power);
- history rule (``--timing-history``): the newest run judged against the runs before it, for
  every A/A prefix long enough (false positives), and with the slowed runs appended (power).

Prints one table; docs/benchmarks.md quotes it. Nothing here asserts: the numbers depend on the
load.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

from convmatrix.compare.timing.history import HistoryRule, history_regressions
from convmatrix.compare.timing.pairs import compare_timings
from convmatrix.compare.timing.rules import TimingRule
from convmatrix.db import Session, list_runs, load_results, open_database

Timings = dict[str, list]


def run(args: argparse.Namespace, kernel: str, label: str) -> float:
    cmd = [sys.executable, "-m", "convmatrix", "run", "--matrix", args.matrix]
    cmd += ["--kernel", kernel, "-n", args.workers, "--db", args.db, "--label", label]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.perf_counter() - start


def stored(url: str) -> list[tuple[int, str, Timings]]:
    """(run id, label, case id -> timings) of every run, oldest first."""
    engine = open_database(url)
    with Session(engine) as session:
        runs = list(reversed(list_runs(session, limit=1000)))
        out = [
            (r.id, r.label or "", {x.case.id: x.timings for x in load_results(session, r.id)})
            for r in runs
        ]
    engine.dispose()
    return out


def pair(base: Timings, head: Timings, rule: TimingRule) -> tuple[int, int, int, bool]:
    """(kernel timings compared, claimed slower, claimed faster, kernel-wide slower)."""
    out = compare_timings(
        {k: v for k, v in base.items() if v}, {k: v for k, v in head.items() if v}, rule=rule
    )
    judged = out.unchanged + len(out.regressions) + len(out.improvements)
    judged += len(out.not_enough_samples) + len(out.within_noise)
    wide = bool(out.pooled and out.pooled.slower)
    return judged, len(out.regressions), len(out.improvements), wide


def noise(base: Timings, head: Timings) -> float:
    """Median |log(head/base)| of the op medians: how much a run moves a timing."""
    moves = []
    for case_id in base.keys() & head.keys():
        b = {(t.scope, t.mode): t.median_s for t in base[case_id]}
        for t in head[case_id]:
            if t.scope == "op" and (t.scope, t.mode) in b:
                moves.append(abs(math.log(t.median_s / b[(t.scope, t.mode)])))
    return math.exp(statistics.median(moves)) if moves else float("nan")


def rate(hits: int, total: int) -> str:
    return f"{hits}/{total} = {100 * hits / total:.2f}%" if total else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", default="perf")
    parser.add_argument("--kernel", default="tiled")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--slowed", type=int, default=2)
    parser.add_argument("--percent", type=int, default=150)
    parser.add_argument("-n", dest="workers", default="2")
    parser.add_argument("--db", help="results database (default: a temporary SQLite file)")
    parser.add_argument(
        "--analyse", action="store_true", help="run nothing: judge the runs already in --db"
    )
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    args.db = args.db or f"sqlite:///{tmp.name}/aa.db"
    slow = f"convmatrix.kernels.doubles.slowed:make(base={args.kernel},percent={args.percent})"
    walls = [math.nan]
    if not args.analyse:
        walls = [run(args, args.kernel, f"aa-{i}") for i in range(args.runs)]
        walls += [run(args, slow, f"slow-{i}") for i in range(args.slowed)]
    runs = stored(args.db)
    aa = [(rid, t) for rid, label, t in runs if label.startswith("aa-")]
    ab = [(rid, t) for rid, label, t in runs if label.startswith("slow-")]
    pairs = list(itertools.pairwise(aa))
    print(
        f"{args.runs} A/A + {args.slowed} slowed runs of {args.kernel} on {args.matrix}, "
        f"-n {args.workers}: {statistics.median(walls):.0f} s per run (median)"
    )
    move = statistics.median(noise(a[1], b[1]) for a, b in pairs)
    print(f"run-to-run move of an op median (A/A, geometric median): x{move:.3f}")
    rules = {
        "pair rule (default: control, pooled)": TimingRule(),
        "pair rule, no control": replace(TimingRule(), control=None),
        "per-timing test only (control, no pooling)": replace(TimingRule(), min_cases=10**9),
        "per-timing test only, no control": replace(TimingRule(), control=None, min_cases=10**9),
    }
    for name, rule in rules.items():
        fp = [pair(a[1], b[1], rule) for a, b in pairs]
        tp = [pair(aa[-1][1], s[1], rule) for s in ab]
        total = sum(f[0] for f in fp)
        print(
            f"{name}: A/A slower {rate(sum(f[1] for f in fp), total)}, faster "
            f"{rate(sum(f[2] for f in fp), total)}, kernel-wide slower in "
            f"{sum(f[3] for f in fp)}/{len(fp)} pairs; slowed x{args.percent / 100:g} found "
            f"{rate(sum(t[1] for t in tp), sum(t[0] for t in tp))}, kernel-wide in "
            f"{sum(t[3] for t in tp)}/{len(tp)}"
        )
    for confirm in (2, 3):
        hist = HistoryRule(window=min(5, max(3, args.runs - confirm)), confirm=confirm)
        first = hist.min_baseline + hist.confirm
        fp_h = [history_regressions(aa[:k], rule=hist) for k in range(first, len(aa) + 1)]
        line = (
            f"history rule (window {hist.window}, confirm {hist.confirm}): A/A "
            f"{rate(sum(len(h.regressions) for h in fp_h), sum(h.judged for h in fp_h))}"
        )
        if len(ab) >= hist.confirm:
            tp_h = history_regressions(aa + ab, rule=hist)
            line += f"; slowed found {rate(len(tp_h.regressions), tp_h.judged)}"
        print(line)


if __name__ == "__main__":
    main()
