"""Initial schema: runs, cases, metrics, properties, timings.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

Written out in full (not imported from the models) so later model changes cannot rewrite
history; ``tests/test_db_schema.py`` checks that models and migrations agree.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_OUTCOMES = "'passed', 'failed', 'skipped', 'crashed', 'timeout', 'error'"


def _str(name: str, length: int, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.String(length=length), nullable=nullable)


def _num(name: str, kind: type = sa.Double, nullable: bool = False) -> sa.Column:
    return sa.Column(name, kind(), nullable=nullable)


def _child(table: str, *columns: sa.Column | sa.Constraint) -> None:
    """A per-case table: id, case_pk -> cases, run_id -> runs (denormalised), then ``columns``."""
    op.create_table(
        table,
        _num("id", sa.Integer),
        _num("case_pk", sa.Integer),
        _num("run_id", sa.Integer),
        *columns,
        sa.ForeignKeyConstraint(
            ["case_pk"], ["cases.id"], name=op.f(f"fk_{table}_case_pk_cases"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f(f"fk_{table}_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}")),
    )
    op.create_index(op.f(f"ix_{table}_run_id"), table, ["run_id"])


def upgrade() -> None:
    op.create_table(
        "runs",
        _num("id", sa.Integer),
        _str("kernel", 200),
        _str("kernel_commit", 64, nullable=True),
        _num("kernel_dirty", sa.Boolean, nullable=True),
        _str("matrix", 200),
        _str("matrix_hash", 64),
        _str("device_kind", 32),
        _str("device_name", 200, nullable=True),
        _str("host", 200),
        _num("pid", sa.Integer, nullable=True),
        _num("versions", sa.JSON),
        _str("label", 200, nullable=True),
        _num("argv", sa.JSON),
        _num("options", sa.JSON),
        _num("geometry", sa.JSON, nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        _str("status", 32),
        _num("n_planned", sa.Integer, nullable=True),
        *(_num(f"n_{o}", sa.Integer) for o in _OUTCOMES.replace("'", "").split(", ")),
        sa.CheckConstraint(
            "status IN ('running', 'finished', 'interrupted')", name=op.f("ck_runs_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index(op.f("ix_runs_kernel_commit"), "runs", ["kernel_commit"])
    op.create_index(op.f("ix_runs_kernel_started_at"), "runs", ["kernel", "started_at"])
    op.create_index(op.f("ix_runs_label"), "runs", ["label"])

    op.create_table(
        "cases",
        _num("id", sa.Integer),
        _num("run_id", sa.Integer),
        _str("case_id", 12),
        _str("suite", 200),
        _str("op", 32),
        _num("width", sa.Integer),
        _num("seqlen", sa.Integer, nullable=True),
        _num("dim", sa.Integer),
        _num("batch", sa.Integer),
        _str("layout", 32),
        _str("gap", 32, nullable=True),
        _str("activation", 32, nullable=True),
        _num("bias", sa.Boolean),
        _str("x_dtype", 32),
        _str("w_dtype", 32),
        _str("initial_state", 32, nullable=True),
        _num("final_state", sa.Boolean, nullable=True),
        _str("dfinal", 32, nullable=True),
        _num("packed", sa.Boolean),
        _num("tokens", sa.Integer, nullable=True),
        _num("steps", sa.Integer, nullable=True),
        _num("state_len", sa.Integer, nullable=True),
        _num("circular", sa.Boolean, nullable=True),
        _str("slots", 32, nullable=True),
        _str("expect", 32),
        _num("params", sa.JSON),
        _str("outcome", 32),
        _num("message", sa.Text, nullable=True),
        _num("duration_s"),
        _str("worker", 32, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(f"outcome IN ({_OUTCOMES})", name=op.f("ck_cases_outcome")),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_cases_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cases")),
        sa.UniqueConstraint("run_id", "case_id", name=op.f("uq_cases_run_id_case_id")),
    )
    op.create_index(op.f("ix_cases_case_id"), "cases", ["case_id"])

    _child(
        "metrics",
        _str("x_dtype", 32),
        _str("output", 32),
        *(_num(n, nullable=True) for n in ("e_abs", "e_rel", "e_norm", "tau", "scale")),
        _num("worst_index", sa.JSON, nullable=True),
        *(
            _num(n, nullable=True)
            for n in ("fw_abs", "fw_rel", "fw_norm", "limit_rel", "limit_norm")
        ),
        _num("passed", sa.Boolean),
        sa.UniqueConstraint("case_pk", "output", name=op.f("uq_metrics_case_pk_output")),
    )
    op.create_index(
        op.f("ix_metrics_x_dtype_output_run_id"), "metrics", ["x_dtype", "output", "run_id"]
    )
    _child(
        "properties",
        _str("name", 200),
        _num("passed", sa.Boolean),
        _num("detail", sa.Text),
    )
    _child(
        "timings",
        _str("scope", 32),
        _num("median_s"),
        _num("min_s"),
        _num("iqr_s"),
        _num("n", sa.Integer),
        _num("cold_s", nullable=True),
        _num("samples", sa.JSON),
        _str("mode", 32, nullable=True),
        *(_num(n, nullable=True) for n in ("flops", "bytes_moved", "bound_s", "efficiency")),
    )


def downgrade() -> None:
    for table in ("timings", "properties", "metrics", "cases", "runs"):
        op.drop_table(table)
