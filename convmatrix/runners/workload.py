"""What a run executes: matrices expanded for one kernel, and the cases selected from them.

A source is a built-in matrix name (``smoke``), a matrix file (``*.yaml``), or a JSON-lines
file of cases as ``convmatrix expand --format jsonl`` writes them (default tolerances, policy and
timeout). Selection keeps the cases named by ``--case`` (full id, id prefix or pytest id) and
drops those a resumed run already holds. Both are pure functions of their inputs, so the xdist
controller and every worker arrive at the same items.
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

__all__ = ["Workload", "combined_identity", "load_workload", "select_cases"]


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


def load_workload(source: str, kernel: Any, max_cases: int | None = None) -> Workload:
    """Expand ``source`` for ``kernel``; ``UsageError`` (exit 2) names what is wrong, a
    matrix over its case limit (``max_cases``: ``--max-cases``) before it is expanded."""
    path = Path(source).expanduser()
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise UsageError(f"--matrix {source}: no such file")
        return _from_jsonl(path)
    from convmatrix.matrix import expand_matrix, load_matrix  # only needed here

    spec = load_matrix(source)
    expansion = expand_matrix(spec, kernel, max_cases)
    return Workload(
        source=_canonical_source(source),
        name=spec.name,
        content_hash=spec.content_hash,
        cases=list(expansion.cases),
        tolerances=expansion.tolerances,
        policy=expansion.policy,
        timeout_s=float(expansion.timeout_s),
        timing=expansion.timing,
        memory_budget_mb=expansion.memory_budget_mb,
    )


def combined_identity(workloads: Sequence[Workload]) -> tuple[str, str]:
    """(matrix name, content hash) of a run over one or more workloads."""
    if len(workloads) == 1:
        return workloads[0].name, workloads[0].content_hash
    joined = "+".join(w.content_hash for w in workloads)
    return "+".join(w.name for w in workloads), hashlib.sha256(joined.encode()).hexdigest()


def _matches(case: Case, wanted: str) -> bool:
    return (
        case.id == wanted
        or case.pytest_id == wanted
        or (len(wanted) >= 4 and case.id.startswith(wanted))
    )


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
    cases = list(cases)
    if wanted:
        unknown = [w for w in wanted if not any(_matches(c, w) for c in cases)]
        if unknown and strict:
            raise UsageError(
                f"--case {', '.join(unknown)}: no such case in the matrix "
                "(give a case id, an id prefix of 4+ digits, or a pytest id)"
            )
        cases = [c for c in cases if any(_matches(c, w) for w in wanted)]
    skip = set(done)
    return [c for c in cases if c.id not in skip]
