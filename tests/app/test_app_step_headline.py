"""Step time and MFU as the headline where the evaluation has them (an analytic
workload's step model), on the Designer, Compare and Tune; an explicit workload
shows what it showed before."""
from __future__ import annotations

from app_helpers import button, errors, metric, open_page, start_app, table_of

from mpipe_core.api import evaluate
from mpipe_core.search.tune import tune
from mpipe_core.workloads.units import seconds

TERM = "1f1b(p=4, m=8)"


def _headline(term: str, workload: str) -> tuple[str, str]:
    step = evaluate(term, workload).step
    return seconds(step.step_time_s), f"{step.mfu:.1%}"


def test_the_designer_headlines_step_time_and_mfu_of_an_analytic_workload_only(db_url):
    at = open_page(start_app(), "designer")
    assert "Step time" not in [m.label for m in at.metric]  # vit-heavy-small: explicit costs, no step model
    at.selectbox(key="wl.preset").select("llama2-7b")
    at.text_area(key="designer.term").input(TERM).run()
    assert not at.exception and not errors(at)
    assert (metric(at, "Step time"), metric(at, "MFU")) == _headline(TERM, "llama2-7b")


def test_compare_has_step_time_and_mfu_columns_for_an_analytic_workload(db_url):
    at = open_page(start_app(), "compare")
    assert "step time" not in at.dataframe[0].value.columns
    at.selectbox(key="wl.preset").select("llama2-7b")
    at.text_area(key="cmp.terms").input(f"{TERM}\n1f1b(p=4, m=4)").run()
    table = at.dataframe[0].value
    assert list(table["step time"]) == [_headline(TERM, "llama2-7b")[0], _headline("1f1b(p=4, m=4)", "llama2-7b")[0]]
    assert list(table["MFU"]) == [_headline(TERM, "llama2-7b")[1], _headline("1f1b(p=4, m=4)", "llama2-7b")[1]]


def test_tune_headlines_the_best_s_step_time_and_mfu(db_url):
    at = open_page(start_app(), "tune")
    at.selectbox(key="tune.wl.preset").select("llama2-7b")
    at.number_input(key="tune.devices").set_value(2)
    at.number_input(key="tune.microbatches").set_value(4)
    at.slider(key="tune.limit").set_value(5)
    at = button(at, "Search").click().run()
    assert not at.exception and not errors(at)
    cap = at.session_state["tune.result"][1].memory_cap  # the device's memory, as the page's default asks
    best = tune("llama2-7b", 2, 4, cap, 5.0).best
    assert metric(at, "Step time") == seconds(best.step['step_time_s'])
    assert metric(at, "MFU") == f"{best.step['mfu']:.1%}"
    assert table_of(at, "term")["step time"][0] == seconds(best.step['step_time_s'])  # (the baselines come first)


def test_the_step_cards_say_what_the_device_figures_rest_on(db_url):
    from app.formatting import plain

    at = open_page(start_app(), "designer")
    at.selectbox(key="wl.preset").select("llama2-7b")
    at.text_area(key="designer.term").input(TERM).run()
    assert not at.exception and not errors(at)
    captions = [c.value for c in at.caption]
    assert plain("Device: a100 preset: efficiency 0.5 (a typical achieved fraction of peak: without a cluster there "
                 "is no roofline (docs/cluster.md))") in captions


def test_compare_says_what_the_step_times_rest_on(db_url):
    from app.formatting import plain

    at = open_page(start_app(), "compare")
    at.selectbox(key="wl.preset").select("llama2-7b")
    at.text_area(key="cmp.terms").input(f"{TERM}\n1f1b(p=4, m=4)").run()
    assert not at.exception and not errors(at)
    captions = [c.value for c in at.caption]
    assert sum(c.startswith(plain("Device: a100 preset: efficiency 0.5")) for c in captions) == 1


def test_tune_says_what_the_best_s_step_time_rests_on(db_url):
    from app.formatting import plain

    at = open_page(start_app(), "tune")
    at.selectbox(key="tune.wl.preset").select("llama2-7b")
    at.number_input(key="tune.devices").set_value(2)
    at.number_input(key="tune.microbatches").set_value(2)
    at.slider(key="tune.limit").set_value(2)
    at = button(at, "Search").click().run()
    assert not at.exception and not errors(at)
    assert plain("Device: a100 preset: efficiency 0.5 (a typical achieved fraction of peak: without a cluster there "
                 "is no roofline (docs/cluster.md))") in [c.value for c in at.caption]
