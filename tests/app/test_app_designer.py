"""The Designer page, driven through Streamlit's AppTest."""
from __future__ import annotations

import copy
import json

import pytest
from app_helpers import array, bars_by_trace, button, errors, figure, metric, op_bar_count, open_page, shown, start_app

from mpipe_core.api import evaluate
from mpipe_core.workloads.presets import preset_document

DEFAULT = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"

# The designer works without the library; its database tests stay on SQLite.
pytestmark = pytest.mark.databases("sqlite")


def test_landing_page_shows_the_multimodal_example(db_url):
    at = start_app()
    assert not at.exception
    assert at.text_area(key="designer.term").value == DEFAULT
    assert at.selectbox(key="wl.preset").value == "vit-heavy-small"
    expected = evaluate(DEFAULT, "vit-heavy-small").summary()
    assert metric(at, "Makespan") == f"{expected['makespan']:.4g}"
    assert metric(at, "Bubble ratio") == f"{expected['bubble_ratio']:.1%}"
    assert metric(at, "Efficiency vs LB") == f"{expected['efficiency']:.1%}"
    assert metric(at, "Peak memory (max)") == f"{max(expected['peak_memory']):.4g}"
    fig = figure(at, 0)
    assert op_bar_count(fig) == expected["ops"] == 48
    assert set(bars_by_trace(fig)) == {"idle (bubble)", "llm F", "llm BW", "vision F"}
    assert len(at.get("plotly_chart")) == 3  # Gantt, idle per device, memory over time
    # The fused baseline is one click away.
    button(at, "Show the fused baseline: 1f1b(p=4, m=4)").click().run()
    assert at.text_area(key="designer.term").value == "1f1b(p=4, m=4)"
    baseline = evaluate("1f1b(p=4, m=4)", "vit-heavy-small").summary()
    assert metric(at, "Makespan") == f"{baseline['makespan']:.4g}"
    button(at, "Transpose it").click().run()
    assert at.text_area(key="designer.term").value == "transpose(1f1b(p=4, m=4), mode=dynamic)"


def test_typing_a_term_draws_its_chart_and_metrics(db_url):
    at = start_app()
    at.text_area(key="designer.term").input("zbv(p=4, m=8)").run()
    assert not errors(at)
    expected = evaluate("zbv(p=4, m=8)", "vit-heavy-small").summary()
    assert metric(at, "Makespan") == f"{expected['makespan']:.4g}"
    assert metric(at, "Devices · ops") == f"4 · {expected['ops']}"
    fig = figure(at, 0)
    assert op_bar_count(fig) == expected["ops"]
    assert {"llm F", "llm B", "llm W", "vision F"} <= set(bars_by_trace(fig))
    # The idle chart shows the core's idle times.
    idle = next(t for t in figure(at, 1)["data"] if t["name"] == "idle")
    assert idle["y"] == pytest.approx(expected["idle"])


@pytest.mark.parametrize("text, where", [
    ("1f1b(p=4, m=", "line 1, column 13"),
    ("transpose(\n  1f1b(p=4, m=4, q=2))", "line 2, column 18"),
    ("1f1b(p=0, m=4)", "line 1, column 6"),
    ("1f1b(p=4, m=2)", "line 1, column 11"),  # the core points at m
])
def test_a_bad_term_shows_its_position_inline(db_url, text, where):
    at = start_app()
    at.text_area(key="designer.term").input(text).run()
    assert not at.exception
    assert len(at.error) == 1
    assert shown(at.error[0].value).startswith(f"Term: {where}: ")
    caret = at.code[-1].value.splitlines()
    column = int(where.rsplit(" ", 1)[1])
    assert caret[-1] == " " * (column - 1) + "^"
    assert not at.get("plotly_chart")  # no chart for a term that does not evaluate


@pytest.mark.parametrize("term", ["disaggregate(1f1b(p=3, m=4), encoder_devices=1)",
                                  "encoder_batch(colocated(1f1b(p=4, m=4)), 2)"])
def test_a_disaggregated_or_colocated_term_renders(db_url, term):
    at = start_app()
    at.text_area(key="designer.term").input(term).run()
    assert not at.exception and not errors(at)
    expected = evaluate(term, "vit-heavy-small").summary()
    assert metric(at, "Makespan") == f"{expected['makespan']:.4g}"
    assert metric(at, "Devices · ops") == f"4 · {expected['ops']}"
    fig = figure(at, 0)
    assert op_bar_count(fig) == expected["ops"]
    ys = {int(y) for t in fig["data"] if t.get("type") == "bar" and t["name"] == "vision F" for y in array(t["y"])}
    # disaggregate: the encoder device is a row of its own; colocated: 2 groups of 2 on the first 2 devices
    assert ys == ({3} if term.startswith("disaggregate") else {0, 1})


def test_examples_and_builder_write_the_term(db_url):
    at = start_app()
    at.selectbox(key="designer.example").select("ZB-V").run()
    assert at.text_area(key="designer.term").value == "zbv(p=4, m=8)"
    at.toggle(key="designer.builder").set_value(True).run()
    at.selectbox(key="builder.generator").select("interleaved").run()
    at.number_input(key="builder.interleaved.m").set_value(8).run()
    at.multiselect(key="builder.wrappers").select("split_bw").select("transpose").run()
    at.selectbox(key="builder.1.transpose.mode").select("dynamic").run()
    assert at.code[0].value == "transpose(split_bw(interleaved(p=4, m=8)), mode=dynamic)"
    button(at, "Use this term").click().run()
    assert at.text_area(key="designer.term").value == "transpose(split_bw(interleaved(p=4, m=8)), mode=dynamic)"
    expected = evaluate("transpose(split_bw(interleaved(p=4, m=8)), mode=dynamic)", "vit-heavy-small")
    assert metric(at, "Makespan") == f"{expected.timeline.makespan:.4g}"


def test_workload_from_json_and_its_errors(db_url):
    at = start_app()
    at.radio(key="wl.source").set_value("JSON").run()
    doc = copy.deepcopy(preset_document("vit-heavy-small"))  # the core's document is shared
    doc["encoders"][0]["f"] = 2.0
    at.text_area(key="wl.json").input(json.dumps(doc)).run()
    expected = evaluate(DEFAULT, doc).summary()
    assert metric(at, "Makespan") == f"{expected['makespan']:.4g}"
    at.text_area(key="wl.json").input('{"llm": {"layers": 8,}').run()
    assert errors(at) == ["Workload JSON, line 1, column 22: Expecting property name enclosed in double quotes"]
    at.text_area(key="wl.json").input('{"llm": {"layers": 0}}').run()
    assert errors(at) == ["Workload: llm.layers: expected an integer from 1 to 1000000, got 0"]
    assert not at.get("plotly_chart")


def test_save_then_visible_in_the_library(db_url):
    at = start_app()
    at.text_input(key="designer.save_name").input("vit-transpose")
    at.text_input(key="designer.save_tags").input("vit, demo")
    at.text_input(key="designer.save_message").input("first try")
    button(at, "Save").click().run()
    assert [shown(s.value) for s in at.success] == [f"Saved vit-transpose@1: {DEFAULT}"]
    # Saving the same name again is refused inline.
    button(at, "Save").click().run()
    assert "already exists" in errors(at)[0]
    open_page(at, "library")
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["name"]) == ["vit-transpose"]
    assert table["makespan"][0] == f"{evaluate(DEFAULT, 'vit-heavy-small').summary()['makespan']:.4g}"
    assert table["tags"][0] == "demo, vit"
    # The library's search filters it.
    at.text_input(key="lib.search").input("nothing-like-it").run()
    assert [i.value for i in at.info] == ["No schedules match."]


def test_state_survives_switching_pages(db_url):
    at = start_app()
    at.text_area(key="designer.term").input("gpipe(p=4, m=4)").run()
    at.selectbox(key="wl.preset").select("uniform").run()
    open_page(at, "library")
    open_page(at, "designer")
    assert at.text_area(key="designer.term").value == "gpipe(p=4, m=4)"
    assert at.selectbox(key="wl.preset").value == "uniform"
    assert metric(at, "Makespan") == f"{evaluate('gpipe(p=4, m=4)').timeline.makespan:.4g}"


def test_an_analytic_workload_on_a_cluster_draws_its_communication(db_url):
    doc = {"model": {"hidden": 1024, "layers": 4, "heads": 16, "seq_len": 1024, "vocab": 1024},
           "device": "a100", "cluster": "dgx-a100", "parallel": {"tp": 2, "dp": 2}}
    at = start_app()
    at.text_area(key="designer.term").input("1f1b(p=2, m=4)")
    at.radio(key="wl.source").set_value("JSON").run()
    at.text_area(key="wl.json").input(json.dumps(doc)).run()
    assert not errors(at)
    fig = figure(at, 0)
    traces = {t["name"]: t for t in fig["data"]}
    tp = traces["tp collectives (inside the op)"]
    assert tp["hovertext"] and all("bytes" in h and "link scale_up" in h for h in tp["hovertext"])
    assert "optimizer step (after the pipeline)" in traces
    assert op_bar_count(fig) == evaluate("1f1b(p=2, m=4)", doc).metrics.ops  # the strips are not ops
    assert any("Hover for bytes and link class" in c.value for c in at.caption)
