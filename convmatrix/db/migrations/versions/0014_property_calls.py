"""The kernel calls of each property check: properties.forward_calls, backward_calls.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08

A property check works from the case's own call and counts the kernel calls it adds
(``runners.case.properties``: causality and packed isolation one forward, chunk consistency two
forwards and, for ``fwd_bwd``, two backwards), so a check that grows costlier shows in the
stored runs. NULL in rows written before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("properties") as batch:
        batch.add_column(sa.Column("forward_calls", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("backward_calls", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("properties") as batch:
        batch.drop_column("backward_calls")
        batch.drop_column("forward_calls")
