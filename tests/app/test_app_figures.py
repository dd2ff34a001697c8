"""The Gantt chart's data and figures, without Streamlit."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.bars import from_records, from_timeline, from_timings
from app.figures import (
    MAX_BARS,
    aggregate_traces,
    gantt_figure,
    idle_figure,
    memory_figure,
    module_families,
    op_traces,
    overlay_figure,
    stacked_gantts,
    style,
)
from mpipe_core.api import evaluate
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.simulation.metrics import memory_over_time

TRANSPOSED = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
TRAINABLE = {"llm": {"layers": 8, "f": 1, "b": 1, "w": 1},
             "encoders": [{"name": "vision", "f": 3, "b": 3, "w": 3, "trainable": True, "activation": 1,
                           "param_bytes": 2},
                          {"name": "audio", "f": 2, "b": 2, "w": 2, "trainable": False}],
             "link": {"latency": 0.1, "bandwidth": 10}}


def test_bars_carry_every_op_of_the_timeline():
    ev = evaluate(TRANSPOSED, "vit-heavy-small")
    bars = from_timeline(ev.timeline)
    assert len(bars) == len(ev.timeline) == 48
    assert bars.devices == 4
    assert bars.makespan == pytest.approx(ev.timeline.makespan)
    assert set(bars.module) == {"llm", "vision"}
    np.testing.assert_allclose(bars.busy(), ev.metrics.busy)


@pytest.mark.parametrize("term", [TRANSPOSED, "1f1b(p=4, m=4)", "zbv(p=4, m=8)",
                                  "repeat(transpose(1f1b(p=4, m=4)), n=2)"])
def test_idle_gaps_are_exactly_the_idle_time(term):
    ev = evaluate(term, "vit-heavy-small")
    bars = from_timeline(ev.timeline)
    dev, start, end = bars.gaps()
    assert (end > start).all()
    idle = np.bincount(dev, weights=end - start, minlength=bars.devices)
    np.testing.assert_allclose(idle, ev.metrics.idle, atol=1e-9)
    # A gap never overlaps an op of its device.
    for d, s, e in zip(dev, start, end):
        mine = bars.device == d
        assert not ((bars.start[mine] < e - 1e-9) & (bars.end[mine] > s + 1e-9)).any()


def test_a_device_without_ops_is_one_whole_gap():
    rows = [TimelineRecord(0, "llm", "F", 0, 0, 0, 1.0, 1.5), TimelineRecord(0, "llm", "BW", 0, 0, 0, 1.5, 2.0)]
    bars = from_timings(rows, devices=2)
    assert bars.unit == "ms"
    np.testing.assert_allclose(bars.start, [0.0, 500.0])
    dev, start, end = bars.gaps()
    assert list(dev) == [1] and start[0] == 0.0 and end[0] == pytest.approx(1000.0)


def test_one_trace_per_module_and_kind_with_distinct_colours():
    ev = evaluate("transpose(1f1b(p=4, m=4), mode=dynamic, backward=owner)", TRAINABLE)
    bars = from_timeline(ev.timeline)
    traces = op_traces(bars)
    names = [t.name for t in traces]
    assert len(names) == len(set(names))
    expected = {f"{op.module} {op.kind}" for op in ev.timeline.ops}
    assert set(names) == expected
    assert sum(len(t.x) for t in traces) == len(ev.timeline)
    # LLM traces first; LLM and each encoder in different colour families.
    assert names[0].startswith("llm ")
    families = module_families(["llm", "vision", "audio", "llm@1"])
    assert len(set(families.values())) == 4
    colours = {t.name: t.marker.color for t in traces}
    assert colours["llm F"] != colours["vision F"] != colours["audio F"]
    assert style("blue", "F").colour != style("blue", "BW").colour


def test_bars_hover_and_label_the_op():
    ev = evaluate(TRANSPOSED, "vit-heavy-small")
    fig, notice = gantt_figure(from_timeline(ev.timeline))
    assert notice is None
    llm_f = next(t for t in fig.data if t.name == "llm F")
    assert "llm:%{customdata[0]}F%{customdata[1]}" in llm_f.hovertemplate
    assert "duration" in llm_f.hovertemplate and "start" in llm_f.hovertemplate
    assert sorted(set(llm_f.text)) == ["0", "1", "2", "3"]  # microbatch labels
    assert fig.layout.uniformtext.mode == "hide"  # labels only where they fit
    idle = fig.data[0]
    assert idle.name.startswith("idle") and idle.marker.pattern.shape == "/"
    assert fig.layout.barmode == "overlay"
    # Device 0 at the top.
    assert list(fig.layout.yaxis.range) == [3.5, -0.5]


def test_memory_and_idle_figures():
    ev = evaluate(TRANSPOSED, "vit-heavy-small")
    s = ev.summary()
    fig = idle_figure(s["busy"], s["idle"])
    assert [t.name for t in fig.data] == ["busy", "idle"]
    assert list(fig.data[1].y) == s["idle"]
    series = memory_over_time(ev.schedule, ev.workload, ev.timeline)
    fig = memory_figure(series)
    assert len(fig.data) == 4
    assert max(max(t.y) for t in fig.data) == pytest.approx(max(s["peak_memory"]))


def test_large_schedules_are_aggregated_with_a_notice_and_keep_busy_time():
    ev = evaluate("zb_h1(p=8, m=64)")
    bars = from_timeline(ev.timeline)
    fig, notice = gantt_figure(bars, max_bars=500)
    assert notice and "1,536 ops" in notice
    total = sum(float(np.sum(np.asarray(t.x) * np.asarray(t.marker.opacity)))
                for t in fig.data)  # bin width x busy fraction, where no bin is under 8%
    assert total == pytest.approx(sum(ev.metrics.busy), rel=0.02)
    assert sum(len(t.x) for t in fig.data) <= 500 + bars.devices
    # Exact busy time per bin (opacity floor aside).
    traces = aggregate_traces(bars, 500)
    assert {t.name.split(" (")[0] for t in traces} <= {"llm F", "llm B", "llm W"}


def test_20k_op_figure_is_drawn_op_by_op():
    ev = evaluate("interleaved(p=16, m=160, v=4)")
    bars = from_timeline(ev.timeline)
    assert 20_000 <= len(bars) <= MAX_BARS
    fig, notice = gantt_figure(bars)
    assert notice is None
    assert sum(len(t.x) for t in fig.data if not t.name.startswith("idle") and t.visible != "legendonly") == len(bars)
    assert all(t.text is None for t in fig.data)  # no labels at this size
    json.loads(fig.to_json())


def test_stacked_gantts_share_one_time_axis():
    a = from_timeline(evaluate("1f1b(p=4, m=4)", "vit-heavy-small").timeline)
    b = from_timeline(evaluate(TRANSPOSED, "vit-heavy-small").timeline)
    fig, notices = stacked_gantts([("before", a), ("after", b)])
    assert notices == []
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"
    names = [t.name for t in fig.data if t.showlegend]
    assert len(names) == len(set(names))  # one legend entry per trace kind


def test_overlay_puts_measured_and_predicted_on_the_same_rows():
    ev = evaluate("1f1b(p=2, m=2)")
    rows = ev.timeline.records()
    measured = from_records([r._replace(start=r.start * 2, end=r.end * 2) for r in rows])
    predicted = from_records(rows)
    fig = overlay_figure(measured, predicted)
    pred = [t for t in fig.data if t.name.startswith("predicted")]
    meas = [t for t in fig.data if t.name.startswith("measured")]
    assert sum(len(t.x) for t in pred) == sum(len(t.x) for t in meas) == len(rows)
    assert all(t.opacity < 1 for t in pred)
    assert set(np.round(np.concatenate([np.asarray(t.y) for t in meas]) % 1, 2)) == {0.21}


@pytest.mark.parametrize("term, devices", [("disaggregate(1f1b(p=2, m=4), encoder_devices=2)", 4),
                                           ("colocated(1f1b(p=4, m=4))", 4)])
def test_encoder_devices_and_barriers_are_drawn_like_any_op(term, devices):
    ev = evaluate(term, TRAINABLE)
    bars = from_timeline(ev.timeline)
    fig = json.loads(gantt_figure(bars)[0].to_json())
    rows = {int(y) for t in fig["data"] if t.get("type") == "bar" and not t["name"].startswith("idle")
            for y in _ys(t)}
    assert rows == set(range(devices))  # every device a row of its own, the encoder devices included
    names = {t["name"] for t in fig["data"]}
    assert {f"{op.module} {op.kind}" for op in ev.timeline.ops} <= names
    if term.startswith("disaggregate"):  # rows 2 and 3 hold encoder ops only
        enc_rows = {int(y) for t in fig["data"] if t["name"].startswith(("vision", "audio")) for y in _ys(t)}
        llm_rows = {int(y) for t in fig["data"] if t["name"].startswith("llm ") for y in _ys(t)}
        assert enc_rows == {2, 3} and llm_rows == {0, 1}


def _ys(trace) -> list:
    from app_helpers import array

    return array(trace["y"]).tolist()


CLUSTER_DOC = {"model": {"hidden": 1024, "layers": 4, "heads": 16, "seq_len": 1024, "vocab": 1024},
               "device": "a100", "cluster": "dgx-a100", "parallel": {"tp": 2, "dp": 2}}


def test_communication_is_drawn_with_bytes_and_link_class_on_hover():
    from app_helpers import array

    ev = evaluate("1f1b(p=2, m=4)", CLUSTER_DOC)
    fig = json.loads(gantt_figure(from_timeline(ev.timeline), comm=ev.comm)[0].to_json())
    traces = {t["name"]: t for t in fig["data"]}
    tp = traces["tp collectives (inside the op)"]
    assert len(array(tp["x"])) == sum(c.group == "tp" for c in ev.comm)
    assert all("bytes 2.1 MB" in h and "link scale_up" in h and "all-reduce" in h for h in tp["hovertext"])
    sync = traces["dp gradient sync (after the pipeline)"]
    assert all("link scale_up" in h and "2 ranks" in h for h in sync["hovertext"])
    ends = [b + x for t in fig["data"] if t.get("type") == "bar" and t.get("visible") != "legendonly"
            for b, x in zip(array(t["base"]), array(t["x"]))]
    assert max(ends) == pytest.approx(ev.step.step_time_s * 1e3)  # the right edge is the step time
    # Without a cluster nothing is added.
    plain = json.loads(gantt_figure(from_timeline(evaluate("1f1b(p=2, m=4)").timeline))[0].to_json())
    assert not any(t["name"] in traces and "comm" in t.get("legendgroup", "") for t in plain["data"])
