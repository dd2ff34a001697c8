"""Own models on the Runs page: the model picker fills a run's options as
`mpipe runs enqueue -o` would, refuses what `runs enqueue` refuses, and
profiles a model into a saved workload (the CLI in a subprocess: torch never
enters the app's process)."""
from __future__ import annotations

import pytest
from app_helpers import button, errors, open_page, shown, start_app

from mpipe_core.api import evaluate
from mpipe_core.model_spec import BatchShape, ModelSpec, spec_from_options
from storage import get_workload, list_runs, save_schedule

BOTH = pytest.mark.databases("sqlite", "postgresql")
TERM = "1f1b(p=2, m=4)"


def _runs_page(db, model_kind: str):
    save_schedule(db, "t2", TERM)  # no workload: an own model runs on its own structure
    at = open_page(start_app(), "runs")
    at.radio(key="runs.model.kind").set_value(model_kind).run()
    return at


@pytest.mark.slow
def test_picking_hf_llava_tiny_queues_the_options_spec_from_options_reads(db, db_url):
    at = _runs_page(db, "HuggingFace")
    at.selectbox(key="runs.model.hf").set_value("hf:llava")
    at.selectbox(key="runs.model.hf_config").set_value("tiny")
    at.number_input(key="runs.model.seq_len").set_value(12).run()
    button(at, "Launch").click().run()
    assert not at.exception and not errors(at), errors(at)
    [run] = list_runs(db)
    assert run.options == {"model": "hf:llava", "model_config": "tiny", "microbatch_size": 1, "seq_len": 12,
                           "images": 1}
    assert spec_from_options(run.options) == ModelSpec("hf:llava", "tiny", BatchShape(text_len=12))
    assert "Trains own model hf:llava (tiny): microbatches of 1 sample(s), 12 text tokens and 1 image(s) each." \
        in [shown(c.value) for c in at.caption]


@BOTH
def test_a_bad_plugin_path_is_refused_with_runs_enqueues_message(db, db_url):
    at = _runs_page(db, "Plug-in")
    at.text_input(key="runs.model.plugin").input("nosuch.mod:build").run()
    button(at, "Launch").click().run()
    assert not at.exception
    assert errors(at) == ["model nosuch.mod:build: cannot import module 'nosuch.mod': "
                          "ModuleNotFoundError: No module named 'nosuch'"]
    # The Options field and the picker may not both name the model.
    at.text_input(key="runs.options").input("model=tiny").run()
    button(at, "Launch").click().run()
    assert errors(at) == ["option model is given in Options and by the model picker; remove it from Options"]
    assert list_runs(db) == []


def test_profiling_the_example_plugin_saves_a_workload_evaluate_accepts(db, db_url):
    at = _runs_page(db, "Plug-in")
    at.text_input(key="runs.model.plugin").input("examples.tiny_mllm:build")
    at.text_input(key="runs.profile_name").input("bad name!").run()
    button(at, "Profile this model").click().run()
    assert errors(at) and errors(at)[0].startswith("invalid workload name")
    at.text_input(key="runs.profile_name").input("tiny-mllm-cpu").run()
    button(at, "Profile this model").click().run()
    assert not at.exception and not errors(at), errors(at)
    assert [shown(s.value) for s in at.success] == [
        "Saved workload tiny-mllm-cpu@1: pick saved:tiny-mllm-cpu in the Designer's saved workloads"]
    progress = at.code[0].value  # the profile's stderr lines, streamed while it ran
    assert "profiling examples.tiny_mllm:build on cpu" in progress and "wrote " in progress
    body = get_workload(db, "tiny-mllm-cpu").body
    assert body["origin"]["model"]["model"] == "examples.tiny_mllm:build"
    assert body["llm"]["layers"] == 4  # examples.tiny_mllm.LAYERS, as measured
    ev = evaluate(TERM, body)
    assert ev.workload.llm.layers == 4 and ev.timeline.makespan > 0


def test_a_failing_profile_shows_its_error_line(db, db_url):
    at = _runs_page(db, "Plug-in")
    at.text_input(key="runs.model.plugin").input("examples.tiny_mllm:nosuch")
    at.text_input(key="runs.profile_name").input("never-saved").run()
    button(at, "Profile this model").click().run()
    assert not at.exception
    assert errors(at) == ["model examples.tiny_mllm:nosuch: module 'examples.tiny_mllm' has no callable 'nosuch'"]
    assert not at.success
