"""Stored pages of finished runs: run_pages.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05

A finished run never changes, yet its report and served pages were rebuilt from every result
row on each request (seconds for 10,000 cases). ``run_pages`` keeps each page once, compressed,
under a stamp of what it was built from (``convmatrix.db.pages``); rows go with their run.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_pages",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(300), nullable=False),
        sa.Column("stamp", sa.String(64), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("stored_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_run_pages_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "name", name="pk_run_pages"),
    )


def downgrade() -> None:
    op.drop_table("run_pages")
