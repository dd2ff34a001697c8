"""`mpipe app` (and so `make run`) says first which database it uses, and that the
default is the per-user file every clone shares."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from bounds import EVENT_S

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_app_names_its_database_before_it_starts(tmp_path):
    # The app cannot listen on a port another socket holds: it names the database, then stops with that error.
    env = {k: v for k, v in os.environ.items() if k != "MPIPE_DB_URL"}
    env.update(XDG_DATA_HOME=str(tmp_path), PYTHONPATH=str(REPO))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "mpipe_cli.main", "app", "--no-worker", "--port", str(port)],
                              env=env, capture_output=True, text=True, timeout=EVENT_S, cwd=tmp_path)
    path = tmp_path / "mpipe" / "mpipe.db"
    assert done.returncode == 1 and f"is port {port} free?" in done.stderr
    assert done.stdout.splitlines()[0] == (
        f"database sqlite:///{path} (the default: every mpipe command and every clone run by this user share it; "
        f"--db URL or $MPIPE_DB_URL picks another)")
    assert path.exists()


def test_a_database_given_is_named_as_given(monkeypatch):
    from mpipe_cli.app_commands import database_note

    monkeypatch.delenv("MPIPE_DB_URL", raising=False)
    assert database_note("sqlite:////x/a.db", "/x/a.db") == "database sqlite:////x/a.db (from --db)"
    monkeypatch.setenv("MPIPE_DB_URL", "postgresql+psycopg://u:secret@h/mpipe")
    assert database_note("postgresql+psycopg://u:***@h/mpipe", None) == (
        "database postgresql+psycopg://u:***@h/mpipe (from $MPIPE_DB_URL)")
