"""Before/after, library, runs and compare pages, driven through AppTest
against a temporary database (runs get synthetic timings: no torch here)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from app_helpers import (bars_by_trace, button, errors, figure, metric, op_bar_count, open_page, shown, start_app,
                         table_of)

from mpipe_core.api import evaluate
from mpipe_core.compare import compare
from mpipe_core.workloads.units import human
from storage import (
    add_timings,
    claim_next_run,
    dump_library,
    enqueue,
    expire_leases,
    export_library,
    finish_run,
    get_run,
    list_runs,
    list_schedules,
    save_schedule,
)

# Library and runs pages also run against PostgreSQL (marked below); the rest on SQLite.
pytestmark = pytest.mark.databases("sqlite")
BOTH = pytest.mark.databases("sqlite", "postgresql")

BEFORE = "1f1b(p=4, m=4)"
AFTER = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"


def synthetic_timings(term: str, workload, steps: int, *, ms_per_unit: float = 1.0, gap_s: float = 0.01,
                      dispatch_s: float = 0.0):
    """What a worker would record: the simulated timeline, in seconds, step after step;
    `dispatch_s`: each op starts that much later (and ends as simulated), a dispatch gap."""
    ev = evaluate(term, workload)
    span = ev.timeline.makespan * ms_per_unit / 1000 + gap_s
    rows = []
    for step in range(steps):
        for r in ev.timeline.records():
            rows.append(r._replace(step=step, start=100.0 + step * span + r.start * ms_per_unit / 1000 + dispatch_s,
                                   end=100.0 + step * span + r.end * ms_per_unit / 1000))
    return ev, rows


# --- before / after ------------------------------------------------------------------------

def test_before_after_defaults_to_the_designer_term_and_its_baseline(db_url):
    at = open_page(start_app(), "before_after")
    assert not at.exception and not errors(at)
    assert at.text_input(key="ba.before").value == BEFORE
    assert at.text_input(key="ba.after").value == AFTER
    rows = compare([BEFORE, AFTER], "vit-heavy-small")
    b, a = rows[0].evaluation.summary(), rows[1].evaluation.summary()
    assert metric(at, "Makespan after") == human(a['makespan']) == "44.06"
    assert metric(at, "Speedup") == f"{b['makespan'] / a['makespan']:.3g}x" == "1.23x"
    fig = figure(at, 0)
    assert fig["layout"]["xaxis"]["matches"] == "x2"  # one shared time axis
    assert op_bar_count(fig) == b["ops"] + a["ops"]
    # The verdict and its cost breakdown are the core's.
    assert [shown(s.value) for s in at.success] == [  # the fit first (unknown here), then the saving
        f"{AFTER}: the device's memory is unknown (the workload states none), so whether it fits is not checked  \n"
        f"{rows[1].transpose.verdict()}"]
    # Its arithmetic, term by term: idle filled − work added = saved, per device.
    costs = rows[1].transpose
    table = at.dataframe[-1].value
    assert list(table["term"]) == ["idle time filled", "work added: recompute", "work added: broadcast",
                                   "work added: all-reduce", "= saved (baseline − transposed makespan)"]
    assert list(table["per device"]) == ["+" + human(costs.idle_filled), "0", "0", "0", "+" + human(costs.saved)]
    assert human(costs.saved) == human(b["makespan"] - a["makespan"]) == "10.24"
    # Where the encoder ops moved: all on dev 0 before, spread after.
    moved = at.dataframe[1].value
    assert list(moved["ops before"]) == [4, 0, 0, 0]
    assert all(n > 0 for n in moved["ops after"])


def test_before_after_follows_the_designer_and_reports_errors(db_url):
    at = start_app()
    at.text_area(key="designer.term").input("zbv(p=4, m=8)").run()
    open_page(at, "before_after")
    assert at.text_input(key="ba.before").value == "zbv(p=4, m=8)"
    assert at.text_input(key="ba.after").value == "transpose(zbv(p=4, m=8), mode=dynamic)"
    at.text_input(key="ba.after").input("transpose(zbv(p=4, m=8), mode=sideways)").run()
    assert errors(at)[0].startswith("After: line 1, column 26: transpose: argument 'mode' must be one of")
    at.text_input(key="ba.after").input("zbv(p=4, m=8)").run()
    assert [i.value for i in at.info][-1].startswith("Neither term is `transpose(...)`")


# --- library -------------------------------------------------------------------------------

@BOTH
def test_library_versions_diff_fork_tag_archive(db, db_url):
    save_schedule(db, "vit", BEFORE, workload="vit-heavy-small", tags=["baseline"], author="ann")
    save_schedule(db, "vit", AFTER, workload="vit-heavy-small", update=True, message="transpose it",
                  author="bob")
    save_schedule(db, "plain", "zbv(p=4, m=8)", author="bob")
    at = open_page(start_app(), "library")
    assert not at.exception
    assert list(at.dataframe[0].value["name"]) == ["plain", "vit"]
    at.selectbox(key="lib.selected").select("vit").run()
    assert list(at.dataframe[1].value["version"]) == [2, 1]
    # Diff of the two versions: terms and metrics.
    diff_code = [c.value for c in at.code if c.language == "diff"]
    assert diff_code and f"+{AFTER}" in diff_code[0] and f"-{BEFORE}" in diff_code[0]
    metrics = at.dataframe[2].value
    row = metrics[metrics["metric"] == "makespan"].iloc[0]
    before_ms, after_ms = (evaluate(t, "vit-heavy-small").timeline.makespan for t in (BEFORE, AFTER))
    assert (row["vit@1"], row["vit@2"], row["change"]) == (human(before_ms), human(after_ms),
                                                          human(after_ms - before_ms))
    # Search by author and tag.
    at.text_input(key="lib.author").input("ann").run()
    assert list(at.dataframe[0].value["name"]) == ["vit"]
    at.text_input(key="lib.author").input("").run()
    at.text_input(key="lib.tag").input("baseline").run()
    assert list(at.dataframe[0].value["name"]) == ["vit"]
    at.text_input(key="lib.tag").input("").run()
    # Fork version 1.
    at.selectbox(key="lib.selected").select("vit").run()
    at.selectbox(key="lib.fork_source").select("vit@1")
    at.text_input(key="lib.fork_name").input("vit-fork")
    button(at, "Fork").click().run()
    assert "Forked vit@1 into vit-fork@1" in [shown(s.value) for s in at.success]
    # The list shows the fork at once (it used to need a reload), and the fork is selected.
    assert list(at.dataframe[0].value["name"]) == ["plain", "vit", "vit-fork"]
    assert at.selectbox(key="lib.selected").value == "vit-fork"
    at.selectbox(key="lib.selected").select("vit").run()
    # Tag, then archive and restore.
    at.text_input(key="lib.tags_add").input("vision, p4")
    button(at, "Apply").click().run()
    assert "Tags of vit: baseline, p4, vision" in [shown(s.value) for s in at.success]
    button(at, "Archive vit").click().run()
    assert "vit" not in list(at.dataframe[0].value["name"])
    at.checkbox(key="lib.archived").check().run()
    assert "vit (archived)" in list(at.dataframe[0].value["name"])
    at.selectbox(key="lib.selected").select("vit").run()
    button(at, "Restore vit").click().run()
    assert {s.name: s.archived for s in list_schedules(db, include_archived=True)}["vit"] is False


def test_a_library_diff_across_workload_units_shows_no_time_change_and_says_why(db, db_url):
    # Storage's diff gives no change for a time across units; the page says why.
    ms = {"units": {"time": "ms", "memory": "GB"}, "llm": {"layers": 4, "f": 1.0, "b": 1.0, "w": 1.0,
                                                             "activation": 1.0}}
    save_schedule(db, "units", "1f1b(p=2, m=4)", workload=ms)
    save_schedule(db, "units", "1f1b(p=2, m=4)", workload=dict(ms, units={"time": "s", "memory": "GB"}),
                  update=True)
    at = open_page(start_app(), "library")
    at.selectbox(key="lib.selected").select("units").run()
    assert not at.exception
    metrics = at.dataframe[2].value
    changes = dict(zip(metrics["metric"], metrics["change"]))
    assert changes["makespan"] == changes["lower bound"] == "– (the workloads' units differ)"
    assert changes["peak memory (max)"] == "0 GB"  # the same memory units: a change
    assert changes["bubble ratio"] == "+0.0 pp"


MARKUP = "![pixel](http://example.invalid/p.png) [click](http://example.invalid/x) **bold** <b>tag</b>"


def _markdown_bodies(at) -> list[str]:
    """The body of every element the browser renders as Markdown."""
    kinds = ("markdown", "caption", "title", "header", "subheader", "success", "info", "warning", "error")
    return [e.value for kind in kinds for e in at.get(kind)]


@BOTH
def test_user_text_is_plain_text_never_markup(db, db_url, tmp_path):
    """An imported description with an image or a link, a markup author and a tag are
    shown as typed: no Markdown element carries them unescaped, the description is
    plain text, and a chart title shows the workload name as text, not HTML."""
    from storage import import_library, open_database, read_library_file

    other = open_database(f"sqlite:///{tmp_path / 'other.db'}")
    save_schedule(other, "pix", BEFORE, description=MARKUP, author="[me](http://example.invalid)",
                  tags=["a_b"], message="**new**")
    path = tmp_path / "lib.json"
    path.write_text(dump_library(export_library(other)))
    other.close()
    import_library(db, read_library_file(path))
    at = open_page(start_app(), "library")
    assert not at.exception
    at.selectbox(key="lib.selected").select("pix").run()
    assert MARKUP in [t.value for t in at.text]  # the description, as plain text
    bodies = _markdown_bodies(at)
    assert not any("](" in b or "<b>" in b or "**" in b for b in bodies), bodies
    # ...while what they say is still there, readable.
    assert any(shown(b) == "by [me](http://example.invalid), 1 version(s), tags: a_b" for b in bodies), bodies
    # The Description tab: what it saves shows as typed, and so does its notice.
    at.text_area(key="lib.description.pix").input(MARKUP + " (edited)")
    button(at, "Save description").click().run()
    assert not at.exception and not errors(at)
    assert MARKUP + " (edited)" in [t.value for t in at.text]
    bodies = _markdown_bodies(at)
    assert not any("](" in b or "<b>" in b or "**" in b for b in bodies), bodies
    assert "Description of pix saved" in [shown(s.value) for s in at.success]
    # A workload named with HTML: the Designer's chart title escapes it.
    at = start_app()
    at.text_area(key="designer.term").input("1f1b(p=2, m=2)").run()
    at.radio(key="wl.source").set_value("JSON").run()
    at.text_area(key="wl.json").input('{"name": "<a href=\'http://example.invalid\'>w</a>"}').run()
    assert not errors(at), errors(at)
    title = figure(at, 0)["layout"]["title"]["text"]
    assert "<a" not in title and "&lt;a href='http://example.invalid'&gt;w&lt;/a&gt;" in title


def test_library_open_in_designer(db, db_url):
    save_schedule(db, "z", "zbv(p=4, m=8)", workload="vit-heavy-small")
    at = open_page(start_app(), "library")
    button(at, "Open in the Designer").click().run()
    assert not at.exception
    assert at.text_area(key="designer.term").value == "zbv(p=4, m=8)"
    assert at.selectbox(key="wl.preset").value == "vit-heavy-small"
    assert metric(at, "Makespan") == human(evaluate('zbv(p=4, m=8)', 'vit-heavy-small').timeline.makespan)


@BOTH
def test_library_import_and_two_sessions_share_it(db, db_url, tmp_path):
    from storage import open_database

    other = open_database(f"sqlite:///{tmp_path / 'other.db'}")
    save_schedule(other, "imported", AFTER, workload="vit-heavy-small", tags=["x"])
    text = dump_library(export_library(other))
    other.close()
    alice = open_page(start_app(), "library")
    bob = open_page(start_app(), "library")
    # The uploader tells the limit the import enforces, not Streamlit's default 200 MB.
    assert alice.file_uploader(key="lib.upload").proto.max_upload_size_mb == 64
    alice.file_uploader(key="lib.upload").upload("lib.json", text.encode(), "application/json").run()
    button(alice, "Import").click().run()
    assert [shown(s.value) for s in alice.success] == ["Imported 1 schedule(s) and 0 workload(s)."]
    bob.run()  # another browser session on the same database sees it
    assert list(bob.dataframe[0].value["name"]) == ["imported"]
    # Importing it again is refused, with the storage layer's reason.
    alice.file_uploader(key="lib.upload").upload("lib.json", text.encode(), "application/json").run()
    button(alice, "Import").click().run()
    assert "imported" in errors(alice)[0]
    # A file that is not JSON.
    alice.file_uploader(key="lib.upload").upload("bad.json", b"{nope", "application/json").run()
    button(alice, "Import").click().run()
    assert errors(alice) == ["bad.json:1:2: not valid JSON: Expecting property name enclosed in double quotes"]


# --- runs ----------------------------------------------------------------------------------

@BOTH
def test_launch_a_run_then_it_is_queued_and_can_be_cancelled(db, db_url):
    save_schedule(db, "t2", "transpose(1f1b(p=2, m=4), mode=dynamic)", workload="vit-heavy-small")
    at = open_page(start_app(), "runs")
    assert not at.exception
    assert [i.value for i in at.info] == ["No runs yet."]
    assert at.number_input(key="runs.nproc.t2@1").value == 2
    at.number_input(key="runs.steps").set_value(2)
    button(at, "Launch").click().run()
    assert not at.exception
    [run] = list_runs(db)
    assert (run.ref, run.status, run.nproc, run.steps, run.backend) == ("t2@1", "queued", 2, 2, "gloo")
    assert [shown(s.value) for s in at.success] == [f"Queued run #{run.id} of t2@1"]
    table = at.dataframe[0].value
    assert list(table["run"]) == [run.id] and list(table["status"]) == ["queued"]
    assert metric(at, "Status") == "queued"
    assert "Queued: waiting for a worker to claim it." in [i.value for i in at.info]
    assert at.get("progress")[0].proto.text == "0 of 40 op timings recorded"
    # A device count that does not match is refused inline.
    at.number_input(key="runs.nproc.t2@1").set_value(3)
    button(at, "Launch").click().run()
    assert "runs on 2 devices" in errors(at)[0]
    # Options follow the worker's rules: refused at once, nothing queued.
    at.number_input(key="runs.nproc.t2@1").set_value(2)
    for text, message in [("timeout_s=NaN", "run option timeout_s: expected a finite number in (0, 604800], got nan"),
                          ("bogus=1", "unknown run option 'bogus'"), ("lr", "option 'lr': expected KEY=VALUE")]:
        at.text_input(key="runs.options").input(text)
        button(at, "Launch").click().run()
        assert errors(at)[0].startswith(message), errors(at)
    assert len(list_runs(db)) == 1
    at.text_input(key="runs.options").input("check_grads=true, lr=0.05")
    button(at, "Launch").click().run()
    assert list_runs(db)[0].options == {"check_grads": True, "lr": 0.05}
    at.selectbox(key="runs.selected").set_value(run.id).run()
    button(at, "Cancel this run").click().run()
    assert get_run(db, run.id).status == "cancelled"
    assert metric(at, "Status") == "cancelled"


@BOTH
def test_a_running_run_fills_in_then_shows_measured_vs_predicted(db, db_url):
    term = "transpose(1f1b(p=2, m=4), mode=dynamic)"
    save_schedule(db, "t2", term, workload="vit-heavy-small")
    run = enqueue(db, "t2", steps=3)
    claim_next_run(db, "test-worker", 60)
    # every op waits 0.05 ms before it starts: a dispatch gap the comparison fits
    ev, rows = synthetic_timings(term, "vit-heavy-small", 3, ms_per_unit=0.5, dispatch_s=0.05e-3)
    per_step = len(ev.timeline)
    add_timings(db, run.id, rows[:per_step])
    at = open_page(start_app(), "runs")
    assert metric(at, "Status") == "running"
    assert op_bar_count(figure(at, 0)) == per_step
    add_timings(db, run.id, rows[per_step:])
    at.run()  # what the fragment's timer does in the browser
    assert op_bar_count(figure(at, 0)) == 3 * per_step
    assert at.get("progress")[0].proto.text == f"{3 * per_step} of {3 * per_step} op timings recorded"
    finish_run(db, run.id, "test-worker", "succeeded", exit_code=0, log_tail="all good\n")
    at.run()
    assert not at.exception and not errors(at)
    assert metric(at, "Status") == "succeeded"
    # Measured == simulated x 0.5 ms here; the default prediction is the run's own workload's.
    measured = float(metric(at, "Measured makespan (mean of steps 1, 2)").removesuffix(" ms").replace(",", ""))
    assert measured == pytest.approx(ev.timeline.makespan * 0.5, rel=0.05)
    overlay = figure(at, 0)
    names = bars_by_trace(overlay)
    assert sum(n for k, n in names.items() if k.startswith("measured")) == per_step
    assert sum(n for k, n in names.items() if k.startswith("predicted")) == per_step
    devices = at.dataframe[1].value
    assert list(devices["device"]) == [0, 1]
    explained = at.dataframe[3].value  # the gap by cause: its differences add up to the gap
    assert "critical path elsewhere" in list(explained["cause"])
    ms = lambda text: float(text.removesuffix(" ms").replace(",", ""))  # noqa: E731 - "1,234.5 ms" -> 1234.5
    gap = ms(metric(at, "Measured makespan (mean of steps 1, 2)")) - ms(metric(at, "Predicted makespan"))
    assert sum(ms(x) for x in explained["difference"]) == pytest.approx(gap, abs=0.05)
    # The run's fitted dispatch gap (the caption's) is taken out of every computing op on the path and
    # counted as dispatch: the dispatch row's prediction is that gap times the path's ops.
    caption = next(shown(c.value) for c in at.caption if "mean dispatch gap between ops (" in shown(c.value))
    overhead = ms(caption.split("mean dispatch gap between ops (")[1].split(")")[0])
    assert 0.04 < overhead <= 0.05  # each device's first op starts the step: no gap before it
    by_cause = {row["cause"]: row for _, row in explained.iterrows()}
    path_ops = sum(float(row["path ops"]) for cause, row in by_cause.items() if cause.startswith("op:"))
    side = next(c for c in explained.columns if c not in ("cause", "path ops", "measured", "difference",
                                                         "of which contention"))
    assert ms(by_cause["dispatch"][side]) == pytest.approx(overhead * path_ops, rel=2e-3)
    assert "all good" in at.code[-1].value
    # Against another term.
    at.text_input(key=f"runs.against.{run.id}").input("1f1b(p=2, m=4)").run()
    assert any("Against term 1f1b(p=2, m=4), simulated" in shown(c.value) for c in at.caption)
    at.text_input(key=f"runs.against.{run.id}").input("1f1b(p=2, m=").run()
    assert errors(at)[0].startswith("line 1, column 13: expected")


@BOTH
def test_failed_and_lost_runs_show_their_error_and_log_tail(db, db_url):
    save_schedule(db, "t", "1f1b(p=2, m=2)")
    failed = enqueue(db, "t")
    claim_next_run(db, "w1", 60)
    finish_run(db, failed.id, "w1", "failed", exit_code=1, error="rank 1 raised RuntimeError at 0F1: boom",
               log_tail="starting ranks\nRuntimeError: boom\n")
    lost = enqueue(db, "t")
    claim_next_run(db, "w2", 60)
    assert expire_leases(db, now=get_run(db, lost.id).lease_expires_at + timedelta(seconds=1)) == [lost.id]
    at = open_page(start_app(), "runs")
    assert not at.exception
    assert list(at.dataframe[0].value["status"]) == ["lost", "failed"]
    assert metric(at, "Status") == "lost"
    assert errors(at) == ["lease expired: worker w2 stopped heartbeating"]
    assert "The run ended lost without recording timings." in [i.value for i in at.info]
    at.selectbox(key="runs.selected").set_value(failed.id).run()
    assert metric(at, "Status") == "failed"
    assert errors(at) == ["rank 1 raised RuntimeError at 0F1: boom"]
    assert at.code[-1].value == "starting ranks\nRuntimeError: boom"  # the log tail, trailing newline dropped
    # Compare: a run without timings is reported inline; the page still draws.
    at = open_page(start_app(), "compare")
    at.multiselect(key="cmp.runs").select(failed.id).run()
    assert not at.exception
    assert errors(at) == [f"run #{failed.id}: run {failed.id} (failed) has no timings"]


# --- compare -------------------------------------------------------------------------------

def test_compare_terms_versions_and_runs(db, db_url):
    save_schedule(db, "zb", "zb_h1(p=4, m=8)", workload="vit-heavy-small")
    term = "1f1b(p=2, m=2)"
    save_schedule(db, "small", term)
    run = enqueue(db, "small", steps=2)
    claim_next_run(db, "w", 60)
    _, rows = synthetic_timings(term, None, 2)
    add_timings(db, run.id, rows)
    finish_run(db, run.id, "w", "succeeded")

    at = open_page(start_app(), "compare")
    assert not at.exception and not errors(at)
    table = at.dataframe[0].value
    assert list(table["schedule"]) == [BEFORE, "transpose(1f1b(p=4, m=4))", AFTER]
    expected = [evaluate(t, "vit-heavy-small").timeline.makespan
                for t in (BEFORE, "transpose(1f1b(p=4, m=4))", AFTER)]
    assert list(table["makespan"]) == [human(x) for x in expected]
    assert table["speedup vs first"][2] == f"{expected[0] / expected[2]:.3g}x"
    at.multiselect(key="cmp.versions").select("zb@1").run()
    table = at.dataframe[0].value
    assert list(table["schedule"])[-1] == "zb@1"
    fig = figure(at, 0)
    assert sum(1 for k in fig["layout"] if k.startswith("xaxis")) == 4  # four panels, one axis
    at.multiselect(key="cmp.runs").select(run.id).run()
    assert not errors(at)
    runs_table = table_of(at, "run")
    assert list(runs_table["run"]) == [f"#{run.id}"]
    assert float(runs_table["measured makespan (mean of steps)"][0].split(" ms")[0]) == pytest.approx(
        evaluate(term).timeline.makespan, rel=0.05)
    # A bad line is reported with its line number; the others still draw.
    at.text_area(key="cmp.terms").input("1f1b(p=4, m=4)\nzbv(p=4,").run()
    assert errors(at)[0].startswith("Term on line 2: line 1, column 9")
    assert list(at.dataframe[0].value["schedule"]) == [BEFORE, "zb@1"]


@pytest.mark.parametrize("page", ["library", "runs", "compare", "before_after"])
def test_every_page_without_a_database_says_so(monkeypatch, tmp_path, page):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MPIPE_DB_URL", f"sqlite:///{blocker}/sub/app.db")
    at = open_page(start_app(), page)
    assert not at.exception
    said = errors(at) + [shown(e.value) for e in [*at.warning, *at.info]]
    if page == "before_after":  # works on terms alone and never opens the database
        assert not errors(at) and at.get("plotly_chart")
    else:
        assert any(m.startswith("Cannot open the database: cannot create") for m in said), said


def test_pages_without_a_database_explain_it(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MPIPE_DB_URL", f"sqlite:///{blocker}/sub/app.db")
    at = start_app()
    assert not at.exception
    assert any("designing still works" in shown(w.value) for w in at.warning)
    assert metric(at, "Makespan") == f"{evaluate(AFTER, 'vit-heavy-small').timeline.makespan:.4g}"
    open_page(at, "library")
    assert not at.exception
    assert errors(at)[0].startswith("Cannot open the database: cannot create")
