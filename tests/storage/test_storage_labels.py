"""A version's workload is named in full (the preset and its parallel settings, or
"edited"), `library show` gives the `mpipe eval` command that re-evaluates it to
its stored figures, and `-w saved:NAME` names the saved workloads there are."""
from __future__ import annotations

import json
import shlex

import pytest

from mpipe_cli.main import main
from mpipe_core.workloads.labels import cli_arguments, parallel_spec_text, workload_label
from mpipe_core.workloads.presets import preset_document
from mpipe_core.workloads.workload import preset, with_parallel

TERM = "balanced(zbv(p=8, m=16))"


def _tp8_sp() -> dict:
    return with_parallel(preset("internvl-26b"), {"tp": 8, "sp": True}).to_dict()


def test_a_preset_with_parallel_settings_is_named_by_them():
    assert workload_label(preset_document("internvl-26b")) == "internvl-26b"
    assert workload_label(_tp8_sp()) == "internvl-26b tp=8,sp"
    assert cli_arguments(_tp8_sp()) == ["-w", "internvl-26b", "--parallel", "tp=8,sp"]
    off = with_parallel(preset("llava-7b"), {"flash_attention": False, "dp": 4}).to_dict()
    assert workload_label(off) == "llava-7b flash_attention=false,dp=4"
    # settings equal to the preset's own change nothing
    assert workload_label(with_parallel(preset("llava-7b"), {"tp": 1}).to_dict()) == "llava-7b"
    assert parallel_spec_text({"sp": True, "tp": 8}) == "tp=8,sp"  # the section's order, as --parallel reads


def test_a_preset_changed_elsewhere_is_edited_and_no_preset_rebuilds_it():
    edited = dict(_tp8_sp(), device="h100")
    assert workload_label(edited) == "internvl-26b (edited)" and cli_arguments(edited) is None
    assert workload_label({"llm": {"f": 2.0}}, fallback="mine.json") == "mine.json"
    assert cli_arguments({"llm": {"f": 2.0}}) is None


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_library_show_names_the_settings_and_its_eval_command_reproduces_the_stored_figures(db, db_url, capsys):
    from storage import get_version, save_schedule

    saved = save_schedule(db, "internvl-tp8", TERM, workload=_tp8_sp())
    assert saved.workload_label == "internvl-26b tp=8,sp"
    code, out, err = _run(["library", "show", "internvl-tp8", "--db", db_url], capsys)
    lines = out.splitlines()
    assert code == 0 and err == ""
    assert lines[2] == "workload  internvl-26b tp=8,sp"
    command = f"mpipe eval '{TERM}' -w internvl-26b --parallel tp=8,sp"
    assert lines[4] == f"eval      {command}"
    code, out, _ = _run(shlex.split(command)[1:] + ["--json"], capsys)
    figures = json.loads(out)
    stored = get_version(db, "internvl-tp8").summary
    assert code == 0 and figures["makespan"] == stored["makespan"] and figures["peak_memory"] == stored["peak_memory"]
    # the preset alone is another workload, with other figures (the label no longer hides the difference)
    code, out, _ = _run(["eval", TERM, "-w", "internvl-26b", "--json"], capsys)
    assert json.loads(out)["makespan"] != stored["makespan"]


def test_a_version_saved_under_the_bare_preset_name_reads_in_full(db, sqlite_url):
    # A library exported before labels named the settings: its versions say "internvl-26b" alone.
    from storage import get_version, open_database, save_schedule
    from storage.transfer import export_library, import_library

    save_schedule(db, "old", TERM, workload=_tp8_sp())
    doc = export_library(db)
    [version] = doc["schedules"][0]["versions"]
    version["workload_label"] = "internvl-26b"
    other = open_database(sqlite_url)
    try:
        import_library(other, doc)
        assert get_version(other, "old").workload_label == "internvl-26b tp=8,sp"
    finally:
        other.close()


def test_the_cli_saves_with_parallel_settings_and_a_saved_workload_s_command_names_it(db_url, capsys):
    code, out, err = _run(["library", "save", "cli-tp8", TERM, "-w", "internvl-26b", "--parallel", "tp=8,sp",
                           "--db", db_url], capsys)
    assert code == 0, err
    code, out, _ = _run(["library", "show", "cli-tp8", "--db", db_url], capsys)
    assert out.splitlines()[2] == "workload  internvl-26b tp=8,sp"
    assert _run(["library", "workload", "save", "team", "llava-7b", "--db", db_url], capsys)[0] == 0
    assert _run(["library", "save", "on-team", "1f1b(p=4, m=8)", "-w", "saved:team", "--db", db_url], capsys)[0] == 0
    code, out, _ = _run(["library", "show", "on-team", "--db", db_url], capsys)
    command = f"mpipe eval '1f1b(p=4, m=8)' -w saved:team@1 --db {shlex.quote(db_url)}"
    assert out.splitlines()[2] == "workload  saved:team@1" and out.splitlines()[4] == f"eval      {command}"
    code, out, _ = _run(shlex.split(command)[1:] + ["--json"], capsys)
    shown = json.loads(_run(["library", "show", "on-team", "--json", "--db", db_url], capsys)[1])
    assert code == 0 and json.loads(out)["makespan"] == shown["version"]["summary"]["makespan"]


def test_an_edited_workload_gets_a_command_on_the_version_s_own_document(db, db_url, capsys):
    from storage import save_schedule

    save_schedule(db, "edited", "1f1b(p=4, m=8)", workload=dict(_tp8_sp(), device="h100"))
    code, out, _ = _run(["library", "show", "edited", "--db", db_url], capsys)
    assert out.splitlines()[2] == "workload  internvl-26b (edited)"
    command = f"mpipe eval '1f1b(p=4, m=8)' -w version:edited@1 --db {shlex.quote(db_url)}"
    assert out.splitlines()[4] == f"eval      {command}"
    code, out, _ = _run(shlex.split(command)[1:] + ["--json"], capsys)
    shown = json.loads(_run(["library", "show", "edited", "--json", "--db", db_url], capsys)[1])
    assert code == 0 and json.loads(out)["makespan"] == shown["version"]["summary"]["makespan"]


def test_an_unknown_saved_workload_names_those_there_are(sqlite_url, capsys):
    code, out, err = _run(["eval", "1f1b(p=2, m=2)", "-w", "saved:nonexistent", "--db", sqlite_url], capsys)
    assert code == 2 and out == ""
    assert err == ("error: no saved workload named 'nonexistent' (this database has no saved workloads: "
                   f"`mpipe library workload save NAME SOURCE` saves one; {sqlite_url})\n")
    for name in ("team-a", "team-b"):
        assert _run(["library", "workload", "save", name, "llava-7b", "--db", sqlite_url], capsys)[0] == 0
    code, out, err = _run(["eval", "1f1b(p=2, m=2)", "-w", "saved:team-aa", "--db", sqlite_url], capsys)
    assert code == 2 and err == ("error: no saved workload named 'team-aa'; did you mean 'team-a'? "
                                 "(saved workloads: team-a, team-b)\n")
    code, out, err = _run(["tune", "-w", "saved:x", "-p", "2", "-m", "2", "--db", sqlite_url], capsys)
    assert code == 2 and err.endswith("(saved workloads: team-a, team-b)\n")
