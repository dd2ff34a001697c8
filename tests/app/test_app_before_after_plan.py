"""Before / after compares with what you would run: opened from a plan, a transpose is
compared with the plan's winner (not a fused straw man), the Designer shows the plan's
workload under the plan's name (no stale loader, no "(edited)"), when the transpose does
not fit the page offers the fastest way to make it fit as one click with its step time,
and the encoder layers `balanced` folds into the chain are shown where they went."""
from __future__ import annotations

from app_helpers import button, metric, open_page, start_app

from mpipe_core.api import evaluate
from mpipe_core.search.make_fit import way_to_fit
from mpipe_core.search.plan import plan
from mpipe_core.workloads.presets import preset_document
from mpipe_core.workloads.units import seconds

BUDGET = 30  # terms: a small plan of InternVL-26B on 16 CloudMatrix384 dies


def _plan_then_designer():
    at = open_page(start_app(), "plan")
    at.selectbox(key="plan.wl.preset").select("internvl-26b")
    at.number_input(key="plan.devices").set_value(16)
    at.number_input(key="plan.batch").set_value(16)
    at.selectbox(key="plan.cluster").select("cloudmatrix384")
    at.number_input(key="plan.budget").set_value(BUDGET)
    button(at, "Plan").click().run()
    assert not at.exception
    button(at, "Open in Designer").click().run()
    return at


def test_opened_from_a_plan_before_after_compares_the_transpose_with_the_plan_s_winner(db_url):
    expected = plan(preset_document("internvl-26b"), 16, 16, "cloudmatrix384", top=5, max_evaluations=BUDGET)
    best = expected.best
    at = _plan_then_designer()
    # The Designer: the plan's document, under the plan's name, the loader on its preset.
    assert not at.exception
    assert at.selectbox(key="wl.load").value == "internvl-26b"
    title = [c for c in at.get("plotly_chart")][0].proto.spec
    assert f"on internvl-26b at {best.layout.label()}" in title and "(edited)" not in title

    open_page(at, "before_after")
    assert not at.exception
    before, after = at.text_input(key="ba.before").value, at.text_input(key="ba.after").value
    assert before == best.term and "balanced(" in before  # the plan's winner, what you would run
    assert after.startswith("transpose(") and "balanced(" not in after
    transposed = evaluate(after, best.document)
    assert metric(at, "Step speedup") == f"{best.step_time_s / transposed.step.step_time_s:.3g}x"

    # The winner folds the vision tower's layers into the first chunks: they are shown, not "0 encoder ops".
    moved = next(f.value for f in at.dataframe if "layers folded in before" in f.value.columns)
    assert moved["layers folded in before"].sum() > 0 and moved["layers folded in after"].sum() == 0

    # Over the device's memory with no way to fit at this layout: said so, no button.
    assert max(transposed.metrics.peak_memory) > transposed.workload.capacity
    assert way_to_fit(after, best.document) is None
    assert any(i.value.startswith("No recompute of the encoders") for i in at.info)


def test_when_neither_side_fits_a_click_makes_the_transpose_fit_with_its_step_time(db_url):
    """The 512-die layout of the README (tp=2 cp=2 pp=4 dp=32): fused zbv needs 198 GB, its transpose
    129 GB, a die has 64; sharding the tower's state and recomputing its ops fits."""
    import json

    from mpipe_core.search.plan_space import Layout, layout_document

    doc = layout_document(preset_document("internvl-26b"), Layout(2, 2, 4, 32, 1, True, 1), "cloudmatrix384")
    term = "transpose(zbv(p=4, m=16), mode=dynamic)"
    at = open_page(start_app(), "designer")
    at.radio(key="wl.source").set_value("JSON").run()
    at.text_area(key="wl.json").input(json.dumps(doc)).run()
    at.text_area(key="designer.term").input(term).run()
    open_page(at, "before_after")
    assert not at.exception
    assert (at.text_input(key="ba.before").value, at.text_input(key="ba.after").value) == ("zbv(p=4, m=16)", term)
    assert metric(at, "Fits after") == "no"
    fix = way_to_fit(term, doc)
    assert fix is not None and fix.workload_changes and fix.peak_memory <= 64
    make = button(at, "Make it fit: ")
    assert make.label == (f"Make it fit: {fix.term} with {', '.join(fix.workload_changes)} "
                          f"(step time {seconds(fix.step_time_s)})")
    make.click().run()
    assert not at.exception
    assert at.text_input(key="ba.after").value == fix.term
    assert metric(at, "Fits after") == "yes"
    assert json.loads(at.text_area(key="wl.json").value) == fix.document  # the sharded workload, on both sides
