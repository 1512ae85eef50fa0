"""Regressions and their history: regressions, regression_events.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

A regression is one case of one kernel, matrix and device that went bad (a new failure, an
error regression, a timing regression), with its lifecycle state, the first bad and last good
run and commit, and who changed it last; every state change is an event row. Schema only.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_KINDS = ("new_failure", "error_regression", "timing_regression")
_STATES = ("detected", "confirmed", "flaky", "acknowledged", "fixed", "ignored")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _run_fk(table: str, column: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], ["runs.id"], name=op.f(f"fk_{table}_{column}_runs"), ondelete="SET NULL"
    )


def upgrade() -> None:
    op.create_table(
        "regressions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel", sa.String(length=200), nullable=False),
        sa.Column("matrix", sa.String(length=200), nullable=False),
        sa.Column("device", sa.String(length=32), nullable=False),
        sa.Column("case_id", sa.String(length=12), nullable=False),
        sa.Column("case_name", sa.Text(), nullable=False),
        sa.Column("output", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("first_bad_run", sa.Integer(), nullable=True),
        sa.Column("first_bad_commit", sa.String(length=64), nullable=True),
        sa.Column("last_good_run", sa.Integer(), nullable=True),
        sa.Column("last_good_commit", sa.String(length=64), nullable=True),
        sa.Column("fixed_run", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_by", sa.String(length=200), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.CheckConstraint(_in("kind", _KINDS), name=op.f("ck_regressions_kind")),
        sa.CheckConstraint(_in("state", _STATES), name=op.f("ck_regressions_state")),
        _run_fk("regressions", "first_bad_run"),
        _run_fk("regressions", "last_good_run"),
        _run_fk("regressions", "fixed_run"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regressions")),
    )
    op.create_index(
        op.f("ix_regressions_kernel_matrix_device_case_id"),
        "regressions",
        ["kernel", "matrix", "device", "case_id"],
    )
    op.create_index(op.f("ix_regressions_state"), "regressions", ["state"])
    op.create_table(
        "regression_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("regression_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("by", sa.String(length=200), nullable=False),
        sa.Column("from_state", sa.String(length=32), nullable=True),
        sa.Column("to_state", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["regression_id"],
            ["regressions.id"],
            name=op.f("fk_regression_events_regression_id_regressions"),
            ondelete="CASCADE",
        ),
        _run_fk("regression_events", "run_id"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regression_events")),
    )
    op.create_index(
        op.f("ix_regression_events_regression_id"), "regression_events", ["regression_id"]
    )


def downgrade() -> None:
    op.drop_table("regression_events")
    op.drop_table("regressions")
