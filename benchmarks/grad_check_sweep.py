"""The gradient check's sweep (issue 38): correct runs pass, mutated runs fail.

    python -m benchmarks grad-check [--seeds 50] [--families all|NAME,...]

For every schedule family below, `--seeds` seeded runs of the built-in tiny
MLLM (each seed its own weights, data and images per microbatch), ranks as
threads of this process (`run_local`, the in-process runner; two steps each,
AdamW three), each checked by `--check-grads`' rule
(`executor.runtime.gradient_agreement`).  Then the mutations a broken
schedule or runtime would leave, each of which must fail the check:
a dropped microbatch, a swapped encoder shard, an optimizer step skipped on
one rank (AdamW), one wrong gradient element.

The table gives per family the runs passed and the largest error/bound ratio
seen (1 is the bound; the rule's SAFETY factor 16 sits between the float32
reference's own error and the bound, so a run that rounds exactly as the
reference does shows 1/16).  The figures
do not depend on the machine's load: only on arithmetic.
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager

FAMILIES: dict[str, tuple[str, str]] = {  # name -> (term, model: "text" | "train" | "frozen")
    "gpipe": ("gpipe(p=2, m=4)", "text"),
    "1f1b": ("1f1b(p=2, m=4)", "text"),
    "interleaved": ("interleaved(p=2, m=4, v=2)", "text"),
    "zb_h1": ("zb_h1(p=2, m=4)", "text"),
    "zb_h2": ("zb_h2(p=2, m=4)", "text"),
    "zbv": ("zbv(p=2, m=4)", "text"),
    "dualpipev": ("dualpipev(p=2, m=4)", "text"),
    "looped_bfs": ("looped_bfs(p=2, m=4)", "text"),
    "defer_w": ("defer_w(split_bw(1f1b(p=2, m=4)))", "text"),
    "recompute": ("recompute(1f1b(p=2, m=4), chunks=[0])", "train"),
    "fused encoder": ("1f1b(p=2, m=4)", "train"),
    "transpose prefix (frozen)": ("transpose(1f1b(p=2, m=4), mode=prefix)", "frozen"),
    "transpose prefix owner": ("transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)", "train"),
    "transpose dynamic shards": ("transpose(zb_h1(p=2, m=4), mode=dynamic, shards=2)", "train"),
    "transpose zbv owner": ("transpose(zbv(p=2, m=4), mode=dynamic, shards=2, backward=owner)", "train"),
    "encoder_batch": ("encoder_batch(transpose(1f1b(p=2, m=4)), 2)", "train"),
    "colocated": ("colocated(1f1b(p=2, m=4))", "train"),
    "disaggregate": ("disaggregate(1f1b(p=2, m=4), encoder_devices=1)", "train"),
    "adamw": ("transpose(1f1b(p=2, m=4), mode=dynamic)", "train"),
}
ADAMW = {"name": "adamw", "lr": 1e-3, "momentum": 0.0}

# The mutations: (what, term, model, fault).  Each must fail the check.
MUTATIONS = [
    ("dropped microbatch", "1f1b(p=2, m=4)", "text", {"kind": "drop_microbatch", "mb": 2}),
    ("dropped microbatch (zbv)", "zbv(p=2, m=4)", "text", {"kind": "drop_microbatch", "mb": 0}),
    ("swapped shard", "transpose(zb_h1(p=2, m=4), mode=dynamic, shards=2)", "train",
     {"kind": "swap_shard", "mb": 1}),
    ("AdamW step skipped on rank 1", "transpose(1f1b(p=2, m=4), mode=dynamic)", "train",
     {"kind": "skip_optimizer_step", "rank": 1, "step": 1}),
    ("one gradient element off by 1e-3", "1f1b(p=2, m=4)", "text",
     {"kind": "wrong_grad", "rank": 0, "param": "llm.blocks.0.attn.qkv.weight", "index": 5, "delta": 1e-3}),
]


def model_config(kind: str, seed: int):
    from executor.runtime.model import ModelConfig

    if kind == "text":
        return ModelConfig(encoder=None, seed=seed)
    if kind == "frozen":
        return ModelConfig(trainable_encoder=False, seed=seed)
    return ModelConfig(images_min=1, images_max=3, batch=2, seed=seed, images_seed=seed)


def make_job(term: str, kind: str, seed: int, *, steps: int = 2, optimizer: dict | None = None,
             fault: dict | None = None):
    from executor.runtime.jobs import Job
    from executor.runtime.model_workload import workload_for
    from mpipe_core.api import evaluate

    cfg = model_config(kind, seed)
    ev = evaluate(term, workload_for(cfg))
    kw = {"optimizer": optimizer} if optimizer else {}
    return Job.make(f"{term} seed {seed}", ev.schedule, cfg, steps=steps, check_grads=True, fault=fault, **kw)


def family_jobs(name: str, seeds: range) -> list:
    term, kind = FAMILIES[name]
    if name == "adamw":
        return [make_job(term, kind, s, steps=3, optimizer=ADAMW) for s in seeds]
    return [make_job(term, kind, s) for s in seeds]


def mutation_job(term: str, kind: str, fault: dict, seed: int = 0):
    optimizer = ADAMW if fault["kind"] == "skip_optimizer_step" else None
    return make_job(term, kind, seed, steps=2, optimizer=optimizer, fault=dict(fault))


@contextmanager
def one_thread():
    """One intra-op thread, as a torchrun rank runs (OMP_NUM_THREADS=1): the rank threads
    would otherwise contend for the cores (about 6x slower on 2 loaded cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_family(name: str, seeds: range) -> list[dict]:
    """Each seed's grad check (`JobResult.grad_check`) of the family, ranks as threads."""
    from executor.runtime.rank import run_local

    jobs = family_jobs(name, seeds)
    with one_thread():
        return [r.grad_check for r in run_local(jobs, len(jobs[0].schedule["orders"]), timeout_s=120.0)]


def run_mutation(term: str, kind: str, fault: dict, seed: int = 0) -> dict:
    from executor.runtime.rank import run_local

    job = mutation_job(term, kind, fault, seed)
    with one_thread():
        (result,) = run_local([job], len(job.schedule["orders"]), timeout_s=120.0)
    return result.grad_check


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks grad-check")
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--families", default="all")
    args = parser.parse_args(argv)
    names = list(FAMILIES) if args.families == "all" else args.families.split(",")
    print(f"gradient check sweep: {args.seeds} seeded runs per family, p=2 (disaggregate: 3 devices), m=4, in-process ranks")
    print(f"{'family':30} {'passed':>9} {'worst ratio':>12} {'worst tensor':40} {'s':>6}")
    failed = 0
    for name in names:
        t0 = time.perf_counter()
        checks = run_family(name, range(args.seeds))
        passed = sum(c["ok"] for c in checks)
        failed += len(checks) - passed
        worst = max((c["worst"] for c in checks if c["worst"]), key=lambda w: w["ratio"])
        print(f"{name:30} {passed:>4}/{len(checks):<4} {worst['ratio']:>12.3f} "
              f"{worst['name'] + ' (' + worst['what'] + ')':40.40} {time.perf_counter() - t0:>6.1f}")
        sys.stdout.flush()
    print()
    print(f"{'mutation':36} {'verdict':8} {'worst ratio':>12}  worst tensor")
    missed = 0
    for what, term, kind, fault in MUTATIONS:
        check = run_mutation(term, kind, fault)
        missed += check["ok"]
        w = check["worst"]
        print(f"{what:36} {'PASS' if check['ok'] else 'FAIL':8} {w['ratio']:>12.3g}  {w['name']} ({w['what']})")
    print()
    print(f"correct runs failed: {failed}; mutations missed: {missed}")
    if failed or missed:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
