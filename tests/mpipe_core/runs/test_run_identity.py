"""Which model a run ran against what its workload describes (`run_identity`)."""
from __future__ import annotations

from mpipe_core.runs.run_identity import dropped_layout, identity_lines, same_model, workload_devices, workload_model
from mpipe_core.workloads.presets import preset_document

PROFILE_OF_TINY = {"name": "profile:tiny", "origin": {"model": {"model": "tiny"}, "device": "cpu"},
                   "units": {"time": "s", "memory": "bytes"}, "llm": {"layers": 8, "f": 1e-3}}
INTERNVL_512 = dict(preset_document("internvl-26b"), parallel={"tp": 8, "dp": 16, "sp": True})


def test_a_workload_is_the_models_own_when_profiled_from_it_or_its_structure():
    assert same_model(PROFILE_OF_TINY, "tiny") and same_model(PROFILE_OF_TINY, "")  # "": built-in sized from it
    assert not same_model(PROFILE_OF_TINY, "hf:llava")
    assert same_model({"name": "model:hf:llava", "llm": {"layers": 4}}, "hf:llava")
    assert not same_model({"name": "model:tiny", "llm": {"layers": 4}}, "hf:llava")
    # Costs only: the built-in model sized from it runs its structure.
    assert same_model({"name": "synthetic", "llm": {"layers": 2, "f": 1.0}}, "") and same_model(None, "")
    assert same_model({"name": "x", "units": {"time": "ms"}, "llm": {"layers": 2}}, "")
    # A model the executor never runs (an analytic workload), or costs written for another model.
    assert not same_model(INTERNVL_512, "") and not same_model(INTERNVL_512, "tiny")
    assert same_model({"name": "x", "llm": {"layers": 2}}, "hf:llava")  # hand-written for it


def test_the_dropped_layout_is_every_parallel_setting_beyond_the_pipeline():
    assert dropped_layout(INTERNVL_512) == ["tp=8", "dp=16", "sp"]
    assert workload_devices(INTERNVL_512, 4) == 512
    assert dropped_layout(preset_document("internvl-26b")) == [] and dropped_layout(None) == []
    assert dropped_layout({"parallel": {"tp": 1, "encoder_shard": "encoder"}}) == ["encoder_shard=encoder"]


def test_the_lines_name_the_model_the_devices_and_what_was_dropped():
    assert workload_model(INTERNVL_512) == "internvl-26b (model internlm2-20b on ascend-910c)"
    assert workload_model(PROFILE_OF_TINY) == "tiny as profiled on cpu"
    lines = identity_lines(INTERNVL_512, "", "the built-in model", 4, "gloo, CPU")
    assert lines == [
        "ran: the built-in model on 4 ranks (gloo, CPU)",
        "workload: internvl-26b (model internlm2-20b on ascend-910c), another model: a comparison with it is "
        "across models, not a prediction of this run",
        "dropped from the workload's layout: tp=8, dp=16, sp (it spans 512 devices; this run executed the "
        "4-device pipeline)"]
    assert identity_lines(PROFILE_OF_TINY, "tiny", "the built-in model tiny", 2, "gloo, CPU") == [
        "ran: the built-in model tiny on 2 ranks (gloo, CPU)"]
