"""Where a case's time goes: cases.phases (seconds per phase, JSON).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04

The phases of ``runners.case.phases`` (inputs, kernel, framework, reference, metrics, properties,
timing, harness), recorded with every case so a run report can say whether the run was
device-bound. Rows written before have none (NULL).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cases") as batch:
        batch.add_column(sa.Column("phases", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cases") as batch:
        batch.drop_column("phases")
