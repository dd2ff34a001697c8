"""Fixtures for the storage tests (the database fixtures `db_url` and `db` are in
tests/conftest.py: every database test runs on SQLite and on PostgreSQL)."""
from __future__ import annotations

import pytest


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """An SQLite database apart from `db`/`db_url` (which may be SQLite too)."""
    return f"sqlite:///{tmp_path / 'other.db'}"


@pytest.fixture(autouse=True)
def _no_ambient_db(no_ambient_db):
    """Tests never touch the user's real library (see `no_ambient_db`)."""
