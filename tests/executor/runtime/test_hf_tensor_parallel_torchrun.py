"""Tensor parallelism for the HF models over torchrun and gloo (issue 39 section 2):
transformers' own tp plan for the LLM, ours for the vision tower and projector
(`models.hf_tensor_parallel`), each run's gradients gathered over tp and checked
against the single-process HF model; a swap of two tp ranks' shards of one weight
(which also shows that weight was sharded: an unsharded one is an error) must fail
that check."""
import pytest
from layout_static import static_ratios
from own_model_matrix import SHAPE, own_job

from executor.service.launch import LaunchOptions, launch
from mpipe_core.runs.model_spec import ModelSpec

pytestmark = pytest.mark.slow


def _failures(result) -> list[str]:
    return result.grad_check["steps"][0]["failures"]


def _exact_and_swap_caught(spec: ModelSpec, term: str, layout: dict, swapped: str, nproc: int, tmp_path):
    jobs = [own_job(term, spec, layout=layout),
            own_job(term, spec, layout=layout, fault={"kind": "tp_swap_shards", "param": swapped})]
    jobs[1].name += " [swapped]"
    good, bad = launch(jobs, LaunchOptions(nproc=nproc, stall_s=120, run_dir=str(tmp_path / "run")))
    assert good.grad_check["ok"], _failures(good)[:3]
    assert good.grad_check["loss_error"] < 1e-4
    assert not bad.grad_check["ok"]
    assert any(line.startswith(f"{swapped}: gradient off by") for line in _failures(bad)), _failures(bad)


def test_llava_tp2_pp2_with_sp_is_exact_and_its_static_memory_is_the_simulators(tmp_path):
    # The tower trains: its sharded CLIP layers and projector are checked with the LLM's layers
    # (a swap of a tower shard is caught: `python -m benchmarks layout`).
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.profile import profile_model

    spec, term, layout = ModelSpec("hf:llava", "tiny", SHAPE), "1f1b(p=2, m=2)", {"tp": 2, "sp": True, "pp": 2}
    j = own_job(term, spec, layout=layout)
    [result] = launch([j], LaunchOptions(nproc=4, stall_s=120, run_dir=str(tmp_path / "run")))
    assert result.grad_check["ok"], _failures(result)[:3]
    assert result.grad_check["loss_error"] < 1e-4
    # transformers' plan and ours for the tower, as the profile's tp share: 1.000 on each rank.
    ratios, _ = static_ratios(profile_model(load_model(spec), spec, warmup=0, repeats=1), term, layout, result.memory)
    assert len(ratios) == 2 and all(abs(r - 1) <= 0.01 for r in ratios), ratios


def test_qwen2_5_vl_tp2_dp2_is_exact_and_a_swapped_kv_shard_is_caught(tmp_path):
    # Two query heads per key/value head on each tp rank (GQA); the ViT's fused qkv head-aware.
    _exact_and_swap_caught(ModelSpec("hf:qwen2_5_vl", "tiny", SHAPE), "1f1b(p=1, m=2)", {"tp": 2, "dp": 2},
                           "model.language_model.layers.0.self_attn.k_proj.weight", 4, tmp_path)
