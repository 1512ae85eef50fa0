"""Bound usage: metrics.bound_usage, limit_usage, usage_limit; run_summaries.worst_usage;
metrics.x_dtype of dw/db rows becomes the weight dtype (the dtype they are judged in).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04

docs/spec.md §4's bound model: each output records its bound usage (max |a-r| / bound), the
usage of the threshold rows, and the usage allowed when the bound judged it. ``metrics.x_dtype``
holds the dtype an output is judged in (``convmatrix.core.verdict.judged_dtype``): the x dtype,
except dw/db, judged in the weight dtype, so history's series of a dtype hold what is stored
in it; existing dw/db rows are moved to their case's weight dtype here. Every stored summary
is marked stale (``runs.summarised_at`` NULL): ``convmatrix.db.migrate.upgrade`` recomputes
them with the new columns right after migrating. Rows written before have no bound usage
(NULL): their runs were judged by the threshold rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_METRIC_COLUMNS = ("bound_usage", "limit_usage", "usage_limit")


def _has(table: str) -> bool:
    return sa.inspect(op.get_bind()).has_table(table)


def upgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        for name in _METRIC_COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))
    op.execute(
        "UPDATE metrics SET x_dtype = (SELECT cases.w_dtype FROM cases "
        "WHERE cases.id = metrics.case_pk) WHERE output IN ('dw', 'db')"
    )
    if _has("run_summaries"):
        with op.batch_alter_table("run_summaries") as batch:
            batch.add_column(sa.Column("worst_usage", sa.Double(), nullable=True))
        op.execute("DELETE FROM run_summaries")
        op.execute("DELETE FROM run_counts")
        op.execute("UPDATE runs SET summarised_at = NULL")


def downgrade() -> None:
    op.execute(
        "UPDATE metrics SET x_dtype = (SELECT cases.x_dtype FROM cases "
        "WHERE cases.id = metrics.case_pk) WHERE output IN ('dw', 'db')"
    )
    if _has("run_summaries"):
        with op.batch_alter_table("run_summaries") as batch:
            batch.drop_column("worst_usage")
        op.execute("DELETE FROM run_summaries")
        op.execute("DELETE FROM run_counts")
        op.execute("UPDATE runs SET summarised_at = NULL")
    with op.batch_alter_table("metrics") as batch:
        for name in _METRIC_COLUMNS:
            batch.drop_column(name)
