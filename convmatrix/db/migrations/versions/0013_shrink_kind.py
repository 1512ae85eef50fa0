"""Run kind ``shrink``: the shrunk case of ``convmatrix shrink``, recorded as judged.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

A shrink stores the simplest failing case it found as a run of one case (``pipeline.shrink``),
judged under the original run's matrix policy; like confirm, bisect and explore runs it is no
baseline, no ``latest`` and no history point. ``runs.kind``'s check constraint gains the
value (SQLite rebuilds ``runs``, as in 0008 and 0012).
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_OLD_KINDS = ("run", "confirm", "bisect", "adequacy", "explore")
_KINDS = (*_OLD_KINDS, "shrink")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _kinds(kinds: tuple[str, ...]) -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(op.f("ck_runs_kind"), type_="check")
        batch.create_check_constraint("kind", _in("kind", kinds))


def upgrade() -> None:
    _kinds(_KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM runs WHERE kind = 'shrink'")
    _kinds(_OLD_KINDS)
