"""Issue 21 in the app: will this schedule fit on my device?  The Designer's
verdict, headroom and static + activation parts, the memory chart's capacity
line and over-capacity devices, Compare's memory columns, Tune under the
device's memory (its cap line, the candidates over it, fits / static columns,
no cap, the reasons when nothing fits) and an analytic workload's parallel
settings, each against the core's own figures."""
from __future__ import annotations

import json

import numpy as np
import pytest
from app_helpers import array, button, errors, figure, metric, open_page, shown, start_app, table_of

from app.figures import OVER_COLOUR, memory_figure
from mpipe_core.api import evaluate
from mpipe_core.search.tune import tune
from mpipe_core.simulation.metrics import memory_fit
from mpipe_core.workloads.presets import preset_document
from mpipe_core.workloads.units import quantity
from mpipe_core.workloads.workload import preset, with_parallel

pytestmark = pytest.mark.databases("sqlite")  # nothing here touches the library

# GPT-3 175B on A100 80 GB, tp=8 with sequence parallelism, no flash attention (docs/memory.md):
# 1F1B's first stage needs 84.74 GB; selective recompute makes it fit.
PARALLEL = {"tp": 8, "sp": True, "flash_attention": False}
OVER, FITS = "1f1b(p=8, m=8)", "recompute(1f1b(p=8, m=8), mode=selective)"


def _gpt3(at, key: str = "wl"):
    """gpt3-175b with PARALLEL set in the picker's parallel settings."""
    at.selectbox(key=f"{key}.preset").select("gpt3-175b").run()
    at.number_input(key=f"{key}.parallel.tp").set_value(8).run()
    at.checkbox(key=f"{key}.parallel.sp").check().run()
    return at.checkbox(key=f"{key}.parallel.flash_attention").uncheck().run()


def _json(at, doc: dict, key: str = "wl"):
    at.radio(key=f"{key}.source").set_value("JSON").run()
    return at.text_area(key=f"{key}.json").input(json.dumps(doc)).run()


def _traces(fig: dict) -> dict[str, dict]:
    return {t["name"]: t for t in fig["data"]}


def test_the_designer_says_when_a_schedule_does_not_fit_and_marks_the_devices_over(db_url):
    wl = with_parallel(preset("gpt3-175b"), PARALLEL)
    ev = evaluate(OVER, wl)
    m = ev.metrics
    fit = memory_fit(m.peak_memory, m.capacity)
    at = _gpt3(start_app())
    at.text_area(key="designer.term").input(OVER).run()
    assert not at.exception
    # One line, as `mpipe eval` says it, with units.
    assert errors(at) == ["Does not fit in 80 GB: device 0 needs 84.74 GB, 4.739 GB over (1 of 8 devices over)."]
    assert metric(at, "Peak memory (max)") == quantity(max(m.peak_memory), "GB") == "84.74 GB"
    assert metric(at, "Headroom (least)") == quantity(fit.least_headroom, "GB")
    captions = [shown(c.value) for c in at.caption]
    [per_device] = [c for c in captions if c.startswith("Peak memory per device (static + activations): ")]
    assert (f"dev 0 **84.74 GB** ({quantity(m.static_memory[0], 'GB')} + "
            f"{quantity(m.peak_memory[0] - m.static_memory[0], 'GB')}) ▲ · dev 1 ") in per_device
    assert "▲" not in per_device.split("dev 1 ")[1]  # only device 0 is over
    # The Gantt chart marks device 0, and its legend says what the mark means and by how much.
    gantt = figure(at, 0)
    ticks = gantt["layout"]["yaxis"]["ticktext"]
    assert OVER_COLOUR in ticks[0] and "dev 0 ▲" in ticks[0] and ticks[1:] == [f"dev {d}" for d in range(1, 8)]
    assert "▲ red device label: over the device's memory (1 device; dev 0 by 4.739 GB)" in _traces(gantt)
    # The memory chart: static + activation curves from each device's static level, the capacity line,
    # device 0 in red and named with how far over it is.
    memory = _traces(figure(at, 2))
    capacity = memory["capacity 80 GB"]
    assert list(capacity["y"]) == [80, 80] and capacity["line"]["color"] == OVER_COLOUR
    over = memory["dev 0 ▲ +4.739 GB"]
    assert over["line"]["color"] == OVER_COLOUR and "dev 0" not in memory
    assert over["hovertemplate"].endswith(
        "<br><b>▲ its peak is over the 80 GB capacity by 4.739 GB</b><extra></extra>")
    assert all(memory[f"dev {d}"]["line"]["color"] != OVER_COLOUR for d in range(1, 8))
    y = array(over["y"])
    assert y[0] == m.static_memory[0] and y.max() == m.peak_memory[0]
    np.testing.assert_allclose(array(over["customdata"]), y - m.static_memory[0])  # the hover's activations
    static = memory["static (dotted)"]
    levels = [v for v in static["y"] if v is not None]
    assert levels == [s for s in m.static_memory for _ in (0, 1)]
    # The design's link holds the parallel settings.
    param = dict(at.query_params)["workload"]
    link = json.loads((param if isinstance(param, str) else param[0]).removeprefix("json:"))
    assert link["parallel"] == PARALLEL and link["model"] == "gpt3-175b"
    # Selective recompute fits: no error, the verdict as a caption, nothing marked.
    at.text_area(key="designer.term").input(FITS).run()
    fits = evaluate(FITS, wl).metrics
    assert errors(at) == []
    assert (f"Fits in 80 GB (least headroom {quantity(80 - max(fits.peak_memory), 'GB')}, device 0)."
            in [shown(c.value) for c in at.caption])
    assert not any("▲" in t for t in figure(at, 0)["layout"]["yaxis"]["ticktext"])
    assert "dev 0" in _traces(figure(at, 2))


def test_a_workload_without_a_device_memory_says_fitting_is_not_checked(db_url):
    at = start_app()  # vit-heavy-small: explicit costs, no device
    assert not any(m.label == "Headroom (least)" for m in at.metric)
    assert any(c.value.startswith("Device memory unknown: the workload states no capacity") for c in at.caption)
    assert not any(t["name"].startswith("capacity") for t in figure(at, 2)["data"])
    assert at.get("expander") and not any("Parallel settings" in e.proto.label for e in at.expander)


def test_peaks_above_16_devices_stack_static_and_activations_under_the_capacity_line(db_url):
    # 32 layers of static 2, one layer per device, activation 1: 1F1B's device d holds 32 - d microbatches,
    # so devices 0-3 (34, 33, 32, 31) are over a memory of 30.
    doc = {"llm": {"layers": 32, "activation": 1.0, "static": {"layer": 2.0}}, "device": {"memory": 30},
           "units": {"time": "ms", "memory": "GB"}}
    ev = evaluate("1f1b(p=32, m=32)", doc)
    m = ev.metrics
    fig = memory_figure(ev.memory_over_time, "ms", "GB", static=m.static_memory, capacity=m.capacity)
    traces = {t.name: t for t in fig.data}
    assert list(traces["static memory"].y) == m.static_memory == [2.0] * 32
    fitting, over = traces["activations (peak)"], traces["activations, ▲ over the device's memory"]
    assert list(over.x) == [0, 1, 2, 3] and list(over.y) == [32.0, 31.0, 30.0, 29.0]
    assert list(fitting.x) == list(range(4, 32)) and list(fitting.y) == m.peak_activation_memory[4:]
    assert all(c == OVER_COLOUR or c == "#67000d" for c in over.marker.color)
    assert "over the 30 GB capacity by 4 GB" in over.customdata[0][2]  # the hover of device 0
    assert over.customdata[0][1] == " = static 2 + activations 32"
    assert list(traces["capacity 30 GB"].y) == [30, 30] and fig.layout.barmode == "stack"
    # In the Designer: the picker names each device's peak and how far over it is.
    at = _json(start_app(), doc)
    at.text_area(key="designer.term").input("1f1b(p=32, m=32)").run()
    picker = at.selectbox(key="designer.memdev")
    assert picker.value == 0 and picker.options[0] == "dev 0 (peak 34 GB, ▲ over by 4 GB)"
    assert picker.options[4] == "dev 4 (peak 30 GB)"
    assert errors(at) == ["Does not fit in 30 GB: device 0 needs 34 GB, 4 GB over (4 of 32 devices over)."]


def test_compare_has_static_memory_fits_and_headroom_columns_and_marks_the_devices_over(db_url):
    wl = with_parallel(preset("gpt3-175b"), PARALLEL)
    at = _gpt3(open_page(start_app(), "compare"))
    at.text_area(key="cmp.terms").input(f"{OVER}\n{FITS}").run()
    assert not at.exception and not errors(at)
    table = table_of(at, "schedule", has="fits")
    for row, term in zip(table.to_dict("records"), (OVER, FITS)):
        m = evaluate(term, wl).metrics
        fit = memory_fit(m.peak_memory, m.capacity)
        assert row["static memory"] == quantity(max(m.static_memory), "GB")
        assert row["headroom"] == quantity(80 - max(m.peak_memory), "GB")
        assert row["device memory"] == "80 GB"
        assert row["fits"] == ("yes" if fit.fits else "no")
    assert list(table["fits"]) == ["no", "yes"]
    assert list(table["over the device's memory"]) == ["dev 0 +4.739 GB", ""]
    # The stacked Gantt charts mark device 0 of the first schedule only.
    layout = figure(at, 0)["layout"]
    assert "dev 0 ▲" in layout["yaxis"]["ticktext"][0] and "▲" not in "".join(layout["yaxis2"]["ticktext"])
    # A workload without a device memory: fitting is unknown, not "no".
    at = open_page(start_app(), "compare")
    assert set(table_of(at, "schedule", has="fits")["fits"]) == {"unknown"}


def test_compare_marks_each_schedules_devices_over_in_its_own_memory_unit(db, db_url):
    from storage import save_schedule

    # 1F1B on 4 devices, 4 layers of static 2, activation 1: device 0 holds 4 microbatches, 6 > 5.
    gb = {"llm": {"layers": 4, "activation": 1.0, "static": {"layer": 2.0}}, "device": {"memory": 5},
          "units": {"time": "ms", "memory": "GB"}}
    mb = dict(gb, units={"time": "ms", "memory": "MB"})  # the same numbers, in MB
    term = "1f1b(p=4, m=4)"
    save_schedule(db, "in-gb", term, workload=gb)
    save_schedule(db, "in-mb", term, workload=mb)
    over = memory_fit(evaluate(term, gb).metrics.peak_memory, 5).over
    assert list(over) == [0]
    at = open_page(start_app(), "compare")
    at.text_area(key="cmp.terms").input("").run()
    at.multiselect(key="cmp.versions").set_value(["in-mb@1", "in-gb@1"]).run()
    assert not at.exception and not errors(at), errors(at)
    keys = [name for name in _traces(figure(at, 0)) if "red device label" in name]
    assert keys == [f"▲ red device label: over the device's memory (1 device; dev 0 by {quantity(over[0], unit)})"
                    for unit in ("MB", "GB")]


def test_the_parallel_settings_follow_the_clis_rule(db_url):
    at = _gpt3(start_app())
    at.text_area(key="designer.term").input(OVER).run()
    expected = evaluate(OVER, with_parallel(preset("gpt3-175b"), PARALLEL)).timeline.makespan
    assert metric(at, "Makespan") == quantity(expected, "ms")
    assert figure(at, 0)["layout"]["title"]["text"].endswith("on gpt3-175b tp=8,sp,flash_attention=false")
    at.number_input(key="wl.parallel.tp").set_value(7).run()  # 96 heads
    assert errors(at) == ["Parallel settings: parallel.tp: 7 does not divide the model's 96 attention heads"]
    assert not at.get("plotly_chart")
    # Another workload starts from its own document's settings.
    doc = {**preset_document("llama2-7b"), "parallel": {"tp": 4, "distributed_optimizer": True, "dp": 2}}
    at = _json(at, doc)
    assert at.number_input(key="wl.parallel.tp").value == 4 and at.number_input(key="wl.parallel.dp").value == 2
    assert at.checkbox(key="wl.parallel.distributed_optimizer").value is True
    assert at.checkbox(key="wl.parallel.flash_attention").value is True and errors(at) == []
    assert metric(at, "Makespan") == quantity(evaluate(OVER, doc).timeline.makespan, "ms")


# vit-heavy-small on devices of memory 9: at 2 x 4 its fastest transpose needs 10, the next two 8.5 and 8.
VIT_IN_9 = {**preset_document("vit-heavy-small"), "device": {"memory": 9}}


def _search(at, devices: int = 2, microbatches: int = 4):
    at.number_input(key="tune.devices").set_value(devices)
    at.number_input(key="tune.microbatches").set_value(microbatches)
    at.slider(key="tune.limit").set_value(5)
    return button(at, "Search").click().run()


def test_tune_caps_at_the_device_memory_draws_its_line_and_marks_what_is_over_it(db_url):
    at = _json(open_page(start_app(), "tune"), VIT_IN_9, "tune.wl")
    radio = at.radio(key="tune.cap_mode")
    assert radio.value == "the device's memory" and radio.options[0] == "the device's memory (9)"
    _search(at)
    assert not at.exception and not errors(at)
    expected = tune(VIT_IN_9, 2, 4, 9, 5.0, cap_is_capacity=True)
    traces = _traces(figure(at, 0))
    line = traces["memory cap 9 (the device's memory)"]
    assert list(line["y"]) == [9, 9] and line["mode"] == "lines"
    over = traces["▲ over the memory cap (left out)"]
    assert list(over["text"]) == [c.term for c in expected.over_cap] and min(array(over["y"])) > 9
    assert over["marker"]["color"] == OVER_COLOUR
    notes = [row[0] for row in over["customdata"]]
    assert notes == [f"<br><b>▲ over the memory cap by {quantity(c.peak_memory - 9, '')}</b>"
                     for c in expected.over_cap]
    assert max(array(traces["candidates"]["y"])) <= 9
    # The table: the CLI's static and fits columns; everything in it fits.
    table = table_of(at, "term")
    assert list(table.columns[:5]) == ["term", "makespan", "peak memory", "static", "fits"]
    assert list(table["term"]) == [c.term for c in expected.candidates] and set(table["fits"]) == {"yes"}
    assert list(table["static"]) == [quantity(c.static_memory, "") for c in expected.candidates]
    evaluated = len(expected.candidates) + len(expected.over_cap)
    assert any(shown(c.value).startswith(
        f"{evaluated} candidates evaluated: {len(expected.candidates)} within the memory cap, "
        f"{len(expected.over_cap)} over it; those over the cap are drawn in red (▲) and left out of the table. ")
        and "; memory cap 9 (device memory 9). " in shown(c.value) for c in at.caption)


def test_tune_without_a_cap_marks_the_candidates_over_the_device_and_fronts_only_what_fits(db_url):
    at = _json(open_page(start_app(), "tune"), VIT_IN_9, "tune.wl")
    at.radio(key="tune.cap_mode").set_value("no cap").run()
    _search(at)
    expected = tune(VIT_IN_9, 2, 4, None, 5.0)
    table = table_of(at, "term")
    fits = dict(zip(table["term"], table["fits"]))
    assert fits == {c.term: "yes" if c.fits else "no" for c in expected.candidates} and "no" in fits.values()
    assert set(table["term"][table["on the front"] == "yes"]) == expected.fitting_front != expected.pareto
    traces = _traces(figure(at, 0))
    assert list(traces["device memory 9"]["y"]) == [9, 9] and not any(n.startswith("memory cap") for n in traces)
    over = traces["▲ over the device's memory"]
    assert set(over["text"]) == {c.term for c in expected.candidates if c.fits is False}
    assert set(traces["Pareto front (of those that fit)"]["text"]) == expected.fitting_front
    assert over["customdata"][0][0].startswith("<br><b>▲ over the device's memory by ")


def test_tune_shows_every_familys_reason_when_nothing_fits(db_url):
    # 8 layers of static memory 10 on 4 devices of memory 5: 2 layers (20) on every device whatever the schedule
    heavy = {"llm": {"layers": 8, "static": {"layer": 10}}, "device": {"memory": 5}}
    at = _search(_json(open_page(start_app(), "tune"), heavy, "tune.wl"), 4, 8)
    [error] = errors(at)
    lines = error.split("  \n")
    assert lines[0] == ("no schedule fits the device's 5 of memory: the least any candidate needs is 28 "
                        "(balanced(zbv(p=4, m=8))); “no cap” searches without one")
    assert lines[1:] == [
        "• balanced: static memory alone is at least 20 on a device in every candidate, over the 5 cap "
        "(balanced(zbv(p=4, m=8)))",
        "• fused (plain generators): static memory alone is at least 20 on a device in every candidate, over "
        "the 5 cap (zbv(p=4, m=8))"]
    assert not at.dataframe


def test_tune_searches_an_analytic_preset_under_its_parallel_settings(db_url):
    at = open_page(start_app(), "tune")
    at.selectbox(key="tune.wl.preset").select("llava-7b").run()
    at.number_input(key="tune.wl.parallel.tp").set_value(2).run()
    at.checkbox(key="tune.wl.parallel.distributed_optimizer").check().run()
    at.number_input(key="tune.wl.parallel.dp").set_value(4).run()
    _search(at, 4, 8)
    assert not at.exception and not errors(at)
    wl = with_parallel(preset("llava-7b"), {"tp": 2, "distributed_optimizer": True, "dp": 4})
    expected = tune(wl, 4, 8, wl.capacity, 5.0, cap_is_capacity=True)
    assert metric(at, "Best makespan") == quantity(expected.best.makespan, "ms")
    table = table_of(at, "term")
    assert table["static"][0] == quantity(expected.best.static_memory, "GB")
    # half the static memory of tp=1 or less: the settings reached the search
    assert expected.best.static_memory < tune("llava-7b", 4, 8, 80, 5.0).best.static_memory / 2


def test_tune_results_for_other_inputs_keep_the_units_they_were_searched_in(db_url):
    at = open_page(start_app(), "tune")
    at.selectbox(key="tune.wl.preset").select("llava-7b").run()
    _search(at, 2, 4)
    best = metric(at, "Best makespan")
    assert best.endswith(" ms")
    # A baseline none of whose kind fits the cap says so, as the CLI's "(over the memory cap: needs ...)".
    expected = tune("llava-7b", 2, 4, 80.0, 5.0, cap_is_capacity=True)
    names = {"fused": "fused", "balanced": "balanced", "colocated": "colocated (Megatron MIMO)",
             "disaggregated": "disaggregated (best)", "transpose": "transpose (best)"}  # as `mpipe tune` says
    over = [(names[name], c) for name, c in expected.baselines().items() if c is not None and c.peak_memory > 80]
    assert over and [shown(w.value) for w in at.warning] == [
        f"The {name} baseline {c.term} is over the memory cap (none of its kind fits it): it needs "
        f"{quantity(c.peak_memory, 'GB')}, {quantity(c.peak_memory - 80, 'GB')} over." for name, c in over]
    at.selectbox(key="tune.wl.preset").select("vit-heavy-small").run()  # unitless
    assert "These results are for other inputs: Search again to update them." in [w.value for w in at.warning]
    assert metric(at, "Best makespan") == best and table_of(at, "term")["peak memory"][0].endswith(" GB")
