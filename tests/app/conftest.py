"""Every app test runs against its own temporary database (via MPIPE_DB_URL), never
the user's: SQLite, and PostgreSQL too for tests marked `databases("sqlite", "postgresql")`."""
from __future__ import annotations

import pytest
from app_helpers import chromium_browser
from db_fixtures import empty_database


@pytest.fixture
def db_url(request, tmp_path, monkeypatch) -> str:
    with empty_database(request, tmp_path) as url:
        monkeypatch.setenv("MPIPE_DB_URL", url)
        monkeypatch.setenv("MPIPE_USER", "tester")
        yield url


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per browser test module."""
    with chromium_browser() as b:
        yield b
