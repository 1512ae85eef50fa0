"""Alembic environment for convmatrix's schema.

Used through ``convmatrix.db.migrate`` (which passes the connection to migrate in
``config.attributes``) or, for writing new revisions, through the alembic CLI with
``convmatrix/db/alembic.ini`` and ``-x url=...`` naming a database at the newest revision.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from convmatrix.db.engine import make_engine, write_connection
from convmatrix.db.models import Base


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things: Alembic's batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("convmatrix migrations run online only (give a database URL)")

_given = context.config.attributes.get("connection")
if _given is not None:
    run_migrations(_given)
else:
    _engine = make_engine(context.get_x_argument(as_dictionary=True).get("url"))
    with write_connection(_engine) as _conn:
        run_migrations(_conn)
