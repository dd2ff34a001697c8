"""The Plan page: `mpipe plan` from the page, its candidates against peak memory,
the chosen layout's device map, breakdown and launch arguments, its refusals in
the page's words, and one click from a candidate to the Designer."""
from __future__ import annotations

import json

from app_helpers import array, button, errors, figure, metric, open_page, shown, start_app

from app.plan_view import PlanInputs, search
from app.evaluation import canonical_json
from mpipe_core.api import evaluate
from mpipe_core.search.budget import DEFAULT_EVALUATIONS
from mpipe_core.search.plan import device_map
from mpipe_core.workloads.presets import preset_document
from mpipe_core.workloads.units import seconds

# llama2-7b on one DGX A100 node: the whole space is searched in well under the limit (nothing left by it).
INPUTS = PlanInputs(canonical_json(preset_document("llama2-7b")), 8, 8, "dgx-a100", "capacity", 3, DEFAULT_EVALUATIONS)


def _plan(at, devices=8, batch=8, cluster="dgx-a100", preset="llama2-7b"):
    at.selectbox(key="plan.wl.preset").select(preset)
    at.number_input(key="plan.devices").set_value(devices)
    at.number_input(key="plan.batch").set_value(batch)
    at.selectbox(key="plan.cluster").select(cluster)
    at.number_input(key="plan.top").set_value(3)
    return button(at, "Plan").click().run()


def test_plan_shows_the_cli_s_best_its_candidates_map_breakdown_and_arguments(db_url):
    at = open_page(start_app(), "plan")
    assert [i.value for i in at.info] == ["Set the workload, devices, global batch, cluster and memory cap, then Plan."]
    _plan(at)
    assert not at.exception and not errors(at)
    expected = search(INPUTS)
    assert expected.searched["not_tried"] == 0  # the whole space: the page's search is the same one
    best = expected.best
    assert metric(at, "Best step time") == seconds(best.step_time_s)
    assert metric(at, "MFU") == f"{best.mfu:.1%}"
    # The scatter: every candidate once, by family (or over the cap), the cap as a vertical line.
    traces = figure(at, 0)["data"]
    families = {c.family for c in expected.candidates}
    by_name = {t["name"]: t for t in traces}
    assert families <= set(by_name)
    drawn = sum(len(array(by_name[f]["x"])) for f in families) + len(array(by_name.get("▲ over the memory cap",
                                                                                          {"x": []})["x"]))
    assert drawn == len(expected.candidates)
    cap = next(t for t in traces if t["name"].startswith("memory cap"))
    assert set(array(cap["x"])) == {expected.memory_cap} == {80.0}  # an A100 80 GB
    # The breakdown adds up to the step time.
    parts = sum(float(array(t["x"])[0]) for t in figure(at, 1)["data"])
    assert abs(parts - best.step_time_s) < 1e-9 * best.step_time_s
    # The device map: every rank drawn; rank 0's groups listed as the core computes them.
    dmap = device_map(best, expected.cluster)
    ranks = figure(at, 2)["data"][0]
    assert len(array(ranks["x"])) == 8 and list(array(ranks["marker"]["color"])) == [r["pp"] for r in dmap["ranks"]]
    table = at.dataframe[0].value
    assert list(table["group"]) == ["TP", "CP", "DP", "PP"]
    assert list(table["rank 0's"]) == [str(next(g for g in dmap["groups"][d] if 0 in g)) for d in ("tp", "cp", "dp",
                                                                                                    "pp")]
    # Launch arguments: Megatron's for a 1F1B / interleaved body, else the refusal as a note.
    texts = [c.value for c in at.code]
    notes = [i.value for i in at.info]
    assert any(f"--tensor-model-parallel-size {best.layout.tp}" in t for t in texts) or notes


def _runs(candidate, target: str) -> bool:
    """The exporter on the candidate's full evaluation (independently of the page's `formats.runnable`)."""
    from mpipe_core.errors import MpipeError
    from mpipe_core.formats.launch_config import emit

    try:
        emit(candidate.document, candidate.term, INPUTS.global_batch, target)
    except MpipeError:
        return False
    return True


def test_launch_arguments_give_each_stack_s_fastest_runnable_layout_and_its_slowdown(db_url):
    from mpipe_core.formats.launch_config import emit

    at = _plan(open_page(start_app(), "plan"))
    expected = search(INPUTS)
    fitting = [c for c in expected.candidates if c.within_cap]
    notes = [shown(i.value) for i in at.info]
    codes = [c.value for c in at.code]
    # Megatron-LM does not run the winner's split backward: the page says so and gives the layout it runs.
    index = next(i for i, c in enumerate(fitting) if _runs(c, "megatron"))
    assert index > 0 and not _runs(fitting[0], "megatron")
    chosen = fitting[index]
    slower = chosen.step_time_s / fitting[0].step_time_s - 1
    skipped = "#1" if index == 1 else f"#1–#{index}"
    note = next(n for n in notes if n.startswith("Megatron-LM cannot run"))
    assert note.startswith(f"Megatron-LM cannot run {skipped}; #{index + 1} is {slower:.1%} slower: "
                           f"{chosen.layout.label()} {chosen.term}. #1: --format megatron cannot express ")
    assert emit(chosen.document, chosen.term, INPUTS.global_batch, "megatron").rstrip("\n") in codes
    # torchtitan runs the winner itself: its files, no note.
    assert _runs(fitting[0], "torchtitan") and not any(n.startswith("torchtitan") for n in notes)
    assert emit(fitting[0].document, fitting[0].term, INPUTS.global_batch, "torchtitan").split("# schedule.csv\n")[1] \
        .rstrip("\n") in codes
    # A picked candidate the stack cannot run: the note names it and still the fastest runnable layout.
    at.selectbox(key="plan.picked").select(1).run()
    assert not at.exception and not errors(at)
    note = next(shown(i.value) for i in at.info if shown(i.value).startswith("Megatron-LM cannot run"))
    assert note.startswith("Megatron-LM cannot run #2: --format megatron cannot express ")
    assert f"The fastest layout it can run is #{index + 1}, {slower:.1%} slower than #1: " \
           f"{chosen.layout.label()} {chosen.term}" in note
    # beyond the top K the search pruned against others: the page says how to rank exactly
    assert note.endswith("`mpipe plan --runnable-by megatron` ranks what Megatron-LM can run exactly)") == \
        (index >= INPUTS.top)


def test_open_in_designer_shows_the_candidate_s_step_time(db_url):
    at = _plan(open_page(start_app(), "plan"))
    expected = search(INPUTS)
    pick = 1  # not the best: any candidate opens on its own workload document
    at.selectbox(key="plan.picked").select(pick).run()
    chosen = expected.candidates[pick]
    button(at, "Open in Designer").click().run()
    assert not at.exception and not errors(at)
    assert at.text_area(key="designer.term").value == chosen.term
    assert json.loads(at.text_area(key="wl.json").value) == chosen.document
    assert metric(at, "Step time") == seconds(chosen.step_time_s)
    assert metric(at, "MFU") == f"{chosen.mfu:.1%}"
    assert evaluate(chosen.term, chosen.document).step.step_time_s == chosen.step_time_s


def test_the_cli_s_refusals_are_one_message_in_the_page_s_words(db_url):
    at = _plan(open_page(start_app(), "plan"), devices=12)
    assert errors(at) == ["devices 12 is not a multiple of the cluster's 8 devices per node (dgx-a100): a layout "
                          "beyond one node needs whole nodes"]
    at = _plan(at, devices=8, preset="vit-heavy-small")
    assert errors(at) == ["plan needs an analytic workload (one that names a model and a device); this one states "
                          "its costs explicitly"]
    assert not at.get("plotly_chart")


def test_the_search_runs_in_a_child_that_reports_its_progress_and_gives_plan_s_answer():
    from app.plan_view import run_plan

    seen = []
    result = run_plan(INPUTS, lambda done, total, what: seen.append((done, total, what)))
    expected = search(INPUTS)
    assert [(c.term, c.layout, c.step_time_s) for c in result.candidates] == \
        [(c.term, c.layout, c.step_time_s) for c in expected.candidates]
    totals = {t for _, t, _ in seen if t > 0}
    assert totals == {expected.searched["terms"]} and seen[-1][0] == seen[-1][1]  # it ends at "done"
    assert [d for d, t, _ in seen if t > 0] == sorted(d for d, t, _ in seen if t > 0)


def test_a_refusal_from_the_child_is_one_error_in_the_page_s_words():
    import pytest

    from app.plan_view import run_plan
    from mpipe_core.errors import MpipeError

    with pytest.raises(MpipeError) as caught:
        run_plan(PlanInputs(INPUTS.document, 8, 0, "dgx-a100", "capacity", 3, 10), lambda *a: None)
    assert caught.value.message == "the global batch must be >= 1 (got 0)"


def test_the_child_never_reruns_the_page_script(capfd, monkeypatch):
    """Under Streamlit `__main__` is the app script (with its `__file__`): a spawned child
    that re-ran it printed a dozen "missing ScriptRunContext" warnings on every Plan."""
    import sys
    import types

    from app.plan_view import run_plan
    from app_helpers import MAIN

    page = types.ModuleType("__main__")
    page.__file__ = str(MAIN)
    monkeypatch.setitem(sys.modules, "__main__", page)
    small = PlanInputs(INPUTS.document, 8, 8, "dgx-a100", "capacity", 1, 5)
    assert run_plan(small, lambda *a: None).best is not None
    assert sys.modules["__main__"] is page  # put back
    assert "ScriptRunContext" not in capfd.readouterr().err
