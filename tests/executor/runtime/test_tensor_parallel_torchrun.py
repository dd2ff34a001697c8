"""Tensor and sequence parallelism over torchrun and gloo (issue 39 section 2): the
built-in MLLM and the example plug-in sharded with DTensor on the mesh's tp
dimension, each run's gradients gathered and checked against one process; a
swap of two tp ranks' weight shards must fail that check.  Each rank's static
memory is the simulator's figure for the layout (a profiled workload, its tp
share divided over tp), and DTensor's collectives come back as tp_comm rows."""
import pytest

from executor.runtime.jobs import Job
from executor.runtime.model import ModelConfig
from executor.runtime.models.loader import load_model
from executor.runtime.models.workload import model_workload
from executor.service.launch import LaunchOptions, launch
from mpipe_core.api import evaluate
from mpipe_core.runs.model_spec import BatchShape, ModelSpec

from executor_matrix import job
from layout_static import static_ratios

pytestmark = pytest.mark.slow

TRAIN = ModelConfig()  # the tower trainable: its gradients come back through the sp embedding
PLUGIN = ModelSpec("examples.tiny_mllm:build", None, BatchShape(microbatch_size=1, images=2, text_len=8))
SWAPPED = "llm.blocks.0.fc.weight"


def _failures(result) -> list[str]:
    return result.grad_check["steps"][0]["failures"]


@pytest.fixture(scope="module")
def tiny_profile():
    """`mpipe profile` of the built-in tiny MLLM (TRAIN's config), with its tp share."""
    from executor.runtime.models.profile import profile_model

    spec = ModelSpec("tiny")
    return profile_model(load_model(spec), spec, warmup=0, repeats=1)


def _tp_rows(result) -> list:
    return [c for c in result.comm if c.kind == "tp_comm"]


def test_tp2_pp2_with_sp_is_exact_and_a_swap_of_shards_is_caught(tmp_path):
    jobs = [job("1f1b(p=2, m=4)", TRAIN, layout={"tp": 2, "sp": True, "pp": 2}),
            job("1f1b(p=2, m=4)", TRAIN, layout={"tp": 2, "sp": True, "pp": 2},
                fault={"kind": "tp_swap_shards", "param": SWAPPED})]
    good, swapped = launch(jobs, LaunchOptions(nproc=4, stall_s=120, run_dir=str(tmp_path / "run")))
    assert good.grad_check["ok"], _failures(good)[:3]
    # One loss per step, not tp of them: the tp ranks' identical losses are counted once.
    assert good.grad_check["loss_error"] < 1e-4 and 4.0 < good.loss[0] < 4.3
    # DTensor's collectives (sp's gathers and reduce-scatters) timed inside the ops, on both stages.
    rows = _tp_rows(good)
    assert rows and {r.device for r in rows} == {0, 1} and all(r.end > r.start for r in rows)
    assert not swapped.grad_check["ok"]
    assert any(line.startswith(f"{SWAPPED}: gradient off by") for line in _failures(swapped)), _failures(swapped)


def test_tp2_pp2_dp2_with_sp_on_zbv_is_exact_with_and_without_zero(tmp_path, tiny_profile):
    layout = {"tp": 2, "sp": True, "pp": 2, "dp": 2}
    layouts = [layout, {**layout, "distributed_optimizer": True}]
    # (the second: ZeRO-1 over the local shards, each slice reduce-scattered over dp, stepped, all-gathered)
    jobs = [job("zbv(p=2, m=2)", TRAIN, layout=lay) for lay in layouts]
    results = launch(jobs, LaunchOptions(nproc=8, stall_s=120, run_dir=str(tmp_path / "run")))
    for lay, result in zip(layouts, results):
        assert result.grad_check["ok"], _failures(result)[:3]
        assert {"tp_comm", "dp_comm", "optimizer"} <= {c.kind for c in result.comm}
        # Static memory: the simulator's figure for the layout, not the unsharded one.
        sharded, whole = static_ratios(tiny_profile, "zbv(p=2, m=2)", lay, result.memory)
        assert len(sharded) == 2 and all(abs(r - 1) <= 0.01 for r in sharded), sharded
        assert all(r > 1.2 for r in whole), whole
    assert "dp_gather" in {c.kind for c in results[1].comm}


def test_the_example_plugin_runs_tp2_with_its_own_plan(tmp_path):
    term = "1f1b(p=2, m=4)"
    ev = evaluate(term, model_workload(load_model(PLUGIN)))
    j = Job.make(term, ev.schedule, PLUGIN, check_grads=True, layout={"tp": 2, "sp": True, "pp": 2})
    [result] = launch([j], LaunchOptions(nproc=4, stall_s=120, run_dir=str(tmp_path / "run")))
    assert result.grad_check["ok"], _failures(result)[:3]


def test_tp2_with_encoder_shard_is_exact_a_skipped_gather_is_caught_and_memory_meets(tmp_path, tiny_profile):
    # transpose's two trained copies of the tower per tp coordinate shard its state; each copy
    # holds one tp shard of the tower, so the copies' slices are of local shards.
    term = "transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)"
    layout = {"tp": 2, "sp": True, "pp": 2, "encoder_shard": "gradients"}
    jobs = [job(term, TRAIN, layout=layout),
            job(term, TRAIN, layout=layout, fault={"kind": "skip_encoder_gather", "global_rank": 1})]
    good, skipped = launch(jobs, LaunchOptions(nproc=4, stall_s=120, run_dir=str(tmp_path / "run")))
    assert good.grad_check["ok"], _failures(good)[:3]
    sharded, _ = static_ratios(tiny_profile, term, layout, good.memory)
    assert len(sharded) == 2 and all(abs(r - 1) <= 0.01 for r in sharded), sharded
    assert not skipped.grad_check["ok"]
    assert any(line.startswith("vision.") and "parameter after the last step off by" in line
               for line in skipped.grad_check["steps"][-1]["failures"]), skipped.grad_check["steps"][-1]["failures"][:3]
