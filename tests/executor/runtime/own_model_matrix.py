"""Issue 13's schedule list for own models: HF tiny LLaVA, HF tiny Qwen2.5-VL and
the examples plug-in, with a trainable and a frozen vision tower, under 1f1b,
interleaved, zbv and transpose prefix/dynamic with owner and recompute backward."""
from __future__ import annotations

from executor.runtime.jobs import Job
from executor.runtime.models.loader import load_model
from executor.runtime.models.workload import model_workload
from mpipe_core.api import evaluate
from mpipe_core.runs.model_spec import BatchShape, ModelSpec
from mpipe_core.workloads.workload import load_workload

SHAPE = BatchShape(microbatch_size=1, images=2, text_len=8)
MODELS = {
    "llava": ("hf:llava", "tiny", "tiny-frozen"),
    "qwen2_5_vl": ("hf:qwen2_5_vl", "tiny", "tiny-frozen"),
    "example": ("examples.tiny_mllm:build", None, "frozen"),
}
GENERATORS = ["1f1b(p={p}, m={m})", "interleaved(p={p}, m={m}, v=2)", "zbv(p={p}, m={m})"]
TRANSPOSE_TRAIN = [
    "transpose(1f1b(p={p}, m={m}), mode=prefix)",  # recompute backward (the reference default)
    "transpose(interleaved(p={p}, m={m}, v=2), mode=prefix, backward=owner)",
    "transpose(zbv(p={p}, m={m}), mode=dynamic, shards=2)",
    "transpose(1f1b(p={p}, m={m}), mode=dynamic, backward=owner)",
]
TRANSPOSE_FROZEN = ["transpose(1f1b(p={p}, m={m}), mode=prefix)",
                    "transpose(zbv(p={p}, m={m}), mode=dynamic, shards=2)"]


def spec_for(model: str, frozen: bool) -> ModelSpec:
    name, train_cfg, frozen_cfg = MODELS[model]
    return ModelSpec(name, frozen_cfg if frozen else train_cfg, SHAPE)


def own_job(term: str, spec: ModelSpec, **kw) -> Job:
    workload = load_workload(model_workload(load_model(spec)))
    ev = evaluate(term, workload)
    job = Job.make(f"{spec} {ev.term}", ev.schedule, spec, check_grads=True, **kw)
    return job


def matrix_jobs(model: str, p: int = 2, m: int = 4) -> list[Job]:
    jobs = []
    for frozen in (False, True):
        spec = spec_for(model, frozen)
        terms = GENERATORS + (TRANSPOSE_FROZEN if frozen else TRANSPOSE_TRAIN)
        jobs += [own_job(t.format(p=p, m=m), spec) for t in terms]
    return jobs
