"""Placement and retries of each case, sharded runs: cases.host, cases.device_index,
cases.retries, cases.retry_reason; runs.shard_label (unique), runs.shard_count; run_shards.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04

Engines beyond one host (Ray) record where each case ran and how often it was resubmitted
after an actor or node was lost. A run written by N CI shards is one ``runs`` row found by its
``shard_label``; each shard that started has a ``run_shards`` row, so a report can name the
shards that never reported. Plain nullable ADD COLUMNs (batch mode does them in place on SQLite).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_SHARD_STATUSES = "status IN ('running', 'finished', 'interrupted')"


def upgrade() -> None:
    with op.batch_alter_table("cases") as batch:
        batch.add_column(sa.Column("host", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("device_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("retry_reason", sa.Text(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("shard_label", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("shard_count", sa.Integer(), nullable=True))
    # A unique index, not a constraint: on SQLite a new constraint means batch mode copies
    # runs and drops the original, and with foreign keys on that DROP deletes every case.
    op.create_index(op.f("ix_runs_shard_label"), "runs", ["shard_label"], unique=True)
    op.create_table(
        "run_shards",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(_SHARD_STATUSES, name=op.f("ck_run_shards_status")),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_shards_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "shard", name=op.f("pk_run_shards")),
    )


def _drop_columns(table: str, *columns: str) -> None:
    for column in columns:
        if op.get_bind().dialect.name == "sqlite":
            # Native since SQLite 3.35; batch mode would copy the table (see 0002).
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        else:
            op.drop_column(table, column)


def downgrade() -> None:
    op.drop_table("run_shards")
    op.drop_index(op.f("ix_runs_shard_label"), table_name="runs")
    _drop_columns("runs", "shard_count", "shard_label")
    _drop_columns("cases", "retry_reason", "retries", "device_index", "host")
