"""What a newcomer found wrong in the app (issue 14), each driven through
AppTest or the figure JSON the browser receives."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from app_helpers import REPO, array, button, errors, figure, metric, open_page, shown, start_app

from mpipe_core.api import evaluate
from mpipe_core.formats.export import export_text
from mpipe_core.workloads.presets import preset_document
from mpipe_core.workloads.units import quantity
from storage import (
    add_timings,
    claim_next_run,
    enqueue,
    finish_run,
    list_runs,
    list_workloads,
    save_schedule,
)

TERM = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"


def synthetic_timings(term: str, workload, steps: int, *, stretch: list[float]):
    """Timings a worker would record (seconds): step k is the simulated
    timeline stretched by `stretch[k]` ms per unit, so every step differs."""
    ev = evaluate(term, workload)
    rows, t0 = [], 100.0
    for step in range(steps):
        scale = stretch[step] / 1000
        rows += [r._replace(step=step, start=t0 + r.start * scale, end=t0 + r.end * scale)
                 for r in ev.timeline.records()]
        t0 += ev.timeline.makespan * scale + 0.01
    return ev, rows


def finished_run(db, term: str, steps: int, stretch: list[float], name: str = "t2"):
    save_schedule(db, name, term, workload="vit-heavy-small")
    run = enqueue(db, name, steps=steps)
    claim_next_run(db, "w", 60)
    ev, rows = synthetic_timings(term, "vit-heavy-small", steps, stretch=stretch)
    add_timings(db, run.id, rows)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    return run, ev


def hover_rows(trace: dict) -> np.ndarray:
    return array(trace["customdata"]).reshape(len(array(trace["x"])), -1)


# --- 1. tooltips -----------------------------------------------------------------------------

def test_gantt_tooltips_give_the_duration_as_end_minus_start_and_name_the_device_once(db_url):
    at = start_app()
    fig = figure(at, 0)
    # (the hatch key's legend entries draw no bars)
    ops = [t for t in fig["data"] if t["name"] != "idle (bubble)" and t.get("visible") != "legendonly"]
    assert ops
    for trace in ops:
        data = hover_rows(trace)
        start, end, duration = data[:, 3], data[:, 4], data[:, 5]
        assert np.allclose(duration, end - start) and np.allclose(array(trace["base"]) + array(trace["x"]), end)
        assert "duration %{customdata[5]" in trace["hovertemplate"] and "%{x" not in trace["hovertemplate"]
        assert np.array_equal(data[:, 6], array(trace["y"]))  # "on dev %{customdata[6]}" is the row's device
    # Bars of a step that start late: the duration must not equal the end.
    late = [t for t in ops if (hover_rows(t)[:, 3] > 0).any()]
    assert any(not np.allclose(hover_rows(t)[:, 5], hover_rows(t)[:, 4]) for t in late)
    [idle] = [t for t in fig["data"] if t["name"] == "idle (bubble)"]
    data = hover_rows(idle)
    assert np.allclose(data[:, 2], data[:, 1] - data[:, 0])
    assert idle["hovertemplate"].startswith("idle on dev %{customdata[3]}<br>")
    assert np.array_equal(data[:, 3], array(idle["y"]))


# --- 2. measured vs predicted ----------------------------------------------------------------

def test_measured_vs_predicted_shows_the_chosen_step_and_its_tables_agree_with_the_chart(db, db_url):
    term = "transpose(1f1b(p=2, m=4), mode=dynamic)"
    run, ev = finished_run(db, term, 3, stretch=[2.0, 0.5, 1.0])  # step 0 warm-up; steps 1, 2 used
    at = open_page(start_app(), "runs")
    assert not at.exception and not errors(at)
    assert at.radio(key=f"runs.view.{run.id}").options == ["mean of steps 1, 2", "one step"]

    def drawn(fig: dict) -> dict[tuple, float]:
        out = {}
        for t in fig["data"]:
            if t["name"].startswith("measured"):
                data = hover_rows(t)
                for chunk, mb, dur, dev in zip(data[:, 0], data[:, 1], data[:, 5], data[:, 6]):
                    out[(t["name"].split()[1], t["name"].split()[2], int(chunk), int(mb))] = dur
        return out

    for label, per_unit in (("step 1", 0.5), ("step 2", 1.0), ("mean of steps 1, 2", 0.75)):
        if label.startswith("mean"):
            at.radio(key=f"runs.view.{run.id}").set_value("mean").run()
        else:
            at.radio(key=f"runs.view.{run.id}").set_value("one step").run()
            at.select_slider(key=f"runs.step.{run.id}").set_value(int(label.split()[1])).run()
        assert metric(at, f"Measured makespan ({label.replace('step 1', 'step 1')})") == quantity(
            ev.timeline.makespan * per_unit, "ms")
        fig = figure(at, 0)
        assert fig["layout"]["title"]["text"].startswith(f"Measured {label}")
        bars = drawn(fig)
        assert len(bars) == len(ev.timeline)
        # Every op's bar is the simulated duration x this step's ms per unit ...
        for op, d, s, e in ev.timeline.rows():
            assert bars[(op.module, op.kind, op.chunk, op.mb)] == pytest.approx((e - s) * per_unit)
        # ... and the table of ops shows those same bars' durations.
        ops = at.dataframe[2].value
        for name, device, shown in zip(ops["op"], ops["device"], ops["measured"]):
            module, rest = name.split(":")
            match = [v for (m, k, c, mb), v in bars.items()
                     if m == module and f"{c}{k}{mb if mb >= 0 else ''}" == rest]
            assert shown == quantity(match[0], "ms")
        busy = at.dataframe[1].value["measured busy"]
        for d in range(2):
            expected = sum((e - s) * per_unit for _, dd, s, e in ev.timeline.rows() if dd == d)
            assert busy[d] == quantity(expected, "ms")


def test_comparing_two_runs_labels_the_other_side_as_a_run(db, db_url):
    run, _ = finished_run(db, "1f1b(p=2, m=2)", 2, stretch=[1.0, 1.0], name="a")
    other, _ = finished_run(db, "1f1b(p=2, m=2)", 2, stretch=[2.0, 2.0], name="b")
    at = open_page(start_app(), "runs")
    at.selectbox(key="runs.selected").select(run.id).run()
    at.text_input(key=f"runs.against.{run.id}").input(str(other.id)).run()
    names = {t["name"] for t in figure(at, 0)["data"]}
    assert any(n.startswith("other run ") for n in names) and not any(n.startswith("predicted") for n in names)


# --- 3. units and numbers --------------------------------------------------------------------

def test_millisecond_workloads_show_ms_and_memory_units_everywhere(db_url):
    at = start_app()
    at.selectbox(key="wl.preset").select("llava-7b").run()
    assert not at.exception and not errors(at)
    ev = evaluate(TERM, "llava-7b")
    assert metric(at, "Makespan") == quantity(ev.timeline.makespan, "ms") == "2,173 ms"
    assert metric(at, "Peak memory (max)").endswith(" GB")
    gantt, idle, memory = figure(at, 0), figure(at, 1), figure(at, 2)
    assert gantt["layout"]["xaxis"]["title"]["text"] == "time (ms)"
    assert all(" ms<extra>" in t["hovertemplate"] for t in gantt["data"] if t.get("visible") != "legendonly")
    assert idle["layout"]["yaxis"]["title"]["text"] == "ms"
    assert memory["layout"]["yaxis"]["title"]["text"] == "memory (GB)"  # static + activations
    assert "Units: time in ms, memory in GB" in [c.value for c in at.caption]
    assert not any("e+" in m.value for m in at.metric)


def test_a_tiny_saving_shows_its_digits_and_the_verdict_adds_up(db_url):
    at = start_app()
    at.selectbox(key="wl.preset").select("llava-7b").run()
    at = open_page(at, "before_after")
    assert not at.exception and not errors(at)
    [verdict] = [shown(s.value) for s in at.success]
    fit, verdict = verdict.split("  \n")
    assert fit.startswith(f"{TERM} fits in ")
    assert verdict.startswith("transpose saves 0.1% (1.772 ms of 2,175 ms): per device it filled 1.772 ms of "
                              "idle time and added 0 ms of work: 1.772 − 0 = 1.772 saved.")
    [delta] = [m.delta for m in at.metric if m.label == "Makespan after"]
    assert delta == "-1.772 ms (-0.1%)"


# --- 4. launching ----------------------------------------------------------------------------

def test_launching_is_a_click_and_a_repeat_asks_first(db, db_url):
    save_schedule(db, "t2", "1f1b(p=2, m=2)", workload="vit-heavy-small")
    at = open_page(start_app(), "runs")
    # Not a form: Enter in a field submits nothing.
    for widget in (at.number_input(key="runs.steps"), at.number_input(key="runs.nproc.t2@1")):
        assert widget.form_id == ""
    at.number_input(key="runs.steps").set_value(2).run()
    assert list_runs(db) == []
    button(at, "Launch").click().run()
    assert len(list_runs(db)) == 1
    button(at, "Launch").click().run()
    assert len(list_runs(db)) == 1  # not queued yet: it asks
    assert any(shown(w.value).startswith("An identical run (#1: t2@1, gloo × 2, 2 steps) was queued seconds ago")
               for w in at.warning)
    button(at, "Launch again").click().run()
    assert len(list_runs(db)) == 2
    # Other run options make another run, not a repeat: queued at once, with its options.
    at.text_input(key="runs.options").input("lr=0.05")
    button(at, "Launch").click().run()
    assert len(list_runs(db)) == 3
    assert list_runs(db)[0].options == {"lr": 0.05}


# --- 6. no command-line flags in the app -------------------------------------------------------

def test_refusals_name_the_apps_controls_not_cli_flags(db, db_url):
    save_schedule(db, "dup", "1f1b(p=2, m=2)")
    at = start_app()
    at.text_input(key="designer.save_name").input("dup")
    button(at, "Save").click().run()
    assert errors(at) == ["schedule 'dup' already exists; tick “new version” to add a version to it, "
                          "or choose another name"]
    at = open_page(at, "runs")
    at.number_input(key="runs.nproc.dup@1").set_value(3)
    button(at, "Launch").click().run()
    assert errors(at) == ["dup@1 runs on 2 devices; set Devices to 2."]
    assert not any("--" in e for e in errors(at))


# --- 7. library search and descriptions ------------------------------------------------------

def test_library_search_finds_terms_messages_and_descriptions(db, db_url):
    save_schedule(db, "alpha", "zbv(p=4, m=8)")
    save_schedule(db, "beta", "1f1b(p=2, m=2)")
    save_schedule(db, "beta", "1f1b(p=2, m=4)", update=True, message="more microbatches")
    at = open_page(start_app(), "library")
    for query, names in (("zb", ["alpha"]), ("MICROBATCHES", ["beta"]), ("1f1b", ["beta"])):
        at.text_input(key="lib.search").input(query).run()
        assert list(at.dataframe[0].value["name"]) == names, query
    at.text_input(key="lib.search").input("").run()
    at.selectbox(key="lib.selected").select("alpha").run()
    at.text_area(key="lib.description.alpha").input("zero bubble, V shape, for the p=4 rig")
    button(at, "Save description").click().run()
    assert "Description of alpha saved" in [shown(s.value) for s in at.success]
    at.text_input(key="lib.search").input("rig").run()
    table = at.dataframe[0].value
    assert list(table["name"]) == ["alpha"] and list(table["description"]) == ["zero bubble, V shape, for the p=4 rig"]


# --- 9. exports, links, calibration, the model ----------------------------------------------

def test_designer_offers_the_schedule_as_torch_csv_perfetto_and_json(db_url):
    at = start_app()
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download torch CSV", "Download Perfetto trace", "Download JSON"]
    text, _ = export_text(evaluate(TERM, "vit-heavy-small"), "chrome-trace")
    assert json.loads(text)["traceEvents"]  # the same function `mpipe export` uses


def test_runs_link_to_their_version_and_versions_to_their_runs(db, db_url):
    run, _ = finished_run(db, "1f1b(p=2, m=2)", 2, stretch=[1.0, 1.0])
    at = open_page(start_app(), "runs")
    links = {shown(link.proto.label): link.proto for link in at.get("page_link")}
    to_library = links["Schedule version t2@1 in the library"]
    assert to_library.page == "library" and "version=t2%401" in to_library.query_string
    assert any("Trains the executor's small model sized from the workload: 8 LLM layers, encoder vision (frozen)"
               in shown(c.value) for c in at.caption)
    at = open_page(at, "library")
    links = {shown(link.proto.label): link.proto for link in at.get("page_link")}
    assert links[f"run #{run.id} (succeeded)"].query_string == f"run={run.id}"


def test_calibrate_from_a_run_then_predict_with_the_saved_calibration(db, db_url):
    run, ev = finished_run(db, "1f1b(p=2, m=4)", 3, stretch=[1.0, 1.0, 1.0])
    at = open_page(start_app(), "runs")
    button(at, "Calibrate from this run").click().run()
    assert not errors(at)
    assert [w.ref for w in list_workloads(db)] == [f"cal-run-{run.id}@1"]
    assert any(shown(s.value).startswith(f"Saved workload cal-run-{run.id}@1: predicted") for s in at.success)
    at.selectbox(key=f"runs.workload.{run.id}").select(f"saved:cal-run-{run.id}@1").run()
    assert not errors(at)
    assert any(f"on workload saved:cal-run-{run.id}@1" in shown(c.value) for c in at.caption)


# --- 9. stopping a slow evaluation ----------------------------------------------------------

def test_a_slow_evaluation_runs_in_a_child_that_stopping_ends(monkeypatch):
    from app import evaluation

    class Interrupted(Exception):
        pass

    children = []

    def on_wait(seconds: float) -> None:
        import multiprocessing

        children.extend(multiprocessing.active_children())
        raise Interrupted  # what a rerun (the Stop button, a new term) does to the page's script

    with pytest.raises(Interrupted):
        evaluation._in_child("zbv(p=16, m=512)", json.dumps({}), on_wait)
    assert children and not any(c.is_alive() for c in children)
    # Uninterrupted, the child's answer is the core's.
    ev = evaluation._in_child("1f1b(p=2, m=2)", json.dumps({}), lambda s: None)
    assert ev.timeline.makespan == evaluate("1f1b(p=2, m=2)").timeline.makespan


def test_a_stopped_term_is_not_evaluated_again_until_asked(db_url, monkeypatch):
    from app import evaluation

    # A fresh cache: the term must not have been evaluated already (by this test on another database).
    monkeypatch.setattr(evaluation, "CACHE", evaluation.SharedCache(evaluation.CACHE_ENTRIES))
    at = start_app()
    key = evaluation.cache_key("zbv(p=4, m=16)", evaluation.choice_for(
        "vit-heavy-small", preset_document("vit-heavy-small"),
        "vit-heavy-small"))
    at.session_state["_evaluation.stopped"] = key
    at.text_area(key="designer.term").input("zbv(p=4, m=16)").run()
    assert any(shown(w.value).startswith("You stopped evaluating zbv(p=4, m=16).") for w in at.warning)
    assert not at.get("plotly_chart")
    button(at, "Evaluate it anyway").click().run()
    assert len(at.get("plotly_chart")) == 3


# --- speed: the cache and torch -------------------------------------------------------------

def test_evaluations_are_shared_across_sessions_by_canonical_term_and_workload_digest():
    from app import evaluation
    from mpipe_core.workloads.presets import preset_document

    preset = evaluation.choice_for("vit-heavy-small", preset_document("vit-heavy-small"), "vit-heavy-small")
    typed = evaluation.choice_for("inline", json.loads(json.dumps(preset_document("vit-heavy-small"))), {})
    first = evaluation.evaluate("1f1b(p=4, m=6)", preset)
    assert evaluation.evaluate("1f1b(m=6, p=4)", typed) is first  # another spelling, the same document


def test_the_app_never_imports_torch(tmp_path):
    script = f"""
import os, sys
sys.path.insert(0, {str(REPO / 'tests' / 'app')!r})
sys.path.insert(1, {str(REPO / 'tests')!r})
os.environ["MPIPE_DB_URL"] = "sqlite:///{tmp_path / 'app.db'}"
from app_helpers import open_page, start_app
at = start_app()
for page in ("before_after", "compare", "tune", "library", "runs"):
    open_page(at, page)
    assert not at.exception, page
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


# --- 10. visual problems --------------------------------------------------------------------

def test_many_devices_keep_the_memory_plot_and_interleaved_chunks_differ(db_url):
    from app.bars import from_timeline
    from app.figures import memory_figure, op_traces

    ev = evaluate("1f1b(p=12, m=32)")
    fig = memory_figure(ev.memory_over_time)
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1  # at the side, not above
    # ZB-V: device d holds chunks d and 2p-1-d; its higher chunk is hatched, drawn over the colour.
    traces = op_traces(from_timeline(evaluate("zbv(p=4, m=8)").timeline))
    forward = [t for t in traces if t.name == "llm F"][0]
    data = np.asarray(forward.customdata)
    chunks, devices = data[:, 0], data[:, 6]
    shapes = np.asarray(forward.marker.pattern.shape)
    assert set(shapes[chunks == devices]) == {""} and set(shapes[chunks == 7 - devices]) == {"\\"}
    assert forward.marker.pattern.fillmode == "overlay"
    assert forward.marker.line.width > 0  # back-to-back ops keep a visible edge
    # 1F1B: one chunk per device, so nothing is hatched (stage c is chunk c on device c).
    plain = [t for t in op_traces(from_timeline(evaluate("1f1b(p=4, m=4)").timeline)) if t.name == "llm F"][0]
    assert plain.marker.pattern is None or not plain.marker.pattern.shape


def test_workload_documents_open_expanded(db_url):
    at = start_app()
    assert at.json[0].proto.expanded is True
