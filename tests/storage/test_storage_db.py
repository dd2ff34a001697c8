"""Opening databases: location, per-connection settings, migrations, newer schemas, locks."""
from __future__ import annotations

import os
import sqlite3

import pytest
from sqlalchemy import inspect, text

from mpipe_cli.main import main
from storage import (
    DatabaseLockedError,
    SchemaError,
    default_db_path,
    list_schedules,
    open_database,
    resolve_db_url,
    save_schedule,
)
from storage.db import current_revision, head_revision
from storage.models import Base

TABLES = {"schedules", "schedule_versions", "schedule_tags", "workloads", "workload_versions",
          "runs", "run_events", "op_timings", "alembic_version"}


def test_default_location_follows_xdg_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "mpipe" / "mpipe.db"
    assert resolve_db_url() == f"sqlite:///{tmp_path / 'data' / 'mpipe' / 'mpipe.db'}"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_db_path() == tmp_path / "home" / ".local" / "share" / "mpipe" / "mpipe.db"
    monkeypatch.setenv("MPIPE_DB_URL", "postgresql+psycopg://team/mpipe")
    assert resolve_db_url() == "postgresql+psycopg://team/mpipe"
    assert resolve_db_url("lib.db") == f"sqlite:///{os.path.abspath('lib.db')}"
    assert resolve_db_url("sqlite:///x.db") == "sqlite:///x.db"


def test_default_database_is_created_on_first_use(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert main(["db", "upgrade"]) == 0
    assert (tmp_path / "data" / "mpipe" / "mpipe.db").exists()


def test_sqlite_connections_get_wal_busy_timeout_and_foreign_keys(sqlite_url):
    db = open_database(sqlite_url, busy_timeout_ms=1234)
    with db.engine.connect() as first, db.engine.connect() as second:
        for connection in (first, second):
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1234
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL


def test_migrations_create_the_schema_the_models_describe(db):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    assert current_revision(db) == head_revision()
    with db.engine.connect() as connection:
        assert TABLES <= set(inspect(connection).get_table_names())
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
        indexes = {ix["name"] for ix in inspect(connection).get_indexes("runs")}
        assert {"ix_runs_status_id", "ix_runs_status_lease_expires_at"} <= indexes
        indexes = {ix["name"] for ix in inspect(connection).get_indexes("op_timings")}
        assert "ix_op_timings_run_id_step" in indexes


def test_the_declared_head_is_alembics_head():
    from storage.migrations import HEAD

    assert HEAD == head_revision()


def test_opening_twice_is_a_no_op(db_url):
    from storage import enqueue, get_version, list_audit, list_workloads, save_workload

    first = open_database(db_url)
    saved = save_schedule(first, "kept", "zb_h1(p=4, m=8)", tags=["zero-bubble"], message="first")
    save_workload(first, "team", "llava-7b")
    run = enqueue(first, "kept")
    audit = [(e.action, e.target) for e in list_audit(first)]
    first.close()
    db = open_database(db_url)
    try:
        assert current_revision(db) == head_revision()
        # ... and everything written before is still there, unchanged
        version = get_version(db, "kept@1")
        assert (version.term, version.summary, version.message) == (saved.term, saved.summary, "first")
        [schedule] = list_schedules(db)
        assert (schedule.name, schedule.tags, schedule.version_count) == ("kept", ("zero-bubble",), 1)
        assert [w.ref for w in list_workloads(db)] == ["team@1"]
        from storage import get_run

        assert get_run(db, run.id).status == "queued"
        assert [(e.action, e.target) for e in list_audit(db)] == audit and len(audit) == 3
    finally:
        db.close()


def test_newer_schema_is_refused_clearly(db_url, capsys):
    db = open_database(db_url)
    db.write(lambda s: s.execute(text("UPDATE alembic_version SET version_num = 'f00dfeed9999'")))
    db.close()
    with pytest.raises(SchemaError) as caught:
        open_database(db_url)
    assert "schema revision f00dfeed9999, newer than this mpipe knows" in caught.value.message
    assert main(["library", "list", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: database ") and "newer than this mpipe knows" in err
    assert err.count("\n") == 1


def test_db_upgrade_and_info_commands(sqlite_url, capsys):
    assert main(["db", "info", "--db", sqlite_url]) == 0
    assert "empty (run `mpipe db upgrade`)" in capsys.readouterr().out
    assert main(["db", "upgrade", "--db", sqlite_url]) == 0
    assert f"schema at revision {head_revision()} (latest)" in capsys.readouterr().out
    assert main(["db", "info", "--db", sqlite_url]) == 0
    assert "up to date" in capsys.readouterr().out


def test_not_a_database_url_is_a_user_error(capsys):
    assert main(["library", "list", "--db", "nosuchdialect://x/y"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_locked_sqlite_database_retries_then_fails_clearly_without_writing(sqlite_url, capsys, monkeypatch):
    db = open_database(sqlite_url, busy_timeout_ms=50)
    db.lock_retries = 2  # the CLI below keeps the default
    path = sqlite_url[len("sqlite:///"):]
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(DatabaseLockedError) as caught:
            save_schedule(db, "held", "1f1b(p=2, m=2)")
        assert "is locked by another process (gave up after 3 tries)" in caught.value.message
        monkeypatch.setenv("MPIPE_DB_BUSY_TIMEOUT_MS", "50")
        assert main(["library", "save", "held", "1f1b(p=2, m=2)", "--db", sqlite_url]) == 2
        assert "is locked by another process" in capsys.readouterr().err
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert list_schedules(db) == []
    assert save_schedule(db, "held", "1f1b(p=2, m=2)").ref == "held@1"  # free again: works
