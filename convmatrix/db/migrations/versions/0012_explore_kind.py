"""Run kind ``explore``: the rounds of ``convmatrix explore``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

An explore round is a recorded run of drawn cases (``pipeline.explore``); like confirm and
bisect runs it is no baseline, no ``latest`` and no history point. ``runs.kind``'s check
constraint gains the value (SQLite rebuilds ``runs``, as in 0008).
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_OLD_KINDS = ("run", "confirm", "bisect", "adequacy")
_KINDS = (*_OLD_KINDS, "explore")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _kinds(kinds: tuple[str, ...]) -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(op.f("ck_runs_kind"), type_="check")
        batch.create_check_constraint("kind", _in("kind", kinds))


def upgrade() -> None:
    _kinds(_KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM runs WHERE kind = 'explore'")
    _kinds(_OLD_KINDS)
