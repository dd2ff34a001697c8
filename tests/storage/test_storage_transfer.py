"""Export/import of the library: exact round trips, conflicts, malformed files."""
from __future__ import annotations

import copy
import json

import pytest

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from storage import (
    ConflictError,
    ImportFileError,
    archive_schedule,
    dump_library,
    export_library,
    fork_schedule,
    get_schedule,
    history,
    import_library,
    list_schedules,
    list_workloads,
    open_database,
    read_library_file,
    save_schedule,
    save_workload,
    tag_schedule,
)


def _fill(db) -> None:
    save_workload(db, "vit", "vit-heavy-small", description="ViT", message="preset")
    save_schedule(db, "base", "gpipe(p=2, m=4)", tags=["baseline"], description="GPipe: the baseline")
    save_schedule(db, "base", "1f1b(p=2, m=4)", update=True, message="1F1B", workload="saved:vit")
    save_schedule(db, "base", "zb_h1(p=2, m=4)", update=True, workload="llava-7b")
    fork_schedule(db, "base@2", "fork", message="try zero bubble")
    save_schedule(db, "fork", "transpose(1f1b(p=2, m=4), mode=dynamic)", update=True, workload="saved:vit")
    tag_schedule(db, "fork", add=["transpose"])
    save_schedule(db, "gone", "gpipe(p=2, m=2)", description="ünïcode — kept")
    archive_schedule(db, "gone")


def test_export_import_round_trips_exactly(db, sqlite_url):
    _fill(db)
    doc = export_library(db)
    assert [s["name"] for s in doc["schedules"]] == ["base", "fork", "gone"]
    target = open_database(sqlite_url)  # across databases too (PostgreSQL -> SQLite)
    result = import_library(target, json.loads(dump_library(doc)))
    assert result.renamed == {} and result.unlinked == []
    assert dump_library(export_library(target)) == dump_library(doc)
    assert get_schedule(target, "fork").forked_from == "base@2"
    assert history(target, "fork")[1].workload_label == "saved:vit@1"
    assert [s.name for s in list_schedules(target, include_archived=True)] == ["base", "fork", "gone"]
    assert get_schedule(target, "gone").archived


def test_import_back_into_the_same_kind_of_database(db_url, tmp_path):
    source = open_database(db_url)
    _fill(source)
    text = dump_library(export_library(source))
    path = tmp_path / "lib.json"
    path.write_text(text)
    other = open_database(f"sqlite:///{tmp_path / 'other.db'}")
    import_library(other, read_library_file(path))
    assert dump_library(export_library(other)) == text


def test_conflicting_names_are_refused_whole_or_renamed(db):
    _fill(db)
    doc = export_library(db)
    with pytest.raises(ConflictError) as caught:
        import_library(db, doc)
    assert caught.value.message == (
        "import refused, the library already has: schedule 'base', schedule 'fork', schedule 'gone'; "
        "nothing was imported (import with rename to take them under new names)")
    assert len(list_schedules(db, include_archived=True)) == 3
    result = import_library(db, doc, rename=True)
    assert result.renamed == {"base": "base-2", "fork": "fork-2", "gone": "gone-2"}
    assert result.reused_workloads == ["vit"]  # identical workload: shared, not copied
    assert get_schedule(db, "fork-2").forked_from == "base-2@2"  # lineage follows the rename
    assert [h.term for h in history(db, "base-2")] == [h.term for h in history(db, "base")]
    assert import_library(db, doc, rename=True).renamed["base"] == "base-3"
    assert [w.name for w in list_workloads(db)] == ["vit"]


def test_a_different_workload_of_the_same_name_conflicts(db, sqlite_url):
    _fill(db)
    doc = export_library(db)
    other = open_database(sqlite_url)
    save_workload(other, "vit", "llava-7b")
    with pytest.raises(ConflictError, match=r"already has: workload 'vit'; nothing was imported"):
        import_library(other, doc)
    result = import_library(other, doc, rename=True)
    assert result.workloads == {"vit": "vit-2"}
    assert history(other, "base")[1].workload_label == "saved:vit@1"  # the label is kept as saved
    assert history(other, "base")[1].workload == export_library(db)["workloads"][0]["versions"][0]["body"]


def test_export_one_schedule_brings_its_workloads(db, sqlite_url):
    _fill(db)
    doc = export_library(db, ["fork"])
    assert [s["name"] for s in doc["schedules"]] == ["fork"]
    assert [w["name"] for w in doc["workloads"]] == ["vit"]
    other = open_database(sqlite_url)
    result = import_library(other, doc)
    assert result.unlinked == ["fork@1"]  # forked from base@2, which this library lacks
    assert get_schedule(other, "fork").forked_from is None


def _doc(db):
    save_schedule(db, "s", "gpipe(p=2, m=2)")
    return export_library(db)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("format"), "malformed library file: top level: 'format' must be 'mpipe-library'"),
    (lambda d: d.update(format_version=99), "malformed library file: top level: unsupported format_version 99"),
    (lambda d: d.update(schedules={}), "malformed library file: top level: 'schedules' must be list, not dict"),
    (lambda d: d["schedules"][0].pop("versions"), "malformed library file: schedules[0]: missing 'versions'"),
    (lambda d: d["schedules"][0].update(name="bad name!"), "malformed library file: schedules[0]: invalid name 'bad name!'"),
    (lambda d: d["schedules"][0]["versions"][0].update(number="1"),
     "malformed library file: schedules[0].versions[0]: 'number' must be int, not str"),
    (lambda d: d["schedules"][0]["versions"][0].update(created_at="yesterday"),
     "malformed library file: schedules[0].versions[0]: 'created_at' is not an ISO timestamp: 'yesterday'"),
    (lambda d: d["schedules"].append(copy.deepcopy(d["schedules"][0])),
     "malformed library file: schedules[1]: schedule 's' appears twice"),
    (lambda d: d["schedules"][0]["versions"][0].update(parent={"schedule": "s", "version": 5}),
     "malformed library file: schedule 's' version 1: parent s@5 is not in the file"),
    (lambda d: d["schedules"][0]["versions"][0].update(workload_ref={"name": "w", "version": 1}),
     "malformed library file: schedule 's' version 1: workload w@1 is not in the file"),
])
def test_malformed_files_are_refused_and_nothing_is_written(db, sqlite_url, mutate, message):
    doc = _doc(db)
    mutate(doc)
    target = open_database(sqlite_url)
    with pytest.raises(ImportFileError) as caught:
        import_library(target, doc)
    assert caught.value.message.startswith(message)
    assert list_schedules(target, include_archived=True) == []


def test_a_file_with_an_invalid_term_is_refused_with_the_core_message(db, sqlite_url):
    doc = _doc(db)
    doc["schedules"][0]["versions"][0]["term"] = "gpipe(p=2, m="
    with pytest.raises(MpipeError) as core:
        evaluate("gpipe(p=2, m=")
    target = open_database(sqlite_url)
    with pytest.raises(ImportFileError) as caught:
        import_library(target, doc)
    assert caught.value.message == f"schedule 's' version 1: {core.value.message}"
    assert list_schedules(target, include_archived=True) == []


def test_unreadable_files(tmp_path):
    with pytest.raises(ImportFileError, match="no such file"):
        read_library_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "mpipe-library",\n  oops}')
    with pytest.raises(ImportFileError, match=r"bad.json:2:3: not valid JSON: Expecting property name"):
        read_library_file(bad)
