"""Alembic environment.  `storage.db.upgrade_schema` hands over an open
connection (already in a transaction, holding the migration lock); the
`alembic` command line gets one from its ini file or MPIPE_DB_URL."""
from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from storage.models import Base

config = context.config


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = os.environ.get("MPIPE_DB_URL") or config.get_main_option("sqlalchemy.url")
    if url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(url[len("sqlite:///"):])), exist_ok=True)
    with create_engine(url).connect() as conn:
        _run(conn)
        conn.commit()
