"""Every app test runs against its own temporary database (via MPIPE_DB_URL), never
the user's: SQLite, and PostgreSQL too for tests marked `databases("sqlite", "postgresql")`."""
from __future__ import annotations

import functools

import pytest
import streamlit.components.v2.manifest_scanner as _manifest_scanner
import streamlit.testing.v1.app_test as _app_test
import streamlit.testing.v1.local_script_runner as _local_script_runner
from app_helpers import chromium_browser
from db_fixtures import empty_database
from streamlit.runtime.scriptrunner.script_cache import ScriptCache

# A Streamlit server compiles each page once (one ScriptCache for its life); AppTest makes a
# new cache on every run, so each rerun parsed, magic-rewrote and compiled the page again
# (the rewrite is quadratic in a page's nesting: a fifth of the app tests' CPU).  The pages
# do not change while the tests run, so the tests share one cache, as the server does.
_PAGES = ScriptCache()
_app_test.ScriptCache = _local_script_runner.ScriptCache = lambda: _PAGES
# Each new AppTest also scanned every installed distribution's metadata for Streamlit
# components (0.27 CPU-s each time); a server scans once, at start.  What is
# installed does not change while the tests run, so the scan runs once per process.
_manifest_scanner.scan_component_manifests = functools.lru_cache(maxsize=None)(
    _manifest_scanner.scan_component_manifests)


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
