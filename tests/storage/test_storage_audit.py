"""Roles and the audit trail on both databases: each role may do exactly its
set of writes, a refused one changes nothing and is recorded, every write
records who did what, and the trail cannot be rewritten."""
from __future__ import annotations

import ast
import importlib
import inspect
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

import storage
from storage import (
    Actor,
    DuplicateNameError,
    PermissionDeniedError,
    archive_schedule,
    cancel_run,
    describe_schedule,
    enqueue,
    export_library,
    fork_schedule,
    get_run,
    get_schedule,
    import_library,
    list_audit,
    list_runs,
    list_workloads,
    save_schedule,
    save_workload,
    tag_schedule,
)
from storage.models import utcnow

ACTIONS = ("save", "fork", "tag", "describe", "import", "launch", "cancel", "archive", "calibrate")
# The roles matrix of the team server (docs/team-server.md), written out: "ok" or "refused".
MATRIX = {
    "viewer": dict.fromkeys(ACTIONS, "refused"),
    "designer": {"save": "ok", "fork": "ok", "tag": "ok", "describe": "ok", "import": "ok",
                 "launch": "refused", "cancel": "refused", "archive": "refused", "calibrate": "refused"},
    "operator": dict.fromkeys(ACTIONS, "ok"),
    "none": dict.fromkeys(ACTIONS, "refused"),  # signed in, but no role on this server
}
TERM = "1f1b(p=2, m=2)"


@pytest.fixture
def library(db):
    """A schedule, a queued run of it, and an export holding a schedule the library lacks."""
    save_schedule(db, "base", TERM)
    save_schedule(db, "other", "gpipe(p=2, m=2)")
    doc = export_library(db, ["other"])
    doc["schedules"][0]["name"] = "imported"
    run = enqueue(db, "base")
    return db, doc, run.id


def _writes(doc, run_id):
    """Each action of the matrix as the storage call the app and the CLI make."""
    return {
        "save": lambda db: save_schedule(db, "new-one", "gpipe(p=2, m=4)"),
        "fork": lambda db: fork_schedule(db, "base", "forked"),
        "tag": lambda db: tag_schedule(db, "base", add=["reviewed"]),
        "describe": lambda db: describe_schedule(db, "base", "the 1F1B baseline"),
        "import": lambda db: import_library(db, doc, source="team.json"),
        "launch": lambda db: enqueue(db, "base"),
        "cancel": lambda db: cancel_run(db, run_id),
        "archive": lambda db: archive_schedule(db, "other"),
        "calibrate": lambda db: save_workload(db, "cal-run", "uniform", action="calibrate", run_id=run_id),
    }


def _state(db) -> tuple:
    """Everything a write could change, apart from the audit trail."""
    return (export_library(db), [(r.id, r.status, r.cancel_requested) for r in list_runs(db)],
            [(w.ref, w.body) for w in list_workloads(db)])


@pytest.mark.parametrize("role", list(MATRIX))
def test_each_role_may_do_exactly_its_set_and_refusals_change_nothing(library, role):
    db, doc, run_id = library
    actor = Actor(f"{role}@example.org", role, "app")
    acting = db.acting_as(actor)
    seen = {}
    for action, write in _writes(doc, run_id).items():
        before = _state(db)
        try:
            write(acting)
        except PermissionDeniedError as error:
            seen[action] = "refused"
            assert error.message.startswith(f"refused: {role}@example.org ("), error.message
            assert _state(db) == before, f"{role} {action}: a refused write changed the library"
        else:
            seen[action] = "ok"
        newest = list_audit(db, limit=1)[0]
        assert (newest.actor, newest.role, newest.via, newest.outcome) == (actor.name, role, "app", seen[action])
        assert newest.action == action
    assert seen == MATRIX[role]


def test_a_refusal_names_the_actor_the_action_and_the_role_it_needs(library):
    db, _, run_id = library
    viewer = db.acting_as(Actor("vera@example.org", "viewer", "app"))
    with pytest.raises(PermissionDeniedError) as refused:
        enqueue(viewer, "base@1", steps=3)
    assert refused.value.message == ("refused: vera@example.org (viewer) may not launch runs; "
                                     "that needs the operator role (base@1)")
    entry = list_audit(db, limit=1)[0]
    assert (entry.action, entry.target, entry.schedule, entry.run_id, entry.outcome) == (
        "launch", "base@1", "base", None, "refused")
    assert entry.details == {"backend": "gloo", "steps": 3}
    with pytest.raises(PermissionDeniedError, match=r"^refused: nobody@example.org \(no role\) may not cancel runs"):
        cancel_run(db.acting_as(Actor("nobody@example.org", "none", "app")), run_id)


def test_restore_needs_what_archive_needs_and_a_designer_may_save_workloads(library):
    db, _, _ = library
    archive_schedule(db, "other")
    designer = db.acting_as(Actor("dana@example.org", "designer", "app"))
    with pytest.raises(PermissionDeniedError, match="may not restore archived schedules; that needs the operator"):
        archive_schedule(designer, "other", restore=True)
    assert get_schedule(db, "other").archived
    assert save_workload(designer, "mine", "uniform").author == "dana@example.org"
    with pytest.raises(PermissionDeniedError, match="may not profile models"):
        save_workload(designer, "prof", "uniform", action="profile")
    assert [e.action for e in list_audit(db, limit=3)] == ["profile", "save-workload", "restore"]


def test_a_signed_in_actor_is_the_author_whatever_mpipe_user_or_author_say(db, monkeypatch):
    monkeypatch.setenv("MPIPE_USER", "the-server-account")
    dana = db.acting_as(Actor("dana@example.org", "operator", "app"))
    saved = save_schedule(dana, "s", TERM, author="someone-else")
    forked = fork_schedule(dana, "s", "s2", author="someone-else")
    run = enqueue(dana, "s", launched_by="someone-else")
    cancel_run(dana, run.id, by="someone-else")
    assert (saved.author, forked.author, get_run(db, run.id).launched_by) == ("dana@example.org",) * 3
    assert {e.actor for e in list_audit(db)} == {"dana@example.org"}
    assert "by dana@example.org" in storage.run_events(db, run.id)[-1].note


def test_the_cli_acts_as_mpipe_user_and_may_name_another_author(db, monkeypatch):
    monkeypatch.setenv("MPIPE_USER", "carol")
    saved = save_schedule(db, "s", TERM, author="the-team")
    entry = list_audit(db, limit=1)[0]
    assert saved.author == "the-team"
    assert (entry.actor, entry.role, entry.via) == ("carol", "local", "cli")
    assert entry.details["author"] == "the-team"


def test_the_database_user_is_recorded_where_the_database_has_one(db, monkeypatch):
    monkeypatch.setenv("MPIPE_USER", "pretends-to-be-alice")
    save_schedule(db, "s", TERM)
    entry = list_audit(db, limit=1)[0]
    if db.dialect == "postgresql":
        with db.engine.connect() as connection:
            assert entry.db_user == connection.execute(text("SELECT current_user")).scalar() != entry.actor
    else:
        assert entry.db_user is None
    assert list_audit(db, user=entry.db_user or "nobody") == ([entry] if entry.db_user else [])


def test_a_write_that_fails_records_nothing(db):
    save_schedule(db, "s", TERM)
    count = len(list_audit(db))
    with pytest.raises(DuplicateNameError):
        save_schedule(db, "s", TERM)
    assert len(list_audit(db)) == count


def test_the_trail_is_append_only(db):
    save_schedule(db, "s", TERM)
    before = list_audit(db)
    assert len(before) == 1 and before[0].actor not in ("", "someone-else")
    for statement in ("UPDATE audit_events SET actor = 'someone-else'", "DELETE FROM audit_events"):
        with pytest.raises(Exception, match="append-only"):
            with db.engine.begin() as connection:
                connection.execute(text(statement))
    after = list_audit(db)
    assert [e.actor for e in after] == [before[0].actor] and after == before


def test_listing_filters_by_time_user_schedule_and_run(db, monkeypatch):
    monkeypatch.setenv("MPIPE_USER", "carol")
    save_schedule(db, "a", TERM)
    middle = utcnow()
    bob = db.acting_as(Actor("bob@example.org", "operator", "app"))
    run = enqueue(bob, "a")
    save_schedule(db, "b", TERM)
    assert [e.action for e in list_audit(db)] == ["save", "launch", "save"]
    assert [e.target for e in list_audit(db, since=middle)] == ["b@1", f"run {run.id}"]
    assert [e.actor for e in list_audit(db, user="bob@example.org")] == ["bob@example.org"]
    assert [e.action for e in list_audit(db, schedule="a")] == ["launch", "save"]
    assert [e.action for e in list_audit(db, run_id=run.id)] == ["launch"]
    assert list_audit(db, since=utcnow() + timedelta(seconds=5)) == []
    assert len(list_audit(db, limit=2)) == 2


def test_hostile_text_in_a_refused_request_is_stored_safely(db):
    viewer = db.acting_as(Actor("vera@example.org", "viewer", "app"))
    with pytest.raises(PermissionDeniedError):
        save_schedule(viewer, "bad\x00name" + "x" * 500, TERM)
    entry = list_audit(db, limit=1)[0]
    assert "\x00" not in entry.target and len(entry.target) == 300 and entry.outcome == "refused"


# The worker's own bookkeeping: recorded in a run's status history, not authorized by role.
WORKER_WRITES = {"claim_next_run", "heartbeat", "finish_run", "expire_leases", "add_timings", "release_run"}


def test_every_write_function_of_the_storage_layer_authorizes_and_records():
    """A new write function that forgets the check (or its audit row) fails here.  A public
    function may write through a private writer of its module (the imports' `_store`): then it
    authorizes and the writer records."""
    root = Path(storage.__file__).parent
    checked = set()
    for module in ("library.py", "runs.py", "transfer.py", "imported_runs.py"):
        tree = ast.parse((root / module).read_text())
        functions = {node.name: ast.unparse(node) for node in tree.body if isinstance(node, ast.FunctionDef)}
        writers = {name: src for name, src in functions.items() if name.startswith("_") and "db.write(" in src}
        for name, source in functions.items():
            if name.startswith("_") or name in WORKER_WRITES:
                continue
            through = [w for w in writers if f"{w}(" in source]
            if "db.write(" not in source and not through:
                continue
            checked.add(name)
            recorded = "record(session, who," in source or any("record(session, who," in writers[w] for w in through)
            assert "authorize(db," in source and recorded, name
            function = getattr(importlib.import_module(f"storage.{module[:-3]}"), name)
            assert "actor" in inspect.signature(function).parameters, name
    assert checked == {"save_schedule", "fork_schedule", "tag_schedule", "describe_schedule", "archive_schedule",
                       "save_workload", "import_library", "enqueue", "cancel_run", "store_imported_run",
                       "import_step_summary"}


@pytest.mark.databases("postgresql")
def test_the_databases_own_permissions_bound_the_cli_and_its_user_is_recorded(db, db_url, pg_admin, capsys,
                                                                              monkeypatch):
    """A CLI on a shared database writes as whoever MPIPE_USER says, but only what its
    database user may: the database refuses the rest (one line), and names that user."""
    import uuid

    from sqlalchemy.engine import make_url

    from mpipe_cli.main import main

    save_schedule(db, "s", TERM)
    url = make_url(db_url)
    schema = url.query["options"].split("=", 1)[1]
    reader, writer = f"reader_{uuid.uuid4().hex[:8]}", f"writer_{uuid.uuid4().hex[:8]}"
    with pg_admin.connect() as connection:
        for role, grant in ((reader, "SELECT"), (writer, "SELECT, INSERT, UPDATE")):
            connection.execute(text(f"CREATE ROLE {role} LOGIN"))
            connection.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}'))
            connection.execute(text(f'GRANT {grant} ON ALL TABLES IN SCHEMA "{schema}" TO {role}'))
            connection.execute(text(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO {role}'))
    try:
        monkeypatch.setenv("MPIPE_USER", "alice")
        as_reader = url.set(username=reader).render_as_string(hide_password=False)
        assert main(["library", "tag", "s", "x", "--db", as_reader]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: database postgresql+psycopg://{reader}@") and err.endswith(
            " refused: permission denied for table schedules\n") and err.count("\n") == 1
        as_writer = url.set(username=writer).render_as_string(hide_password=False)
        assert main(["library", "tag", "s", "x", "--db", as_writer]) == 0
        entry = list_audit(db, limit=1)[0]
        assert (entry.actor, entry.db_user, entry.action) == ("alice", writer, "tag")
        assert get_schedule(db, "s").tags == ("x",)
    finally:
        with pg_admin.connect() as connection:
            for role in (reader, writer):
                connection.execute(text(f"DROP OWNED BY {role}"))
                connection.execute(text(f"DROP ROLE {role}"))
