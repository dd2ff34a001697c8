"""The schedules the executor tests run: every generator, the encoder baselines
and every transpose variant, on the tiny model."""
from __future__ import annotations

from mpipe_core.api import evaluate

from executor.runtime.jobs import Job
from executor.runtime.model import ModelConfig
from executor.runtime.model_workload import workload_for

TEXT = ModelConfig(encoder=None)
TRAIN = ModelConfig(images_min=1, images_max=3, batch=2)  # variable images per microbatch
FROZEN = ModelConfig(trainable_encoder=False)

LLM_TERMS = ["gpipe(p={p}, m={m})", "1f1b(p={p}, m={m})", "interleaved(p={p}, m={m}, v=2)",
             "zb_h1(p={p}, m={m})", "zbv(p={p}, m={m})", "dualpipev(p={p}, m={m})"]
EXTRA_LLM_TERMS = ["looped_bfs(p={p}, m={m})", "zb_h2(p={p}, m={m})", "defer_w(split_bw(1f1b(p={p}, m={m})))"]
FUSED_TERMS = ["1f1b(p={p}, m={m})", "zb_h1(p={p}, m={m})", "zbv(p={p}, m={m})"]
TRANSPOSE_TERMS = [
    ("frozen", "transpose(1f1b(p={p}, m={m}), mode=prefix)"),
    ("train", "transpose(interleaved(p={p}, m={m}), mode=prefix)"),  # recompute backward
    ("train", "transpose(1f1b(p={p}, m={m}), mode=prefix, backward=owner)"),
    ("train", "transpose(zb_h1(p={p}, m={m}), mode=dynamic, shards=2)"),
    ("train", "transpose(zbv(p={p}, m={m}), mode=dynamic, shards=2, backward=owner)"),
]


def job(term: str, cfg: ModelConfig, **kw) -> Job:
    ev = evaluate(term, workload_for(cfg))
    return Job.make(term, ev.schedule, cfg, check_grads=True, **kw)


def required_jobs(p: int, m: int = 8) -> list[Job]:
    """Issue 5's list: generators, fused baseline, transpose variants, two steps in a row."""
    jobs = [job(t.format(p=p, m=m), TEXT) for t in LLM_TERMS]
    jobs += [job(t.format(p=p, m=m), TRAIN) for t in FUSED_TERMS[:1]]
    jobs += [job(t.format(p=p, m=m), {"train": TRAIN, "frozen": FROZEN}[k]) for k, t in TRANSPOSE_TERMS]
    # recompute(...) for real: chunk 0 fully (beside a fused encoder), every layer under split B/W
    jobs.append(job(f"recompute(1f1b(p={p}, m={m}), chunks=[0])", TRAIN))
    jobs.append(job(f"recompute(zb_h1(p={p}, m={m}))", TEXT))
    jobs.append(job(f"zbv(p={p}, m={m})", TEXT, steps=2))
    jobs.append(job(f"transpose(1f1b(p={p}, m={m}), mode=prefix, backward=owner)", TRAIN, steps=2))
    for j in jobs:
        if j.steps == 2:
            j.name += " [2 steps]"
    return jobs


def kinds_in(j: Job) -> set[str]:
    return {op[1] for order in j.schedule["orders"] for op in order if op[0] != "llm"}
