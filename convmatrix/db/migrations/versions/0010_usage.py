"""One measure: metrics.broken_zeros; run_summaries.median_usage.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

Bound usage is the measure every report and the error-regression rule speak
(docs/regression-rule.md). An element whose bound is zero (an exactly-zero expected value)
is no ratio: ``metrics.broken_zeros`` counts those that came out non-zero, apart from
``bound_usage`` (NULL in rows written before: their usage counted such an element as
``|a| / eta``, 1e+43 and more). History shows the median usage beside the worst
(``run_summaries.median_usage``); every stored summary is marked stale (``runs.summarised_at``
NULL), and ``convmatrix.db.migrate.upgrade`` recomputes them with the new column right after
migrating, as 0003 did.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _stale_summaries() -> None:
    op.execute("DELETE FROM run_summaries")
    op.execute("DELETE FROM run_counts")
    op.execute("UPDATE runs SET summarised_at = NULL")


def upgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.add_column(sa.Column("broken_zeros", sa.Integer(), nullable=True))
    with op.batch_alter_table("run_summaries") as batch:
        batch.add_column(sa.Column("median_usage", sa.Double(), nullable=True))
    _stale_summaries()


def downgrade() -> None:
    with op.batch_alter_table("run_summaries") as batch:
        batch.drop_column("median_usage")
    with op.batch_alter_table("metrics") as batch:
        batch.drop_column("broken_zeros")
    _stale_summaries()
