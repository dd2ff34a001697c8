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


def test_runs_shows_a_data_run_s_measured_steps_against_each_step_s_prediction(db_url):
    """A finished data run with its step plans stored: the Runs page sets each step's measured
    makespan beside the makespan predicted for the plan it ran (the workload's unit is ms)."""
    from test_app_newcomer import synthetic_timings

    from storage import add_timings, claim_next_run, enqueue, finish_run, get_run, save_schedule
    from storage.db import open_database

    db = open_database(db_url)
    save_schedule(db, "d", TERM, workload=DATA_WORKLOAD)
    run = enqueue(db, "d", steps=3)
    claim_next_run(db, "w", 60)
    _, rows = synthetic_timings(TERM, DATA_WORKLOAD, 3, stretch=[1.0, 1.2, 0.9])
    add_timings(db, run.id, rows)
    plans = [{"step": s, "how": "heavy first", "digest": f"abc{s}", "predicted_makespan": 40.0 + s,
              "static_makespan": 41.0 + s, "order": [0, 1, 2, 3]} for s in range(3)]
    finish_run(db, run.id, "w", "succeeded", exit_code=0, step_plans=plans)
    assert get_run(db, run.id).step_plans == [{k: p[k] for k in ("step", "how", "digest", "predicted_makespan",
                                                                 "static_makespan")} for p in plans]
    at = open_page(start_app(), "runs")
    at.selectbox(key="runs.selected").set_value(run.id).run()
    assert not at.exception
    fig = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
               if "Per-step makespan" in json.loads(c.proto.spec)["layout"]["title"]["text"])
    measured, predicted = (array(t["y"]) for t in fig["data"])
    assert list(predicted) == [40.0, 41.0, 42.0]
    by_step = {}
    for r in rows:
        lo, hi = by_step.get(r.step, (r.start, r.end))
        by_step[r.step] = (min(lo, r.start), max(hi, r.end))
    assert np.allclose(measured, [(hi - lo) * 1000 for lo, hi in (by_step[s] for s in range(3))])
