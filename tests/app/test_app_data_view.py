"""The data view (docs/data.md) on the Designer and Compare pages: each drawn
batch's cost, the static plan against per_batch batch by batch, and a picked
batch's Gantt chart with the plan it got."""
from __future__ import annotations

import json

import numpy as np
import pytest
from app_helpers import array, errors, figure, open_page, shown, start_app

from mpipe_core.algebra.terms import parse
from mpipe_core.search.per_batch import Planner
from mpipe_core.simulation.simulator import simulate
from mpipe_core.workloads.batch_costs import drawn_batches, microbatch_workload, pack_weight
from mpipe_core.workloads.workload import parse_workload

TERM = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
DATA_WORKLOAD = {
    "llm": {"layers": 8, "f": 1.0, "b": 2.0, "w": 1.0, "activation": 0.1},
    "encoders": [{"name": "vision", "f": 0.3, "b": 0.3, "w": 0.3, "trainable": False}],
    "units": {"time": "ms", "memory": "GB"},
    "data": {"samples": {"images": {"uniform": [0, 2]}, "tiles": {"uniform": [1, 6]},
                         "text_tokens": {"uniform": [20, 100]}},
             "tokens": {"per_tile": 10}, "packing": {"max_tiles": 12, "max_tokens": 200}}}
BATCHES = 6


def _expected():
    """Each batch's work and its static makespan, from the core's pieces (no stream, no planner search)."""
    wl = parse_workload(DATA_WORKLOAD)
    static = Planner(parse(TERM), wl).static
    drawn = drawn_batches(wl, 4, BATCHES)
    weight = pack_weight(wl)
    costs = [sum(weight(p) for p in b.packs) for b in drawn]
    spans = [simulate(static, microbatch_workload(wl, b.of(0))).makespan for b in drawn]
    return costs, spans


def _with_data(at, page: str):
    at = open_page(at, page)
    at.radio(key="wl.source").set_value("JSON").run()
    at.text_area(key="wl.json").input(json.dumps(DATA_WORKLOAD)).run()
    return at


def _data_figures(at, first: int) -> tuple[dict, dict, dict]:
    return figure(at, first), figure(at, first + 1), figure(at, first + 2)


def _check(at, first: int, key: str) -> None:
    at.toggle(key=f"{key}.data").set_value(True).run()
    at.number_input(key=f"{key}.data.batches").set_value(BATCHES).run()
    assert not at.exception and not errors(at)
    costs, spans = _expected()
    hist, steps, _ = _data_figures(at, first)
    assert np.allclose(np.sort(array(hist["data"][0]["x"])), np.sort(costs))
    static, planned = (array(t["y"]) for t in steps["data"][:2])
    assert np.allclose(static, spans, rtol=1e-12)
    assert np.all(planned <= static * (1 + 1e-12))  # per_batch never slower than static on its batch
    # Pick batch 4: its Gantt chart is the plan it got, ending at its per-batch makespan.
    at.selectbox(key=f"{key}.data.batch").select(4).run()
    hist, steps, gantt = _data_figures(at, first)
    planned = array(steps["data"][1]["y"])
    ends = [float(np.max(array(t["base"]) + array(t["x"]))) for t in gantt["data"]
            if t.get("type") == "bar" and "base" in t and len(array(t["x"]))]
    assert max(ends) == pytest.approx(planned[4], rel=1e-12)
    assert gantt["layout"]["title"]["text"].startswith("Batch 4: ")
    assert any(shown(c.value).startswith("Batch 4: ") and "microbatch order" in c.value for c in at.caption)


def test_the_designer_s_data_view_draws_costs_steps_and_a_batch_s_plan(db_url):
    at = _with_data(start_app(), "designer")
    assert not at.exception and not errors(at)
    _check(at, 3, "designer")  # after the Designer's Gantt, idle and memory charts


def test_compare_s_data_view_draws_the_picked_term(db_url):
    at = _with_data(start_app(), "compare")
    at.text_area(key="cmp.terms").input(f"1f1b(p=4, m=4)\n{TERM}").run()
    at.selectbox(key="cmp.data_term").select(TERM).run()
    _check(at, 1, "cmp")  # after Compare's stacked Gantt


def test_no_data_section_no_data_view(db_url):
    at = open_page(start_app(), "designer")
    assert not any(t.key == "designer.data" for t in at.toggle)
