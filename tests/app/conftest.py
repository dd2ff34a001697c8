"""Every app test runs against its own temporary SQLite database (via
MPIPE_DB_URL), never the user's."""
from __future__ import annotations

import pytest


@pytest.fixture
def db_url(tmp_path, monkeypatch) -> str:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    monkeypatch.setenv("MPIPE_DB_URL", url)
    monkeypatch.setenv("MPIPE_USER", "tester")
    return url


@pytest.fixture
def db(db_url):
    from storage import open_database

    database = open_database(db_url)
    yield database
    database.close()
