"""The timing's lower bound is its *floor*: timings.bound_s -> timings.floor_s.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04

"Bound" is the error bound of docs/spec.md §4 (bound usage, the bound model); the least time a
case can take (max(F / P_eff, t_memcpy(D))) is its time floor (docs/architecture.md, Glossary).
``ALTER TABLE ... RENAME COLUMN`` is the same statement on SQLite (3.25+) and PostgreSQL and
rebuilds nothing.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE timings RENAME COLUMN bound_s TO floor_s")


def downgrade() -> None:
    op.execute("ALTER TABLE timings RENAME COLUMN floor_s TO bound_s")
