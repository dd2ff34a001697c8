"""The app as a newcomer found it, second pass (issue 24): no silent failures, no
circular accuracy figure, shareable designs, errors and units where the eye is,
scale to 512 devices.  One test (or a few) per finding, through AppTest, the
figure JSON the browser receives, or the core the pages call."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from app_helpers import (MAIN, REPO, TIMEOUT_S, array, button, errors, figure, metric, open_page, shown, start_app,
                         table_of)
from streamlit.testing.v1 import AppTest

from mpipe_core.api import evaluate
from mpipe_core.workloads.units import human, quantity
from storage import add_timings, claim_next_run, enqueue, finish_run, save_schedule, save_workload
from bounds import EVENT_S

pytestmark = pytest.mark.databases("sqlite")
LANDING = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
WL = "vit-heavy-small"


def _finished_run(db, term: str, stretch: list[float], name: str = "r", workload=WL, busy: float = 1.0):
    """A finished run of `term` whose step k is the simulation stretched by `stretch[k]` ms per unit;
    each op computes for the first `busy` of its span (the rest shows as a gap before the next op)."""
    if not any(s.name == name for s in __import__("storage").list_schedules(db)):
        save_schedule(db, name, term, workload=workload)
    run = enqueue(db, name, steps=len(stretch))
    claim_next_run(db, "w", 60)
    ev = evaluate(term, workload)
    rows, t0 = [], 100.0
    for step, scale in enumerate(stretch):
        rows += [r._replace(step=step, start=t0 + r.start * scale / 1000,
                            end=t0 + (r.start + (r.end - r.start) * busy) * scale / 1000)
                 for r in ev.timeline.records()]
        t0 += ev.timeline.makespan * scale / 1000 + 0.01
    add_timings(db, run.id, rows)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    return run, ev


def _cli_error(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "mpipe_cli.main", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=EVENT_S)
    assert out.returncode == 2, out.stderr
    return out.stderr.strip().removeprefix("error: ")


def _parents_of(at, element_type: str) -> list[list[str]]:
    """For each element of `element_type` on the page, the types of the blocks it sits in."""
    found = []

    def walk(node, path):
        for child in getattr(node, "children", {}).values():
            kind = type(child).__name__
            if kind == element_type:
                found.append(path)
            walk(child, path + [kind])

    walk(at._tree, [])
    return found


# --- 1. exports that cannot express a schedule say so at the button --------------------------

def test_an_export_that_cannot_express_the_schedule_is_disabled_with_the_clis_reason(db_url):
    at = start_app()  # the landing page's transposed term
    buttons = {b.proto.label: b.proto for b in at.get("download_button")}
    cli = _cli_error("export", LANDING, "-w", WL, "--format", "torch-csv")
    assert buttons["Download torch CSV"].disabled
    assert shown(buttons["Download torch CSV"].help) == cli
    assert f"torch CSV: {cli}" in [shown(c.value) for c in at.caption]
    assert not buttons["Download Perfetto trace"].disabled and not buttons["Download JSON"].disabled
    # One source of truth: what the page shows is what the export raises, and nothing else refuses.
    from mpipe_core.formats.export import FORMATS, export_text, refusal

    ev = evaluate(LANDING, WL)
    for name in FORMATS:
        reason = refusal(ev, name)
        if reason is None:
            assert export_text(ev, name)[0]
        else:
            with pytest.raises(Exception, match="cannot express") as raised:
                export_text(ev, name)
            assert raised.value.message == reason


# --- 2. Runs: the run's own workload predicts; a fit is called a fit ------------------------

def test_runs_compare_with_the_runs_own_workload_by_default_and_label_a_fit_as_none(db, db_url):
    term = "1f1b(p=2, m=4)"
    run, ev = _finished_run(db, term, [3.0, 0.5, 0.5])
    at = open_page(start_app(), "runs")
    assert not at.exception and not errors(at)
    picker = at.selectbox(key=f"runs.workload.{run.id}")
    assert picker.value == "launched"
    assert picker.options[:2] == [f"the run's own: {WL} (a prediction)", "fit on this run (not a prediction)"]
    # The prediction is the saved workload's own (unitless: 1 unit read as 1 ms), not a fit.
    assert metric(at, "Predicted makespan") == quantity(ev.timeline.makespan, "ms")
    measured = ev.timeline.makespan * 0.5
    assert metric(at, "Prediction error") == f"{1 / 0.5 - 1:+.1%}"
    assert any(shown(w.value).startswith(f"{WL} (the run's own workload) declares no time unit: its costs are "
                                         f"read as milliseconds") for w in at.warning)
    # The fit is offered, and says what it is.
    picker.select("fit").run()
    assert metric(at, "Fit (not a prediction) makespan") == quantity(measured, "ms")
    assert any(i.value.startswith("Fit on this run: these costs were measured from this very run") for i in at.info)


def test_the_spread_of_steps_and_the_previous_run_stand_beside_the_error(db, db_url):
    term = "1f1b(p=2, m=4)"
    first, ev = _finished_run(db, term, [2.0, 1.0, 1.0])
    second, _ = _finished_run(db, term, [2.0, 1.0, 2.0, 3.0])  # steps 1..3 used: 1, 2, 3 ms per unit
    at = open_page(start_app(), "runs")  # the newest run is selected
    span = ev.timeline.makespan
    assert metric(at, "Run-to-run spread") == f"{(3 * span - span) / (2 * span):.1%}"
    [help_text] = [m.proto.help for m in at.metric if m.label == "Run-to-run spread"]
    assert f"{human(span)}–{quantity(3 * span, 'ms')}" in help_text
    [caption] = [shown(c.value) for c in at.caption if "Run-to-run spread" in shown(c.value)]
    assert (f"steps 1–3 of this run: min {quantity(span, 'ms')} · median {quantity(2 * span, 'ms')} · "
            f"max {quantity(3 * span, 'ms')}") in caption
    assert (f"the previous run of r@1 (#{first.id}) measured {quantity(span, 'ms')} "
            f"({span / (2 * span) - 1:+.1%} from this run's {quantity(2 * span, 'ms')})") in caption


def test_with_one_used_step_the_spread_is_no_number(db, db_url):
    from executor.analysis.compare_run import compare_run

    term = "1f1b(p=2, m=4)"
    run, ev = _finished_run(db, term, [1.5])
    cmp = compare_run(db, run.id)
    assert cmp.steps == [0] and len(cmp.step_makespans_ms) == 1 and cmp.spread is None
    at = open_page(start_app(), "runs")
    assert not at.exception and not errors(at), errors(at)
    assert metric(at, "Run-to-run spread") == "–"  # not 0.0%: one step shows no spread
    [caption] = [shown(c.value) for c in at.caption if "Run-to-run spread" in shown(c.value)]
    span = quantity(1.5 * ev.timeline.makespan, "ms")
    assert f"steps 0 of this run: min {span} · median {span} · max {span}; no earlier run" in caption
    assert "max − min" not in caption
    # Two used steps: the same number in the metric and the caption, from RunComparison.spread.
    again, _ = _finished_run(db, term, [2.0, 1.0, 1.5])
    cmp = compare_run(db, again.id)
    assert cmp.spread == pytest.approx(0.5 / 1.25)
    at = open_page(start_app(), "runs")
    assert metric(at, "Run-to-run spread") == f"{0.5 / 1.25:.1%}"
    [caption] = [shown(c.value) for c in at.caption if "Run-to-run spread" in shown(c.value)]
    assert f"(max − min = {0.5 / 1.25:.1%} of the median)" in caption


def test_the_caption_names_the_calibrations_dispatch_gap_not_the_runs(db, db_url):
    from executor.analysis.calibrate import calibrate_run
    from executor.analysis.compare_run import compare_run

    term = "1f1b(p=2, m=4)"
    first, _ = _finished_run(db, term, [1.0, 1.0, 1.0], busy=0.9)
    second, _ = _finished_run(db, term, [1.0, 3.0, 3.0], busy=0.5)
    cal = calibrate_run(db, first.id)
    save_workload(db, "cal-1", cal.workload)
    own_gap = compare_run(db, second.id).overhead_ms
    at = open_page(start_app(), "runs")
    at.selectbox(key=f"runs.workload.{second.id}").select("saved:cal-1@1").run()
    assert not errors(at)
    [caption] = [shown(c.value) for c in at.caption if shown(c.value).startswith("Against")]
    assert (f"Measured op times include this run's mean dispatch gap between ops ({quantity(own_gap, 'ms')}); "
            f"the workload's costs include the one it was calibrated with "
            f"({quantity(cal.overhead_ms, 'ms')})") in caption
    assert cal.overhead_ms != pytest.approx(own_gap)  # the two figures the old caption confused


def test_the_mean_of_steps_hovers_as_such_and_steps_are_drawn_apart_from_the_warm_up(db, db_url):
    term = "1f1b(p=2, m=4)"
    run, ev = _finished_run(db, term, [8.0, 1.0, 1.0])
    at = open_page(start_app(), "runs")
    overlay = figure(at, 0)
    measured = [t for t in overlay["data"] if t["name"].startswith("measured")]
    assert measured and all("mean of steps 1, 2<br>" in t["hovertemplate"] for t in measured)
    assert not any("step %{customdata[2]}" in t["hovertemplate"] for t in measured)
    # "Measured, all steps": steps 1 and 2 on their own scale with a line where step 2 starts,
    # and the warm-up step 0 in a chart of its own.
    charts = {figure(at, i)["layout"]["title"]["text"]: figure(at, i) for i in range(len(at.get("plotly_chart")))}
    main = charts["Measured: steps 1–2 after the warm-up (dashed lines: where each step starts)"]
    warm = charts["Warm-up step 0 (left out of every comparison)"]
    assert [a["text"] for a in main["layout"]["annotations"]] == ["start of step 1", "start of step 2"]
    [line] = main["layout"]["shapes"]
    step2 = ev.timeline.makespan * 1.0 + 10.0  # step 1's span plus the 10 ms between steps
    assert line["x0"] == pytest.approx(step2, rel=1e-6)
    assert {int(s) for t in warm["data"] for s in array(t["customdata"])[:, 2]} == {0}
    assert {int(s) for t in main["data"] for s in array(t["customdata"]).reshape(-1, 7)[:, 2]} == {1, 2}


# --- 3. errors and state where the action was ------------------------------------------------

def test_tunes_error_is_shown_expanded_below_the_search_not_in_a_folded_box(db_url):
    at = open_page(start_app(), "tune")
    at.selectbox(key="tune.wl.preset").select("internvl-26b")
    at.number_input(key="tune.devices").set_value(64)
    at.number_input(key="tune.microbatches").set_value(512)
    at.slider(key="tune.limit").set_value(5)
    button(at, "Search").click().run()
    assert errors(at) == ["no generator fits P=64, M=512 on this workload: the LLM has 48 layers but the "
                          "schedule needs 64 chunks (each chunk needs at least one layer)"]
    assert all("Status" not in path and "Expander" not in path for path in _parents_of(at, "Error"))


def test_an_evaluation_that_ends_in_an_error_leaves_no_banner_or_stop_button(db_url, monkeypatch):
    from app import evaluation

    monkeypatch.setattr(evaluation, "CACHE", evaluation.SharedCache(evaluation.CACHE_ENTRIES))
    in_child = evaluation._in_child
    waits: list[float] = []

    def spied(term, document, on_wait):
        return in_child(term, document, lambda seconds: (waits.append(seconds), on_wait(seconds)))

    monkeypatch.setattr(evaluation, "_in_child", spied)
    at = start_app()
    # Big enough for a child process (the banner and Stop button show), refused inside it.
    at.text_area(key="designer.term").input("transpose(zbv(p=16, m=512), mode=dynamic)").run()
    assert waits, "the evaluation should have run in a child, with the banner up"
    assert errors(at) == ["Term: line 1, column 1: transpose: the LLM has 8 layers but the schedule needs 32 "
                          "chunks (each chunk needs at least one layer)"]
    assert not [i.value for i in at.info if i.value.startswith("Evaluating")]
    assert not [b for b in at.button if b.label == "Stop this evaluation"]


def test_a_refused_huge_term_names_the_apps_setting_and_starts_nothing(db_url, monkeypatch):
    from app import evaluation

    started = []
    monkeypatch.setattr(evaluation, "_in_child", lambda *a: started.append(a))
    at = start_app()
    at.text_area(key="designer.term").input("zbv(p=64, m=4096)").run()
    [error] = errors(at)
    assert error == ("Term: zbv(...) would build about 1,585,152 ops, over the app's limit of 500,000 (start the "
                     "app with `mpipe app --max-ops N` or set MPIPE_APP_MAX_OPS)")
    assert "MPIPE_MAX_OPS or" not in error and started == []
    assert not [b for b in at.button if b.label == "Stop this evaluation"]


def test_the_clis_op_limit_is_named_as_the_apps_wherever_the_app_shows_it(db_url):
    from app.widgets import ui_message
    from mpipe_core.errors import SizeLimitError

    with pytest.raises(SizeLimitError) as raised:
        evaluate("zbv(p=64, m=512)", WL, max_ops=1000)
    assert ui_message(raised.value.message).endswith(
        "(start the app with `mpipe app --max-ops N` or set MPIPE_APP_MAX_OPS)")


def test_every_bad_run_option_is_listed_at_once(db, db_url):
    from storage import list_runs

    save_schedule(db, "t2", "1f1b(p=2, m=2)", workload=WL)
    at = open_page(start_app(), "runs")
    at.text_input(key="runs.options").input("timeout_s=NaN, bogus=1, lr")
    button(at, "Launch").click().run()
    from mpipe_core.runs.run_options import RUN_OPTIONS, RunOptionError

    [error] = errors(at)
    lines = [line.strip() for line in error.split("\n")]
    assert lines == ["3 bad run options:", "• option 'lr': expected KEY=VALUE",
                     "• run option timeout_s: expected a finite number in (0, 604800], got nan",
                     "• unknown run option 'bogus' (known: " + ", ".join(RUN_OPTIONS) + ")"]
    assert list_runs(db) == []
    # The CLI's one error line names them all too.

    with pytest.raises(RunOptionError) as raised:
        enqueue(db, "t2", options={"timeout_s": float("nan"), "bogus": 1})
    problems = ["run option timeout_s: expected a finite number in (0, 604800], got nan",
                "unknown run option 'bogus' (known: " + ", ".join(RUN_OPTIONS) + ")"]
    assert raised.value.message == "; ".join(problems) and raised.value.message.count("; ") == 1
    assert str(raised.value) == raised.value.message and raised.value.problems == problems
    assert list_runs(db) == []


# --- 4. units and words ----------------------------------------------------------------------

MS_GB = {"name": "vit-ms", "units": {"time": "ms", "memory": "GB"},
         "llm": {"layers": 8, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.5},
         "encoders": [{"name": "vision", "f": 6.0, "b": 6.0, "w": 6.0, "trainable": False, "output_bytes": 1.0,
                       "input_bytes": 4.0, "param_bytes": 8.0, "activation": 2.0}],
         "link": {"latency": 0.05, "bandwidth": 20.0}}


def test_tunes_progress_and_memory_cap_messages_carry_their_units():
    from mpipe_core.errors import MpipeError
    from mpipe_core.search.tune import tune

    lines: list[str] = []
    tune(MS_GB, 2, 2, None, 5.0, progress=lines.append)
    searched = [line for line in lines if line.startswith("[")]
    assert searched and all(" s  makespan " in line and " ms " in line and line.endswith(" ms)")
                            for line in searched)
    with pytest.raises(MpipeError) as raised:
        tune(MS_GB, 2, 2, 0.5, 5.0)
    assert raised.value.message == ("--memory-cap 0.5 GB is impossible: every schedule holds at least one LLM "
                                    "layer's activations (1.5 GB) on a device")


def test_tunes_table_has_the_clis_vs_fused_and_vs_balanced_columns(db_url):
    from mpipe_cli.tune_commands import render
    from mpipe_core.search.tune import tune

    at = open_page(start_app(), "tune")
    at.number_input(key="tune.devices").set_value(2)
    at.number_input(key="tune.microbatches").set_value(4)
    at.slider(key="tune.limit").set_value(5)
    button(at, "Search").click().run()
    table = table_of(at, "term")
    result = tune(WL, 2, 4, None, 5.0)
    # The CLI's table, row by row: its two speedup columns (the cells ending in x) are vs fused and vs balanced.
    text = render(result.as_dict())
    assert "vs fused" in text and "vs bal" in text
    assert len(table) > 0
    for term, fused, balanced in zip(table["term"], table["vs fused"], table["vs balanced"], strict=True):
        [line] = [line for line in text.splitlines() if line.startswith(term + " ")]
        cells = [c for c in line[len(term):].split() if c.endswith("x")]
        assert (fused, balanced) == tuple(cells)


def test_the_library_diff_speaks_words_units_and_percentage_points(db, db_url):
    save_schedule(db, "d", "1f1b(p=4, m=8)", workload=MS_GB)
    save_schedule(db, "d", "zbv(p=4, m=8)", workload=MS_GB, update=True)
    at = open_page(start_app(), "library")
    table = at.dataframe[2].value
    assert list(table["metric"]) == ["makespan", "bubble ratio", "efficiency vs lower bound", "lower bound",
                                     "peak memory (max)", "devices", "ops"]
    rows = {m: (a, b, c) for m, a, b, c in zip(table["metric"], table["d@1"], table["d@2"], table["change"])}
    a, b = (evaluate(t, MS_GB).summary() for t in ("1f1b(p=4, m=8)", "zbv(p=4, m=8)"))
    change = b["makespan"] - a["makespan"]
    assert rows["makespan"] == (quantity(a["makespan"], "ms"), quantity(b["makespan"], "ms"),
                                ("+" if change > 0 else "") + quantity(change, "ms"))
    assert rows["bubble ratio"][2] == f"{(b['bubble_ratio'] - a['bubble_ratio']) * 100:+.1f} pp"
    assert rows["peak memory (max)"][:2] == (quantity(max(a["peak_memory"]), "GB"),
                                             quantity(max(b["peak_memory"]), "GB"))


def test_the_savings_arithmetic_has_no_double_negative_and_adds_up(db_url):
    from mpipe_core.compare import compare

    trainable = json.loads(json.dumps(MS_GB))
    trainable["encoders"][0]["trainable"] = True
    before, after = "1f1b(p=4, m=4)", "transpose(1f1b(p=4, m=4))"
    at = start_app()
    at.radio(key="wl.source").set_value("JSON").run()
    at.text_area(key="wl.json").input(json.dumps(trainable)).run()
    at = open_page(at, "before_after")
    at.text_input(key="ba.before").input(before)
    at.text_input(key="ba.after").input(after).run()
    assert not errors(at)
    costs = compare([before, after], trainable)[1].transpose
    assert costs.work_added["broadcast"] > 0
    table = at.dataframe[-1].value
    assert "work added: broadcast" in list(table["term"])
    for term, value in zip(table["term"], table["per device"]):
        assert not (term.startswith(("−", "-")) and value.startswith(("−", "-")))
    values = [float(v.removesuffix(" ms").replace(",", "")) for v in table["per device"]]
    assert sum(values[:-1]) == pytest.approx(values[-1], abs=0.01)
    assert values[-1] == pytest.approx(costs.saved, abs=0.01)


def test_compare_says_when_device_counts_differ_and_which_step_its_runs_chart_shows(db, db_url):
    term = "1f1b(p=2, m=4)"
    run, ev = _finished_run(db, term, [2.0, 1.0, 3.0, 1.1])  # step 3 is closest to the mean (1.7)
    at = open_page(start_app(), "compare")
    at.text_area(key="cmp.terms").input("1f1b(p=2, m=4)\n1f1b(p=4, m=4)").run()
    assert any("different device counts (2, 4)" in shown(i.value) for i in at.info)
    at.multiselect(key="cmp.runs").select(run.id).run()
    table = table_of(at, "run")
    mean = ev.timeline.makespan * (1.0 + 3.0 + 1.1) / 3
    assert table["measured makespan (mean of steps)"][0] == f"{quantity(mean, 'ms')} (steps 1, 2, 3)"
    assert table["the chart's step"][0] == f"step 3: {quantity(ev.timeline.makespan * 1.1, 'ms')}"
    assert table["predicted on"][0] == f"{WL} (the run's own workload)"
    assert figure(at, 1)["layout"]["annotations"][0]["text"].endswith("(measured, step 3)")


def _moved(ev) -> float:
    """Encoder compute run off the device of LLM chunk 0 (what transpose moved)."""
    d0 = next(d for d, order in enumerate(ev.schedule.orders) for op in order if op.module == "llm" and op.chunk == 0)
    return sum(e - s for op, d, s, e in ev.timeline.rows()
               if op.module != "llm" and op.kind not in ("R", "BCAST", "AR") and d != d0)


def test_backward_auto_says_recompute_moved_no_encoder_work_when_it_picks_owner(db_url):
    from mpipe_core.compare import compare

    term = "transpose(1f1b(p=4, m=8), mode=dynamic)"
    recompute = evaluate("transpose(1f1b(p=4, m=8), mode=dynamic, backward=recompute)", "internvl-26b")
    owner = evaluate("transpose(1f1b(p=4, m=8), mode=dynamic, backward=owner)", "internvl-26b")
    assert _moved(recompute) == 0 < _moved(owner)  # the case: recompute found nothing worth moving
    note = compare([term], "internvl-26b")[0].transpose.backward_note
    assert note == (f"backward=auto picked owner (makespan {quantity(owner.timeline.makespan, 'ms')} vs "
                    f"{quantity(recompute.timeline.makespan, 'ms')} with recompute): recompute moved no encoder "
                    f"work off the first stage's device (its best placement was the input's own), while owner "
                    f"moved {quantity(_moved(owner), 'ms')}")
    at = start_app()
    at.selectbox(key="wl.preset").select("internvl-26b").run()
    at = open_page(at, "before_after")
    at.text_input(key="ba.before").input("1f1b(p=4, m=8)")
    at.text_input(key="ba.after").input(term).run()
    # (in red: on 64 GB devices this transpose does not fit, which its verdict says first)
    verdicts = [shown(v.value) for v in list(at.success) + list(at.warning) + list(at.info) + list(at.error)]
    assert any("recompute moved no encoder work off the first stage's device" in v for v in verdicts)


# --- 5. sharing and scale --------------------------------------------------------------------

def test_a_link_holds_the_design_and_opening_it_shows_the_same(db_url):
    at = start_app()
    at.text_area(key="designer.term").input("zbv(p=4, m=8)").run()
    at.selectbox(key="wl.preset").select("llava-7b").run()
    params = dict(at.query_params)
    assert params == {"term": ["zbv(p=4, m=8)"], "workload": ["preset:llava-7b"]} or params == {
        "term": "zbv(p=4, m=8)", "workload": "preset:llava-7b"}
    # A fresh session opened on that link: the same term, workload and chart.
    fresh = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    fresh.query_params["term"] = "zbv(p=4, m=8)"
    fresh.query_params["workload"] = "preset:llava-7b"
    fresh.run()
    assert not errors(fresh)
    assert fresh.text_area(key="designer.term").value == "zbv(p=4, m=8)"
    assert fresh.selectbox(key="wl.preset").value == "llava-7b"
    assert metric(fresh, "Makespan") == quantity(evaluate("zbv(p=4, m=8)", "llava-7b").timeline.makespan, "ms")
    assert figure(fresh, 0)["data"] == figure(at, 0)["data"]
    # A JSON workload travels in the link too, and a bad link is one line.
    doc = json.loads(json.dumps(MS_GB))
    fresh = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    fresh.query_params["term"] = "1f1b(p=2, m=2)"
    fresh.query_params["workload"] = "json:" + json.dumps(doc)
    fresh.run()
    assert metric(fresh, "Makespan") == quantity(evaluate("1f1b(p=2, m=2)", doc).timeline.makespan, "ms")
    bad = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    bad.query_params["workload"] = "preset:nope"
    bad.run()
    assert errors(bad)[0].startswith("The link: the link's workload 'preset:nope' is not a preset")


def test_a_link_to_a_saved_workload_by_name_alone_opens_its_latest_version(db, db_url):
    from app import design_link

    # storage's naming: saved:NAME is NAME's latest version, saved:NAME@N that version.
    assert design_link.read({"workload": "saved:ms"}) == design_link.DesignLink(None, "Saved", "ms")
    assert design_link.read({"workload": "saved:ms@1"}).value == "ms@1"
    assert design_link.saved_ref("ms", ["other@4", "ms@2"]) == "ms@2"
    assert design_link.saved_ref("ms@2", ["ms@2"]) == "ms@2"
    assert design_link.saved_ref("ms@1", ["ms@2"]) is None and design_link.saved_ref("m", ["ms@2"]) is None
    assert design_link.shows_link(design_link.DesignLink(source="Saved", value="ms"), "saved:ms@2")
    assert not design_link.shows_link(design_link.DesignLink(source="Saved", value="ms@1"), "saved:ms@2")
    assert design_link.workload_param("saved:ms@2", "{}") == "saved:ms@2"
    save_workload(db, "aaa", "uniform")  # listed first: the fallback a bare name used to get
    save_workload(db, "ms", "uniform")
    save_workload(db, "ms", MS_GB, update=True)
    fresh = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    fresh.query_params["term"] = "1f1b(p=2, m=2)"
    fresh.query_params["workload"] = "saved:ms"
    fresh.run()
    assert not fresh.exception and not errors(fresh), errors(fresh)
    assert not [w.value for w in fresh.warning if "not in this library" in w.value]
    assert fresh.selectbox(key="wl.saved").value == "ms@2"
    assert metric(fresh, "Makespan") == quantity(evaluate("1f1b(p=2, m=2)", MS_GB).timeline.makespan, "ms")
    assert dict(fresh.query_params)["workload"] in ("saved:ms@2", ["saved:ms@2"])
    # A version the library does not list is still said, and the picker falls back.
    gone = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    gone.query_params["workload"] = "saved:nosuch"
    gone.run()
    assert [shown(w.value) for w in gone.warning if "not in this library" in w.value] == [
        f"The link's workload saved:nosuch is not in this library: showing "
        f"{saved_label(gone)} instead."]


def saved_label(at) -> str:
    return "saved:" + at.selectbox(key="wl.saved").value


def test_tune_takes_1024_devices_and_refuses_what_the_app_cannot_hold_naming_its_setting(db_url):
    at = open_page(start_app(), "tune")
    devices, microbatches = at.number_input(key="tune.devices"), at.number_input(key="tune.microbatches")
    assert devices.proto.max == 1024 and microbatches.proto.max >= 4 * 1024
    devices.set_value(1024)
    microbatches.set_value(1024)
    button(at, "Search").click().run()
    [error] = errors(at)
    assert error.startswith("1,024 devices × 1,024 microbatches: every candidate has at least ")
    assert "start the app with `mpipe app --max-ops N` or set MPIPE_APP_MAX_OPS" in error


def test_memory_over_time_at_32_devices_is_peaks_as_bars_and_the_picked_devices_curve(db_url):
    from app.figures import memory_figure

    ev = evaluate("1f1b(p=32, m=32)")
    peaks = [max(v for _, v in series) for series in ev.memory_over_time]
    fig = memory_figure(ev.memory_over_time)  # two traces, not 32 curves in a band
    assert [t.type for t in fig.data] == ["bar", "scatter"]
    bars, curve = fig.data
    assert list(bars.y) == peaks and len(bars.x) == 32
    assert curve.name == f"dev {int(np.argmax(peaks))}"  # the highest peak's curve by default
    curve = memory_figure(ev.memory_over_time, device=5).data[1]
    assert curve.name == "dev 5" and list(curve.y) == [v for _, v in ev.memory_over_time[5]]
    # In the Designer: the device is picked, and the pick is in the link.
    at = start_app()
    at.selectbox(key="wl.preset").select("uniform").run()
    at.text_area(key="designer.term").input("1f1b(p=32, m=32)").run()
    at.selectbox(key="designer.memdev").select(7).run()
    drawn = figure(at, 2)
    assert drawn["data"][1]["name"] == "dev 7"
    assert dict(at.query_params).get("memdev") in ("7", ["7"])


def test_the_legend_explains_the_second_chunk_hatch_and_the_kind_hatches():
    from app.bars import from_timeline
    from app.figures import gantt_figure

    fig, _ = gantt_figure(from_timeline(evaluate("zbv(p=4, m=8)").timeline))
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert "hatched ╲: a second chunk (or encoder shard) on the same device" in legend
    trainable = json.loads(json.dumps(MS_GB))
    trainable["encoders"][0]["trainable"] = True
    fig, _ = gantt_figure(from_timeline(evaluate("transpose(1f1b(p=4, m=4))", trainable).timeline))
    legend = [t.name for t in fig.data]
    assert "hatched ×: parameter broadcast or gradient all-reduce" in legend
    assert "dotted: recompute (forward run again for a backward)" in legend
    assert "hatched ╲: a second chunk (or encoder shard) on the same device" not in legend  # 1F1B: none
