"""Fixtures shared by every test that touches a database: each such test runs on
SQLite and on PostgreSQL.

PostgreSQL comes from `scripts/start_postgres.sh` (which `scripts/test.sh`
sources) through MPIPE_TEST_PG_URL.  Without it the PostgreSQL half of the
tests fails with an explanation: it is never skipped.  Each test gets a fresh
SQLite file, or a fresh PostgreSQL schema (named in the URL's search_path).
"""
from __future__ import annotations

import os
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_URL_ENV = "MPIPE_TEST_PG_URL"
DATABASES = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.fail(
            f"{PG_URL_ENV} is not set, so the PostgreSQL half of the storage tests cannot run: "
            "use `bash scripts/test.sh` (it starts a throwaway server), or "
            "`source scripts/start_postgres.sh` before pytest",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def pg_admin(pg_server_url):
    engine = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:  # noqa: BLE001 - report whatever stops the connection
        pytest.fail(f"cannot reach PostgreSQL at {pg_server_url}: {error}", pytrace=False)
    yield engine
    engine.dispose()


def _fresh_pg_url(pg_admin, pg_server_url) -> tuple[str, str]:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(pg_server_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), schema


@pytest.fixture(params=DATABASES)
def db_url(request, tmp_path):
    """A URL of an empty database: an SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'mpipe.db'}"
        return
    pg_server_url = request.getfixturevalue("pg_server_url")
    pg_admin = request.getfixturevalue("pg_admin")
    url, schema = _fresh_pg_url(pg_admin, pg_server_url)
    yield url
    with pg_admin.connect() as connection:
        connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture
def no_ambient_db(monkeypatch, tmp_path):
    """The test never touches the user's real library, whatever the environment says."""
    monkeypatch.delenv("MPIPE_DB_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("MPIPE_USER", "tester")


@pytest.fixture
def db(db_url):
    """The database at `db_url`, opened (so migrated) and closed after the test."""
    from storage import open_database

    database = open_database(db_url)
    yield database
    database.close()
