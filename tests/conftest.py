"""Fixtures shared by every test that touches a database: each such test runs on
SQLite and on PostgreSQL.

PostgreSQL comes from `scripts/start_postgres.sh` (which `scripts/test.sh`
sources) through MPIPE_TEST_PG_URL.  Without it the PostgreSQL half of the
tests fails with an explanation: it is never skipped.  Each test gets a fresh
SQLite file, or a fresh PostgreSQL schema (named in the URL's search_path).
"""
from __future__ import annotations

import os

import pytest
from db_fixtures import DATABASES, empty_database
from sqlalchemy import create_engine, text

PG_URL_ENV = "MPIPE_TEST_PG_URL"


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


@pytest.fixture(scope="session", autouse=True)
def _own_run_root(tmp_path_factory):
    """Workers a test starts without --run-root (the app's, `mpipe worker --once`) keep their
    run directories in this test process's temp folder, not in the shared /tmp/mpipe-runs: a
    worker sweeps away the directories there that its own database does not know, which are
    another test process's, or another clone's, live runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MPIPE_RUN_ROOT", str(tmp_path_factory.mktemp("run-root")))
        yield


def pytest_generate_tests(metafunc):
    """Every test using `db_url` runs once per database; `@pytest.mark.databases("sqlite")`
    on a test or module narrows that."""
    if "db_url" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("databases")
        metafunc.parametrize("db_url", list(marker.args) if marker else DATABASES, indirect=True)


@pytest.fixture
def db_url(request, tmp_path):
    """A URL of an empty database: an SQLite file, or a new PostgreSQL schema."""
    with empty_database(request, tmp_path) as url:
        yield url


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


def pytest_collection_modifyitems(config, items):
    """The files with a test marked `slow` (torchrun, servers, browsers: a minute or more
    each) first.  `scripts/test.sh` hands files to its workers in this order, so the long
    ones start at once and the many short ones fill the gaps at the end, rather than a long
    one starting last while the other workers sit idle."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: a file's tests stay together
