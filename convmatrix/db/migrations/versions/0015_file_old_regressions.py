"""Regressions from before alerts filed into alerts: one per run that found them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

0008 added alerts but left the regressions a release before it had found in none, and
everything that lists regressions goes through alerts (``convmatrix regressions``,
``regressions show N``, ``set aN``, an alert's page): after the upgrade such a database said
"no alerts" while its old regressions were open. Each (kernel, matrix, device, first bad
run) of the rows in no alert becomes the alert its scan would have made then: that run, the
rows' last good run as its baseline, the earliest row's time, no explanation (the scan of
that release computed none). Rows keep their own state, events and output (one row per
output, as that release kept them). Data only; the downgrade leaves the alerts, which
describe the rows and are not in the way of anything older.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)
_REGRESSIONS = sa.table(
    "regressions",
    sa.column("id", sa.Integer), sa.column("alert_id", sa.Integer),
    sa.column("kernel", sa.String), sa.column("matrix", sa.String),
    sa.column("device", sa.String), sa.column("first_bad_run", sa.Integer),
    sa.column("last_good_run", sa.Integer), sa.column("created_at", _TIME),
)  # fmt: skip
_ALERTS = sa.table(
    "alerts",
    sa.column("id", sa.Integer), sa.column("kernel", sa.String),
    sa.column("matrix", sa.String), sa.column("device", sa.String),
    sa.column("run_id", sa.Integer), sa.column("baseline_run", sa.Integer),
    sa.column("created_at", _TIME),
)  # fmt: skip


def upgrade() -> None:
    conn = op.get_bind()
    r = _REGRESSIONS.c
    rows = conn.execute(
        sa.select(r.id, r.kernel, r.matrix, r.device, r.first_bad_run, r.last_good_run,
                  r.created_at)
        .where(r.alert_id.is_(None)).order_by(r.id)
    ).all()  # fmt: skip
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row.kernel, row.matrix, row.device, row.first_bad_run), []).append(row)
    for (kernel, matrix, device, run_id), members in groups.items():
        alert_id = conn.execute(
            sa.insert(_ALERTS).values(
                kernel=kernel, matrix=matrix, device=device, run_id=run_id,
                baseline_run=members[0].last_good_run,
                created_at=min(m.created_at for m in members),
            ).returning(_ALERTS.c.id)
        ).scalar_one()  # fmt: skip
        ids = [m.id for m in members]
        for start in range(0, len(ids), 500):  # bound the statement's parameters
            conn.execute(
                sa.update(_REGRESSIONS)
                .where(r.id.in_(ids[start : start + 500]))
                .values(alert_id=alert_id)
            )


def downgrade() -> None:
    pass
