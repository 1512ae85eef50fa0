"""Per-run history summaries: run_summaries, run_counts, runs.summarised_at; metrics indexed
by (run_id, x_dtype, output) instead of run_id alone.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-09

Schema only, written out in full like 0001. Runs stored before this revision have
``summarised_at`` NULL: history computes them live (correct, only slower) until
``convmatrix.db.migrate.upgrade`` fills their summaries right after migrating to the newest
revision, with the code of the schema it then stands at (a data step here would have to run
today's summary code against this revision's tables forever).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_OUTCOMES = ("passed", "failed", "skipped", "crashed", "timeout", "error")


def _keys(table: str, *extra: str) -> list[sa.Column | sa.Constraint]:
    """run_id -> runs (CASCADE) and x_dtype, then ``extra`` key columns, as the primary key."""
    columns = ("run_id", "x_dtype", *extra)
    return [
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("x_dtype", sa.String(length=32), nullable=False),
        *(sa.Column(name, sa.String(length=32), nullable=False) for name in extra),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f(f"fk_{table}_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(*columns, name=op.f(f"pk_{table}")),
    ]


def upgrade() -> None:
    # A plain ADD COLUMN (nullable, no default): batch mode does it in place on SQLite too.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("summarised_at", sa.DateTime(timezone=True), nullable=True))

    op.create_table(
        "run_summaries",
        *_keys("run_summaries", "output"),
        sa.Column("cases", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        *(
            sa.Column(name, sa.Double(), nullable=True)
            for name in ("worst_rel", "median_rel", "worst_norm", "median_norm")
        ),
        sa.Column("worst_case_id", sa.String(length=12), nullable=False),
    )
    op.create_index(
        op.f("ix_run_summaries_x_dtype_output_run_id"),
        "run_summaries",
        ["x_dtype", "output", "run_id"],
    )
    op.create_table(
        "run_counts",
        *_keys("run_counts"),
        *(sa.Column(f"n_{o}", sa.Integer(), nullable=False) for o in _OUTCOMES),
    )
    op.create_index(op.f("ix_run_counts_x_dtype_run_id"), "run_counts", ["x_dtype", "run_id"])
    # The summary of one run computed live seeks (run_id, x_dtype): with only (run_id) indexed,
    # SQLite chose the (x_dtype, ...) index and walked every row of the dtype (127 ms vs 8 ms
    # over 1M rows). The wider index serves run_id lookups as the old one did.
    op.create_index(
        op.f("ix_metrics_run_id_x_dtype_output"), "metrics", ["run_id", "x_dtype", "output"]
    )
    op.drop_index(op.f("ix_metrics_run_id"), table_name="metrics")


def downgrade() -> None:
    op.create_index(op.f("ix_metrics_run_id"), "metrics", ["run_id"])
    op.drop_index(op.f("ix_metrics_run_id_x_dtype_output"), table_name="metrics")
    op.drop_table("run_counts")
    op.drop_table("run_summaries")
    if op.get_bind().dialect.name == "sqlite":
        # Native since SQLite 3.35. Batch mode would copy runs and DROP the original, and with
        # foreign keys on that DROP deletes every case, metric and timing by ON DELETE CASCADE.
        op.execute("ALTER TABLE runs DROP COLUMN summarised_at")
    else:
        op.drop_column("runs", "summarised_at")
