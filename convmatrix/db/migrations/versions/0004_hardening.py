"""Hardening: the ``lost`` outcome, the ``abandoned`` run status, run heartbeats, peak memory.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

- ``runs.heartbeat_at`` (the controller's last sign of life), ``runs.n_lost`` and
  ``run_counts.n_lost`` (0 for older runs), ``cases.peak_mem_mb``;
- the CHECK constraints listing outcomes (``cases``) and run statuses (``runs``) rebuilt with
  the new values. SQLite cannot alter a CHECK in place: batch mode copies the table, and with
  foreign keys on, dropping the old ``runs`` would delete every case by ON DELETE CASCADE, so
  ``convmatrix.db.migrate.upgrade`` switches them off around every migration (a PRAGMA that
  only works outside a transaction) and checks them (``foreign_key_check``) before commit.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_OLD_OUTCOMES = ("passed", "failed", "skipped", "crashed", "timeout", "error")
_OUTCOMES = (*_OLD_OUTCOMES, "lost")
_OLD_STATUSES = ("running", "finished", "interrupted")
_STATUSES = (*_OLD_STATUSES, "abandoned")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _rebuild(outcomes: tuple[str, ...], statuses: tuple[str, ...]) -> None:
    """Replace the two CHECK constraints (SQLite: by copying the tables; ``upgrade`` in
    ``convmatrix.db.migrate`` runs migrations with SQLite's foreign keys off, so dropping the
    old tables deletes nothing by cascade)."""
    for table, column, values in (("runs", "status", statuses), ("cases", "outcome", outcomes)):
        with op.batch_alter_table(table, recreate="auto") as batch:
            batch.drop_constraint(op.f(f"ck_{table}_{column}"), type_="check")
            batch.create_check_constraint(op.f(f"ck_{table}_{column}"), _in(column, values))


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("n_lost", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("run_counts") as batch:
        batch.add_column(sa.Column("n_lost", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("cases") as batch:
        batch.add_column(sa.Column("peak_mem_mb", sa.Double(), nullable=True))
    _rebuild(_OUTCOMES, _STATUSES)


def downgrade() -> None:
    op.execute("UPDATE cases SET outcome = 'crashed' WHERE outcome = 'lost'")
    op.execute("UPDATE runs SET status = 'interrupted' WHERE status = 'abandoned'")
    _rebuild(_OLD_OUTCOMES, _OLD_STATUSES)
    for table, column in (
        ("cases", "peak_mem_mb"),
        ("run_counts", "n_lost"),
        ("runs", "n_lost"),
        ("runs", "heartbeat_at"),
    ):
        if op.get_bind().dialect.name == "sqlite":
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        else:
            op.drop_column(table, column)
