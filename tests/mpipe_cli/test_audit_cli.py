"""`mpipe audit`: every write the CLI makes is in the trail with who made it
(MPIPE_USER or the login name), listed as a table or JSON, filtered by time
and user; a bad --since is one line."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from mpipe_cli.audit_commands import parse_since
from mpipe_cli.main import main
from mpipe_core.api import evaluate

TERM = "1f1b(p=2, m=4)"


def _cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.fixture
def db_arg(db_url, monkeypatch):
    monkeypatch.setenv("MPIPE_USER", "carol")
    return ["--db", db_url]


def test_every_cli_write_is_in_the_trail(capsys, db_arg, tmp_path, monkeypatch, db):
    from storage import add_timings, claim_next_run, finish_run

    _cli(capsys, "library", "save", "s", TERM, *db_arg)
    _cli(capsys, "library", "fork", "s", "s2", *db_arg)
    _cli(capsys, "library", "tag", "s", "fast", *db_arg)
    _cli(capsys, "library", "archive", "s2", *db_arg)
    _cli(capsys, "library", "workload", "save", "w", "uniform", *db_arg)
    _cli(capsys, "library", "export", "s", "-o", str(tmp_path / "lib.json"), *db_arg)
    _cli(capsys, "library", "import", str(tmp_path / "lib.json"), "--rename", *db_arg)
    monkeypatch.setenv("MPIPE_USER", "bob")
    run = json.loads(_cli(capsys, "runs", "enqueue", "s", "--json", *db_arg))["id"]
    _cli(capsys, "runs", "cancel", str(run), *db_arg)
    second = json.loads(_cli(capsys, "runs", "enqueue", "s", "--json", *db_arg))["id"]
    claim_next_run(db, "w", 60)
    add_timings(db, second, evaluate(TERM).timeline.records())
    finish_run(db, second, "w", "succeeded", exit_code=0)
    _cli(capsys, "calibrate", str(second), "--save", "cal", *db_arg)

    entries = json.loads(_cli(capsys, "audit", "--json", *db_arg))
    assert [(e["actor"], e["action"], e["target"]) for e in reversed(entries)] == [
        ("carol", "save", "s@1"), ("carol", "fork", "s2@1"), ("carol", "tag", "s"), ("carol", "archive", "s2"),
        ("carol", "save-workload", "workload w@1"), ("carol", "import", "s-2"),
        ("bob", "launch", f"run {run}"), ("bob", "cancel", f"run {run}"), ("bob", "launch", f"run {second}"),
        ("bob", "calibrate", "workload cal@1")]
    assert {(e["role"], e["via"], e["outcome"]) for e in entries} == {("local", "cli", "ok")}
    assert entries[0]["run_id"] == second and entries[4]["details"] == {
        "file": "lib.json", "versions": 1, "renamed_from": "s", "workloads": []}

    table = _cli(capsys, "audit", "--user", "bob", *db_arg).splitlines()
    assert table[0].split() == ["WHEN", "WHO", "ROLE", "VIA", "ACTION", "TARGET", "OUTCOME", "DETAILS"]
    assert [line.split()[2] for line in table[1:]] == ["bob"] * 4
    assert "cancel" in table[3] and 'status="queued"' in table[3]
    assert _cli(capsys, "audit", "--since", "1h", "--limit", "2", *db_arg).count("\n") == 3
    assert _cli(capsys, "audit", "--since", "2999-01-01", *db_arg) == "no audit entries match\n"
    assert _cli(capsys, "audit", "--schedule", "s2", "--json", *db_arg).count('"action"') == 2
    assert _cli(capsys, "audit", "--run", str(run), "--json", *db_arg).count('"action"') == 2


@pytest.mark.databases("sqlite")
def test_an_empty_trail_and_bad_options_are_one_line(capsys, db_arg):
    assert _cli(capsys, "audit", *db_arg) == "no audit entries yet\n"
    for argv, message in [
        (["--since", "yesterday"], "error: --since 'yesterday': expected a date or time (2026-05-01, "
                                   "2026-05-01T14:30) or an age (30m, 12h, 7d)\n"),
        (["--since", "5y"], "error: --since '5y': expected a date or time (2026-05-01, 2026-05-01T14:30) "
                            "or an age (30m, 12h, 7d)\n"),
        (["--user", "a\x00b"], "error: --user: contains a NUL character\n"),
        (["--user", "a\nb"], "error: --user: must be one line\n"),
        (["--schedule", "bad name"], None),
    ]:
        assert main(["audit", *argv, *db_arg]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
        if message is not None:
            assert err == message


@pytest.mark.databases("sqlite")
@pytest.mark.parametrize("since", ["999999w", "0001-01-01", "0001-01-01T00:00+05:00", "9999-12-31T23:59-12:00"])
def test_a_since_out_of_range_is_one_line_naming_it(capsys, db_arg, since):
    assert main(["audit", "--since", since, *db_arg]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err == f"error: --since {since!r}: out of range (years 1 to 9999)\n"


def test_since_reads_ages_dates_and_times():
    now = datetime(2026, 5, 2, 12, 0, tzinfo=timezone.utc)
    assert parse_since("90s", now) == now - timedelta(seconds=90)
    assert parse_since("12h", now) == now - timedelta(hours=12)
    assert parse_since("2w", now) == now - timedelta(weeks=2)
    assert parse_since("2026-05-01T14:30+02:00") == datetime(2026, 5, 1, 12, 30, tzinfo=timezone.utc)
    local = parse_since("2026-05-01")
    assert local == datetime(2026, 5, 1).astimezone().astimezone(timezone.utc)
