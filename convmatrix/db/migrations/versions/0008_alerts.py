"""Alerts, run kinds and run uids: regressions you can act on.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

- ``runs.uid``: a globally unique id (32 hex digits) that export and import keep, so importing
  a run twice changes nothing; existing runs get one each.
- ``runs.kind``: what a run is for (run, confirm, bisect, adequacy); only plain runs are
  baselines, ``latest`` and history points. Existing runs are classed by the labels their
  side runs were given (``confirm:N``, ``bisect:SHA``, ``adequacy ...``).
- ``alerts``: the regressions one run found against its baseline, grouped, with their
  explanation and what confirmation and bisection found.
- ``regressions``: one row per case and kind from now on (``outputs`` and ``properties`` hold
  the detail), in an alert; people's triage fields; the state ``invalid``.

Columns are added with ``batch_alter_table`` (SQLite rebuilds ``runs`` and ``regressions``:
foreign keys stay off during the copy, see ``engine.write_connection``).
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_KINDS = ("run", "confirm", "bisect", "adequacy")
_STATES = ("detected", "confirmed", "flaky", "acknowledged", "fixed", "ignored", "invalid")
_OLD_STATES = ("detected", "confirmed", "flaky", "acknowledged", "fixed", "ignored")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _run_fk(table: str, column: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], ["runs.id"], name=op.f(f"fk_{table}_{column}_runs"), ondelete="SET NULL"
    )


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("uid", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("kind", sa.String(length=32), nullable=True))
    conn = op.get_bind()
    runs = conn.execute(sa.text("SELECT id, label FROM runs")).all()
    for run_id, label in runs:
        label = label or ""
        kind = (
            "confirm" if label.startswith("confirm:")
            else "bisect" if label.startswith("bisect:")
            else "adequacy" if label.startswith("adequacy ")
            else "run"
        )  # fmt: skip
        conn.execute(
            sa.text("UPDATE runs SET uid = :uid, kind = :kind WHERE id = :id"),
            {"uid": uuid.uuid4().hex, "kind": kind, "id": run_id},
        )
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("uid", existing_type=sa.String(length=32), nullable=False)
        batch.alter_column("kind", existing_type=sa.String(length=32), nullable=False)
        batch.create_check_constraint("kind", _in("kind", _KINDS))
        batch.create_index(op.f("ix_runs_uid"), ["uid"], unique=True)
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel", sa.String(length=200), nullable=False),
        sa.Column("matrix", sa.String(length=200), nullable=False),
        sa.Column("device", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("baseline_run", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("explanation", sa.JSON(), nullable=True),
        sa.Column("confirm_run", sa.Integer(), nullable=True),
        sa.Column("bisect_commit", sa.String(length=64), nullable=True),
        sa.Column("bisect_run", sa.Integer(), nullable=True),
        _run_fk("alerts", "run_id"),
        _run_fk("alerts", "baseline_run"),
        _run_fk("alerts", "confirm_run"),
        _run_fk("alerts", "bisect_run"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    op.create_index(
        op.f("ix_alerts_kernel_matrix_device"), "alerts", ["kernel", "matrix", "device"]
    )
    with op.batch_alter_table("regressions") as batch:
        batch.add_column(sa.Column("alert_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("outputs", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("properties", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("assignee", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("bug", sa.Text(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_regressions_alert_id_alerts"), "alerts", ["alert_id"], ["id"],
            ondelete="SET NULL",
        )  # fmt: skip
        batch.drop_constraint(op.f("ck_regressions_state"), type_="check")
        batch.create_check_constraint("state", _in("state", _STATES))
        batch.create_index(op.f("ix_regressions_alert_id"), ["alert_id"])


def downgrade() -> None:
    with op.batch_alter_table("regressions") as batch:
        batch.drop_index(op.f("ix_regressions_alert_id"))
        batch.drop_constraint(op.f("ck_regressions_state"), type_="check")
        batch.create_check_constraint("state", _in("state", _OLD_STATES))
        batch.drop_constraint(op.f("fk_regressions_alert_id_alerts"), type_="foreignkey")
        for column in ("bug", "assignee", "properties", "outputs", "alert_id"):
            batch.drop_column(column)
    op.drop_index(op.f("ix_alerts_kernel_matrix_device"), table_name="alerts")
    op.drop_table("alerts")
    with op.batch_alter_table("runs") as batch:
        batch.drop_index(op.f("ix_runs_uid"))
        batch.drop_constraint(op.f("ck_runs_kind"), type_="check")
        batch.drop_column("kind")
        batch.drop_column("uid")
