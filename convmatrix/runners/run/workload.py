"""What a run executes: matrices expanded for one kernel, and the cases selected from them.

A source is a built-in matrix name (``smoke``), a matrix file (``*.yaml``), or a JSON-lines
file of cases as ``convmatrix expand --format jsonl`` writes them (default tolerances, policy and
timeout). Selection keeps the cases named by ``--case`` (full id, id prefix or pytest id) and
drops those a resumed run already holds. Both are pure functions of their inputs, so the xdist
controller and every worker arrive at the same items.

A run with ``--case`` plans only the named cases: the matrix is expanded suite by suite and
no further once every full id or pytest id named is found (an id prefix may name several
cases, so it expands them all), and only those cases become items. The controller hands the
cases it planned to its workers (``Prepared.handover``), which then expand nothing: a
one-case run of ``dao-parity`` (9,756 cases) started in 35 s, most of it expanding the grid
three times and making an item of every case.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convmatrix.core.case import Case
from convmatrix.core.errors import UsageError
from convmatrix.core.tolerances import Policy, Tolerances
from convmatrix.matrix.spec import DEFAULT_TIMEOUT_S, TimingSettings

__all__ = ["Wanted", "Workload", "combined_identity", "load_workload", "select_cases"]


@dataclass
class Workload:
    """One expanded matrix: its cases and how they are judged."""

    source: str  # built-in name or absolute path: what a resumed run loads again
    name: str
    content_hash: str
    cases: list[Case]
    tolerances: Tolerances = field(default_factory=Tolerances)
    policy: Policy = field(default_factory=Policy)
    timeout_s: float = DEFAULT_TIMEOUT_S
    timing: TimingSettings = field(default_factory=TimingSettings)  # for ``timed`` cases
    memory_budget_mb: float = 8192.0  # peak memory one case may add


def _canonical_source(source: str) -> str:
    path = Path(source).expanduser()
    return str(path.resolve()) if path.suffix in (".yaml", ".yml", ".jsonl") else source


class Wanted:
    """The ``--case`` values of a run, as what the expansion keeps (``keeps``) and when it
    has found all it can (``found_all``).

    A value names a case by its id, an id prefix of 4+ characters or its pytest id
    (``names``, the one rule). ``keeps`` runs on every case a ``--case`` run of a large matrix
    builds (dao-parity: 9,756), so it asks ``names`` only of the cases that could match:
    an id starting with a value, or an id whose first six characters end some value (a
    pytest id ends with them). Checking every value against every case, a pytest id built
    for each pair, took 0.6 s of a 40-case ``--case`` run's planning (0.38 s to expand
    the whole grid)."""

    def __init__(self, values: Sequence[str]) -> None:
        self.values = list(values)
        self._prefixes = tuple(v for v in self.values if len(v) >= 4)
        self._tails = {v[-6:] for v in self.values}

    def names(self, case: Case) -> list[str]:
        """The values that name ``case``."""
        pytest_id = case.pytest_id
        return [
            v for v in self.values
            if v == case.id or v == pytest_id or (len(v) >= 4 and case.id.startswith(v))
        ]  # fmt: skip

    def keeps(self, case: Case) -> bool:
        could = case.id.startswith(self._prefixes) or case.id[:6] in self._tails or len(case.id) < 6
        return could and bool(self.names(case))

    def missing(self, kept: Iterable[Case]) -> list[str]:
        """The values that name none of the ``kept`` cases."""
        named = {v for c in kept for v in self.names(c)}
        return [v for v in self.values if v not in named]

    def found_all(self, cases: list[Case]) -> bool:
        """Every value names one case (a full id, or a pytest id, which ends in the id's
        first six digits) and each is among ``cases``."""
        return all(_unique(w) for w in self.values) and not self.missing(cases)


_ID_DIGITS = 12  # core.case.Case.stable_id


def _unique(wanted: str) -> bool:
    """Whether ``wanted`` can match one case only: an id, or a pytest id (not a prefix)."""
    is_hex = all(ch in "0123456789abcdef" for ch in wanted)
    return (is_hex and len(wanted) == _ID_DIGITS) or (not is_hex and "-" in wanted)


def _from_jsonl(path: Path) -> Workload:
    cases = []
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            cases.append(Case.from_json(json.loads(line)))
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{path}:{number}: not a case record: {exc}") from exc
    digest = hashlib.sha256(text.encode()).hexdigest()
    return Workload(str(path.resolve()), path.stem, digest, cases)


def load_workload(
    source: str,
    kernel: Any,
    max_cases: int | None = None,
    wanted: Sequence[str] = (),
    planned: Sequence[dict[str, Any]] | None = None,
) -> Workload:
    """Expand ``source`` for ``kernel``; ``UsageError`` (exit 2) names what is wrong, a
    matrix over its case limit (``max_cases``: ``--max-cases``) before it is expanded.

    ``wanted`` (``--case``): only the cases it names, expanded no further than needed;
    ``planned``: the cases (as JSON) the controller planned from the same source, taken as
    they are (a worker's copy)."""
    path = Path(source).expanduser()
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise UsageError(f"--matrix {source}: no such file")
        workload = _from_jsonl(path)
        if wanted:
            workload.cases = [c for c in workload.cases if Wanted(wanted).keeps(c)]
        return workload
    from convmatrix.matrix import expand_matrix, load_matrix  # only needed here

    spec = load_matrix(source)
    if planned is not None:
        cases = [Case.from_json(c) for c in planned]
    elif wanted:
        find = Wanted(wanted)
        cases = expand_matrix(spec, kernel, max_cases, keep=find.keeps, enough=find.found_all).cases
    else:
        cases = expand_matrix(spec, kernel, max_cases).cases
    return Workload(
        source=_canonical_source(source),
        name=spec.name,
        content_hash=spec.content_hash,
        cases=list(cases),
        tolerances=spec.tolerances,
        policy=spec.policy,
        timeout_s=float(spec.timeout_s),
        timing=spec.timing,
        memory_budget_mb=spec.memory_budget_mb,
    )


def combined_identity(workloads: Sequence[Workload]) -> tuple[str, str]:
    """(matrix name, content hash) of a run over one or more workloads."""
    if len(workloads) == 1:
        return workloads[0].name, workloads[0].content_hash
    joined = "+".join(w.content_hash for w in workloads)
    return "+".join(w.name for w in workloads), hashlib.sha256(joined.encode()).hexdigest()


def select_cases(
    cases: Iterable[Case],
    wanted: Sequence[str] = (),
    done: Iterable[str] = (),
    *,
    strict: bool = True,
) -> list[Case]:
    """The cases to run: those ``wanted`` names (all when empty) minus the ``done`` ids.

    With ``strict``, a ``--case`` value that matches nothing is a usage error, not an empty run.
    """
    if wanted:
        find = Wanted(wanted)
        cases = [c for c in cases if find.keeps(c)]
        unknown = find.missing(cases)
        if unknown and strict:
            raise UsageError(
                f"--case {', '.join(unknown)}: no such case in the matrix "
                "(give a case id, an id prefix of 4+ digits, or a pytest id)"
            )
    skip = set(done)
    return [c for c in cases if c.id not in skip]
