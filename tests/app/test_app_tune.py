"""The Tune page: a search from the page, its front against both baselines,
and one click from a candidate to the Designer or Before / after."""
from __future__ import annotations

import numpy as np
from app_helpers import array, button, errors, figure, metric, open_page, start_app, table_of

from mpipe_core.api import evaluate
from mpipe_core.search.tune import tune
from mpipe_core.workloads.units import human


def _search(at):
    at.number_input(key="tune.devices").set_value(2)
    at.number_input(key="tune.microbatches").set_value(4)
    at.slider(key="tune.limit").set_value(5)
    return button(at, "Search").click().run()


def test_tune_draws_the_front_and_both_baselines_and_opens_a_candidate(db_url):
    at = open_page(start_app(), "tune")
    assert [i.value for i in at.info] == ["Set the workload, devices, microbatches and a memory cap, then Search."]
    _search(at)
    assert not at.exception and not errors(at)
    expected = tune("vit-heavy-small", 2, 4, None, 5.0)
    assert metric(at, "Best makespan") == human(expected.best.makespan)
    table = table_of(at, "term")
    assert list(table["term"]) == [c.term for c in expected.candidates]
    assert set(table["term"][table["on the front"] == "yes"]) == expected.pareto
    traces = {t["name"]: t for t in figure(at, 0)["data"]}
    for name, c in (("fused baseline", expected.fused), ("balanced baseline", expected.balanced)):
        assert (array(traces[name]["x"])[0], array(traces[name]["y"])[0]) == (c.makespan, c.peak_memory)
    front = traces["Pareto front"]
    assert set(front["text"]) == expected.pareto and np.all(np.diff(array(front["x"])) >= 0)
    # One click: the picked candidate in the Designer, on the same workload.
    picked = expected.candidates[1].term
    at.selectbox(key="tune.picked").select(picked).run()
    button(at, "Open in the Designer").click().run()
    assert at.text_area(key="designer.term").value == picked
    assert metric(at, "Makespan") == human(evaluate(picked, "vit-heavy-small").timeline.makespan)


def test_tune_opens_before_after_against_the_fused_baseline(db_url):
    at = _search(open_page(start_app(), "tune"))
    best = table_of(at, "term")["term"][0]
    button(at, "Before / after against the fused baseline").click().run()
    fused = tune("vit-heavy-small", 2, 4, None, 5.0).fused.term
    assert at.text_input(key="ba.after").value == best and at.text_input(key="ba.before").value == fused


def test_an_impossible_memory_cap_is_refused_without_cli_flags(db_url):
    at = open_page(start_app(), "tune")
    at.radio(key="tune.cap_mode").set_value("a cap of my own").run()
    at.number_input(key="tune.cap").set_value(0.5)
    _search(at)
    assert len(errors(at)) == 1 and "--" not in errors(at)[0] and errors(at)[0].startswith("the memory cap 0.5")


def test_after_the_inputs_change_the_results_keep_their_workload_and_open_on_it(db_url):
    from mpipe_core.workloads.units import quantity

    at = open_page(start_app(), "tune")
    at.selectbox(key="tune.wl.preset").select("llava-7b").run()
    at.radio(key="tune.cap_mode").set_value("no cap").run()
    _search(at)
    assert not at.exception and not errors(at), errors(at)
    expected = tune("llava-7b", 2, 4, None, 5.0)
    # The workload changes (to one without units): the results stay those of the search, in its units.
    at.selectbox(key="tune.wl.preset").select("vit-heavy-small").run()
    assert [w.value for w in at.warning] == ["These results are for other inputs: Search again to update them."]
    assert metric(at, "Best makespan") == quantity(expected.best.makespan, "ms")
    assert table_of(at, "term")["makespan"][0] == quantity(expected.best.makespan, "ms")
    # A candidate opens in the Designer on the workload it was found for, not the one now picked.
    picked = [c.term for c in expected.candidates if c.fits][1]
    at.selectbox(key="tune.picked").select(picked).run()
    button(at, "Open in the Designer").click().run()
    assert not at.exception and not errors(at), errors(at)
    assert at.text_area(key="designer.term").value == picked
    assert at.selectbox(key="wl.preset").value == "llava-7b"
    assert metric(at, "Makespan") == quantity(evaluate(picked, "llava-7b").timeline.makespan, "ms")
