"""`--precision bf16`: bf16 compute, fp32 master weights and gradient reductions,
checked against a bf16 single-process reference at `BF16_TOLERANCE`."""
import json

import pytest
import torch

from executor.runtime.jobs import Job
from executor.runtime.model import ModelConfig
from executor.runtime.model_workload import workload_for
from executor.runtime.models.builtin import BuiltinModel
from executor.runtime.precision import BF16_TOLERANCE
from executor.runtime.rank import run_local
from executor.runtime.reference import compare_tensors, reference_run
from executor.runtime.runtime import OptimizerSpec
from mpipe_core.api import evaluate
from mpipe_core.runs.model_spec import BatchShape, ModelSpec

TRAIN = ModelConfig(images_min=1, images_max=3, batch=2)
PLUGIN = ModelSpec("examples.tiny_mllm:build", None, BatchShape(microbatch_size=1, images=2, text_len=8))


def bf16_job(term: str, model=TRAIN, workload=None, **kw) -> Job:
    ev = evaluate(term, workload or workload_for(TRAIN))
    return Job.make(term, ev.schedule, model, check_grads=True, precision="bf16", **kw)


def test_bf16_runs_match_a_bf16_reference():
    heavy = json.loads(json.dumps(workload_for(TRAIN)))
    heavy["encoders"][0].update(f=20.0, b=20.0, w=20.0)  # balanced folds the tower across both stages
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.workload import model_workload

    jobs = [bf16_job("1f1b(p=2, m=4)", steps=2),
            bf16_job("transpose(zbv(p=2, m=4), mode=dynamic, shards=2, backward=owner)"),
            bf16_job("recompute(zb_h1(p=2, m=4))"),
            bf16_job("balanced(zbv(p=2, m=4))", workload=heavy),
            bf16_job("transpose(1f1b(p=2, m=4), mode=prefix)", PLUGIN, model_workload(load_model(PLUGIN)))]
    results = run_local(jobs, 2)
    for r in results:
        check = r.grad_check
        assert check["ok"], (r.name, check["steps"][-1]["failures"][:3])
        assert check["precision"] == "bf16"  # judged against a reference under the same autocast


def test_bf16_computes_in_bf16_with_fp32_master_weights_and_gradients():
    """The rule is tight enough to tell bf16 compute from fp32: most gradients of the
    bf16 reference are outside it of the fp32 one's."""
    cfg = ModelConfig()
    fp32, _ = reference_run(BuiltinModel(cfg), 4, 1, OptimizerSpec(), precision="fp32")
    bf16, final16 = reference_run(BuiltinModel(cfg), 4, 1, OptimizerSpec(), precision="bf16")
    assert all(g.dtype == torch.float32 for g in bf16[0].grads.values())
    assert all(p.dtype == torch.float32 for p in final16.values())
    floor = max(float(g.abs().max()) for g in fp32[0].grads.values())
    outside = [k for k, g in fp32[0].grads.items()
               if not compare_tensors(bf16[0].grads[k], g, floor, BF16_TOLERANCE)[2]]
    assert len(outside) > len(fp32[0].grads) // 3


@pytest.mark.parametrize("param", ["llm.blocks.7.fc.weight", "vision.blocks.0.attn.qkv.weight"])
def test_the_bf16_check_catches_a_dropped_replica_gradient(param):
    """Halving a gradient is what averaging two data-parallel replicas leaves when one
    replica's gradient is dropped: the bf16 check must fail on it."""
    j = bf16_job("transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)")
    j.fault = {"rank": 1, "kind": "wrong_grad", "param": param, "scale": 0.5}
    (r,) = run_local([j], 2)
    assert not r.grad_check["ok"]
    assert r.grad_check["steps"][0]["failures"][0].startswith(f"{param}: gradient off by")
