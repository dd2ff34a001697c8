"""Databases for tests: a fresh SQLite file or PostgreSQL schema per test (the
fixtures that use these are in tests/conftest.py and tests/app/conftest.py)."""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import text
from sqlalchemy.engine import make_url

DATABASES = ["sqlite", "postgresql"]


def _fresh_pg_url(pg_admin, pg_server_url) -> tuple[str, str]:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(pg_server_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), schema


@contextmanager
def empty_database(request, tmp_path) -> Iterator[str]:
    """The URL of an empty database of the parametrized kind: an SQLite file, or a
    new PostgreSQL schema dropped afterwards."""
    if getattr(request, "param", "sqlite") == "sqlite":
        yield f"sqlite:///{tmp_path / 'mpipe.db'}"
        return
    pg_server_url = request.getfixturevalue("pg_server_url")
    pg_admin = request.getfixturevalue("pg_admin")
    url, schema = _fresh_pg_url(pg_admin, pg_server_url)
    yield url
    with pg_admin.connect() as connection:
        connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


