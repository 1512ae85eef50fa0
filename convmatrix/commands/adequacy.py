"""``convmatrix adequacy --matrix M``: how many seeded bugs M kills, with which cases, how fast.

The measurement is ``convmatrix.pipeline.adequacy.measure`` (the base kernel, then one
recorded run per seeded bug, ``-n N`` bugs at once); this prints its kill matrix and writes it
as HTML and JSON beside the other reports; ``--minimize`` also writes the smallest case set
found that kills the same bugs, as a matrix file with a ``cases:`` list (docs/adequacy.md).

Exit status: 0 every bug killed, 1 some survived, 2 usage errors or a base that fails M.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from convmatrix.commands.arguments import add_db_argument
from convmatrix.core.errors import UsageError

__all__ = ["add_arguments", "adequacy_command"]


def adequacy_command(args: argparse.Namespace) -> int:
    from convmatrix.matrix import load_matrix
    from convmatrix.pipeline.adequacy import measure
    from convmatrix.reports.render import write_report

    if not args.matrix:
        raise UsageError("--matrix is required")
    name = load_matrix(args.matrix).name
    minimize = None
    if args.minimize is not None:
        minimize = Path(args.minimize) if args.minimize else args.out / f"{name}-min.yaml"
    view = measure(
        args.matrix, base=args.base, bugs=args.bugs, catalogue=args.catalogue,
        workers=args.workers, device=args.device,
        db=args.db, sample=args.sample, minimize=minimize,
    )  # fmt: skip
    html, _ = write_report(view, args.out / f"adequacy-{name}.html")
    for line in _lines(view):
        print(line)
    print(f"report: {html}")
    return 0 if view.killed == view.total else 1


def _lines(view) -> list[str]:  # type: ignore[no-untyped-def]
    lines = [f"{'bug':<30} {'verdict':<9} {'kills':>5} {'first(s)':>8}  caught through"]
    for b in view.bugs:
        first = "-" if b.first_kill_s is None else f"{b.first_kill_s:.2f}"
        verdict = "killed" if b.killed else "SURVIVED"
        lines.append(f"{b.name:<30} {verdict:<9} {len(b.kills):>5} {first:>8}  {', '.join(b.how)}")
    for b in view.survivors:
        lines.append(f"survivor {b.name} (meant for {b.dimension}): add cases with {b.reach}")
    lines.append(
        f"mutation score {view.killed}/{view.total} = {100 * view.score:.1f}% on matrix "
        f"{view.matrix} ({len(view.cases)} cases) in {view.seconds:.1f} s"
    )
    mz = view.minimized
    if mz is not None:
        lines.append(
            f"minimized: {mz.cases} of {mz.of_cases} cases kill the same {view.killed} bugs; "
            f"{mz.seconds:.2f} s of {mz.of_seconds:.2f} s base-kernel time -> {mz.path}"
        )
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run every seeded-bug kernel (tiled with one realistic bug each) through a matrix and "
        "report which cases kill which bug: the kill matrix, the mutation score, survivors, "
        "and with --minimize the smallest case set that kills the same bugs. Exit 0 when "
        "every bug is killed, 1 when some survive, 2 on usage errors or a failing base."
    )
    p.add_argument("--matrix", help="built-in matrix name or a file")
    p.add_argument("--base", default="tiled", help="the correct tiled kernel (default: tiled)")
    p.add_argument("--bugs", metavar="NAME,...", help="only these seeded bugs (default: all)")
    p.add_argument(
        "--catalogue", default="main", choices=("main", "size", "all"),
        help="which seeded bugs: main (default; the bugs a matrix is measured by), size (bugs "
        "that show only past a size: 2^24 elements, B*L 8192, C 1024, L 4096), or all",
    )  # fmt: skip
    p.add_argument("-n", dest="workers", default="auto", help="bugs run at once: N or auto")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mlu")
    add_db_argument(p)
    p.add_argument(
        "--out", type=Path, default=Path("reports"), metavar="DIR",
        help="directory for adequacy-<matrix>.html/.json (default: reports)",
    )  # fmt: skip
    p.add_argument(
        "--minimize", nargs="?", const="", default=None, metavar="PATH",
        help="write the smallest killing case set as a matrix (default DIR/<matrix>-min.yaml)",
    )  # fmt: skip
    p.add_argument("--sample", type=int, metavar="N", help="run N cases drawn from the matrix")
    p.set_defaults(handler=adequacy_command)
