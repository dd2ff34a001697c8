"""The schedule library on both databases: versions, lineage, tags, archive, workloads."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from storage import (
    ConflictError,
    DuplicateNameError,
    InvalidNameError,
    NotFoundError,
    archive_schedule,
    describe_schedule,
    diff_versions,
    enqueue,
    fork_schedule,
    get_schedule,
    get_version,
    get_workload,
    history,
    list_runs,
    list_schedules,
    list_workloads,
    save_schedule,
    save_workload,
    tag_schedule,
)
from storage.models import Schedule, ScheduleVersion


def test_save_stores_the_canonical_term_and_summary(db):
    saved = save_schedule(db, "one", "1f1b( p = 4,m=8 )", message="first", description="plain 1F1B",
                          tags=["baseline"])
    expected = evaluate("1f1b(p=4, m=8)")
    assert saved.ref == "one@1"
    assert saved.term == expected.term == "1f1b(p=4, m=8)"
    assert saved.summary["makespan"] == expected.summary()["makespan"]
    assert saved.summary["devices"] == 4
    assert (saved.author, saved.message, saved.parent, saved.workload) == ("tester", "first", None, None)
    assert get_version(db, "one") == saved == get_version(db, "one@1")
    info = get_schedule(db, "one")
    assert (info.description, info.tags, info.version_count, info.latest) == ("plain 1F1B", ("baseline",), 1, saved)


def test_editing_adds_versions_and_never_overwrites(db):
    v1 = save_schedule(db, "s", "gpipe(p=2, m=4)")
    v2 = save_schedule(db, "s", "1f1b(p=2, m=4)", update=True, message="less memory")
    v3 = save_schedule(db, "s", "1f1b(p=2, m=4)", update=True, workload="vit-heavy-small")
    assert [v.number for v in history(db, "s")] == [1, 2, 3]
    assert history(db, "s") == [v1, v2, v3]
    assert (v2.parent, v3.parent) == ("s@1", "s@2")
    assert get_version(db, "s@1").term == "gpipe(p=2, m=4)"
    assert v3.workload_label == "vit-heavy-small" and v3.workload["encoders"]
    with pytest.raises(ConflictError, match=r"version 3 already has this term and workload; nothing to save"):
        save_schedule(db, "s", "1f1b(p=2,m=4)", update=True, workload="vit-heavy-small")


def test_versions_are_immutable_in_the_database_itself(db):
    save_schedule(db, "frozen", "gpipe(p=2, m=2)")
    with pytest.raises(Exception, match="immutable"):
        db.write(lambda s: s.execute(text("UPDATE schedule_versions SET term = 'x'")))

    def edit_orm(session):
        version = session.query(ScheduleVersion).one()
        version.term = "1f1b(p=2, m=2)"
        session.flush()

    with pytest.raises(ValueError, match="immutable"):
        db.write(edit_orm)
    assert get_version(db, "frozen").term == "gpipe(p=2, m=2)"


def test_duplicate_names_are_refused(db):
    save_schedule(db, "dup", "gpipe(p=2, m=2)")
    with pytest.raises(DuplicateNameError, match=r"^schedule 'dup' already exists; update it to add a version, or"):
        save_schedule(db, "dup", "1f1b(p=2, m=2)")
    with pytest.raises(DuplicateNameError, match=r"^schedule 'dup' already exists"):
        fork_schedule(db, "dup", "dup")
    assert len(history(db, "dup")) == 1


@pytest.mark.parametrize("term", ["1f1b(p=4, m=", "nosuch(p=2)", "1f1b(p=0, m=4)", "zbv(p=2, m=4, v=3)"])
def test_invalid_terms_are_refused_with_the_core_message(db, term):
    with pytest.raises(MpipeError) as core:
        evaluate(term)
    with pytest.raises(MpipeError) as ours:
        save_schedule(db, "bad", term)
    assert type(ours.value) is type(core.value)
    assert ours.value.message == core.value.message
    assert list_schedules(db, include_archived=True) == []


def test_unknown_names_and_versions(db):
    save_schedule(db, "alpha", "gpipe(p=2, m=2)")
    with pytest.raises(NotFoundError, match=r"^no schedule named 'alpah'; did you mean 'alpha'\?$"):
        get_version(db, "alpah")
    with pytest.raises(NotFoundError, match=r"^schedule 'alpha' has no version 7 \(versions 1\.\.1\)$"):
        get_version(db, "alpha@7")
    with pytest.raises(InvalidNameError, match="bad version reference 'alpha@x'"):
        get_version(db, "alpha@x")
    with pytest.raises(InvalidNameError, match="invalid schedule name ' spaced'"):
        save_schedule(db, " spaced", "gpipe(p=2, m=2)")
    with pytest.raises(NotFoundError, match="no schedule named 'ghost'"):
        save_schedule(db, "ghost", "gpipe(p=2, m=2)", update=True)


def test_fork_keeps_lineage(db):
    save_schedule(db, "base", "gpipe(p=2, m=4)", tags=["t1"])
    save_schedule(db, "base", "1f1b(p=2, m=4)", update=True)
    fork = fork_schedule(db, "base@1", "mine", description="my variant")
    assert (fork.ref, fork.parent, fork.term, fork.message) == ("mine@1", "base@1", "gpipe(p=2, m=4)",
                                                                 "forked from base@1")
    again = save_schedule(db, "mine", "zb_h1(p=2, m=4)", update=True)
    assert again.parent == "mine@1"
    info = get_schedule(db, "mine")
    assert info.forked_from == "base@1" and info.tags == ("t1",) and info.description == "my variant"
    assert get_schedule(db, "base").forked_from is None
    grandchild = fork_schedule(db, "mine", "theirs")
    assert grandchild.parent == "mine@2"


def test_tags_search_and_authors(db):
    save_schedule(db, "zb-small", "zb_h1(p=2, m=4)", tags=["zero-bubble"], description="Small ZB")
    save_schedule(db, "gp", "gpipe(p=2, m=4)", author="ann", tags=["baseline"])
    save_schedule(db, "pct_1", "1f1b(p=2, m=4)", description="100% busy")
    assert [s.name for s in list_schedules(db)] == ["gp", "pct_1", "zb-small"]
    assert [s.name for s in list_schedules(db, tag="zero-bubble")] == ["zb-small"]
    assert [s.name for s in list_schedules(db, search="SMALL")] == ["zb-small"]
    assert [s.name for s in list_schedules(db, search="%")] == ["pct_1"]  # not a wildcard
    assert [s.name for s in list_schedules(db, search="_1")] == ["pct_1"]
    assert [s.name for s in list_schedules(db, search="'; DROP TABLE schedules; --")] == []
    assert [s.name for s in list_schedules(db, author="ann")] == ["gp"]
    assert tag_schedule(db, "gp", add=["b", "a"], remove=["baseline"]) == ("a", "b")
    with pytest.raises(NotFoundError, match="schedule 'gp' has no tag 'zzz'"):
        tag_schedule(db, "gp", remove=["zzz"])
    with pytest.raises(InvalidNameError, match="invalid tag 'no spaces'"):
        tag_schedule(db, "gp", add=["no spaces"])
    assert get_schedule(db, "gp").tags == ("a", "b")


def test_search_covers_every_versions_term_and_message_and_descriptions_can_change(db):
    save_schedule(db, "a", "1f1b(p=2, m=4)")
    save_schedule(db, "a", "zbv(p=2, m=4)", update=True, message="Try the V shape")
    save_schedule(db, "b", "gpipe(p=2, m=4)")
    assert [s.name for s in list_schedules(db, search="zbv")] == ["a"]  # a term of version 2
    assert [s.name for s in list_schedules(db, search="v SHAPE")] == ["a"]  # a version's message
    assert [s.name for s in list_schedules(db, search="p=2")] == ["a", "b"]  # once each
    assert describe_schedule(db, "b", "the plain baseline").description == "the plain baseline"
    assert [s.name for s in list_schedules(db, search="baseline")] == ["b"]
    with pytest.raises(NotFoundError):
        describe_schedule(db, "nope", "x")


def test_archive_hides_but_keeps_versions_and_runs(db):
    save_schedule(db, "old", "gpipe(p=2, m=2)")
    run = enqueue(db, "old")
    info = archive_schedule(db, "old")
    assert info.archived
    assert list_schedules(db) == []
    assert [s.name for s in list_schedules(db, include_archived=True)] == ["old"]
    assert get_version(db, "old@1").term == "gpipe(p=2, m=2)"
    assert [r.id for r in list_runs(db)] == [run.id]
    with pytest.raises(ConflictError, match="schedule 'old' is archived; restore it to run it"):
        enqueue(db, "old")
    with pytest.raises(ConflictError, match="schedule 'old' is archived; restore it before adding versions"):
        save_schedule(db, "old", "1f1b(p=2, m=2)", update=True)
    assert not archive_schedule(db, "old", restore=True).archived
    assert [s.name for s in list_schedules(db)] == ["old"]
    counts = db.read(lambda s: (s.query(Schedule).count(), s.query(ScheduleVersion).count()))
    assert counts == (1, 1)


def test_diff_terms_and_metrics(db):
    save_schedule(db, "d", "gpipe(p=4, m=8)")
    save_schedule(db, "d", "1f1b(p=4, m=8)", update=True)
    diff = diff_versions(db, "d@1", "d@2")
    assert diff.term_diff[-2:] == ("-gpipe(p=4, m=8)", "+1f1b(p=4, m=8)")
    a, b = evaluate("gpipe(p=4, m=8)").summary(), evaluate("1f1b(p=4, m=8)").summary()
    assert diff.metrics["makespan"] == (a["makespan"], b["makespan"], b["makespan"] - a["makespan"])
    assert not diff.workload_changed
    same = diff_versions(db, "d@2", "d")
    assert same.term_diff == () and same.metrics["makespan"][2] == 0


def test_a_diff_across_workload_units_has_no_change_for_what_the_units_measure(db, db_url, capsys):
    from mpipe_core.workloads.presets import preset_document

    ms = dict(preset_document("uniform"), units={"time": "ms", "memory": "GB"})
    seconds = dict(ms, units={"time": "s", "memory": "GB"})
    save_schedule(db, "u", "1f1b(p=2, m=4)", workload=ms)
    save_schedule(db, "u", "1f1b(p=2, m=8)", workload=seconds, update=True)
    save_schedule(db, "u", "1f1b(p=2, m=8)", workload=dict(ms, units={"time": "ms", "memory": "MB"}), update=True)
    a, b = evaluate("1f1b(p=2, m=4)", ms).summary(), evaluate("1f1b(p=2, m=8)", seconds).summary()
    diff = diff_versions(db, "u@1", "u@2")  # ms against s: no time delta; the memory units agree
    assert diff.metrics["makespan"] == (a["makespan"], b["makespan"], None)
    assert diff.metrics["lower_bound"] == (a["lower_bound"], b["lower_bound"], None)
    assert diff.metrics["peak_memory"] == (max(a["peak_memory"]), max(b["peak_memory"]),
                                           max(b["peak_memory"]) - max(a["peak_memory"]))
    assert diff.metrics["bubble_ratio"] == (a["bubble_ratio"], b["bubble_ratio"],
                                            b["bubble_ratio"] - a["bubble_ratio"])  # a ratio has no unit
    assert diff.metrics["ops"][2] == b["ops"] - a["ops"]
    across_memory = diff_versions(db, "u@1", "u@3")  # GB against MB: time deltas, no memory delta
    assert across_memory.metrics["makespan"][2] is not None and across_memory.metrics["peak_memory"][2] is None
    unitless = diff_versions(db, "u@1", "u@1")
    assert unitless.metrics["makespan"][2] == 0
    save_schedule(db, "none", "1f1b(p=2, m=4)")  # the default workload declares no units
    assert diff_versions(db, "none@1", "u@1").metrics["makespan"][2] is None
    # The CLI prints no change ("-", saying why, as the app does) for it, and null in its JSON.
    from mpipe_cli.main import main

    assert main(["library", "diff", "u@1", "u@2", "--db", db_url]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("makespan")]
    assert row.endswith(" - (the workloads' units differ)")
    assert main(["library", "diff", "u@1", "u@2", "--json", "--db", db_url]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["makespan"]["delta"] is None


def test_saved_workloads_are_versioned_and_referenced(db, tmp_path):
    info = save_workload(db, "vit", "vit-heavy-small", message="from preset")
    assert info.ref == "vit@1" and info.body["encoders"]
    with pytest.raises(DuplicateNameError, match="workload 'vit' already exists"):
        save_workload(db, "vit", "uniform")
    changed = dict(info.body, name="vit-edited")
    assert save_workload(db, "vit", changed, update=True).ref == "vit@2"
    version = save_schedule(db, "uses", "1f1b(p=2, m=4)", workload="saved:vit@1")
    assert version.workload_label == "saved:vit@1" and version.workload == info.body
    assert save_schedule(db, "uses", "1f1b(p=2, m=4)", workload="saved:vit", update=True).workload == changed
    assert [w.ref for w in list_workloads(db)] == ["vit@2"]
    assert get_workload(db, "vit@1").body == info.body
    with pytest.raises(NotFoundError, match="no saved workload named 'nope'"):
        save_schedule(db, "x", "1f1b(p=2, m=4)", workload="saved:nope")
    with pytest.raises(MpipeError, match="no such file or preset"):
        save_schedule(db, "x", "1f1b(p=2, m=4)", workload="no-such-preset")
    assert [s.name for s in list_schedules(db)] == ["uses"]
