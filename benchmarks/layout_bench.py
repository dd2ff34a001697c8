"""python -m benchmarks layout [--in-process] [--model TEXT] [--layout TEXT] [--model TEXT]

The layout matrix the executor runs today (issue 39): data parallelism and
ZeRO-1 over pipelines, the encoder's state sharded over its copies
(`encoder_shard`), tensor parallelism with and without sequence parallelism
(DTensor; with bf16, recompute and `encoder_shard` too), context parallelism,
and tp with cp; every case's gradients
against one process over the global batch (fp32, the suite's tolerance), and
the mutations that must fail.  One torchrun launch per world size (gloo on
this CPU); `--in-process` runs the ranks as threads instead, without the tp
rows (DTensor needs a device mesh).
"""
from __future__ import annotations

import sys
import tempfile
import time

LLM = ["1f1b(p=2, m=4)", "zbv(p=2, m=4)"]
MLLM = ["transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)", "colocated(1f1b(p=2, m=4))"]
DP2 = {"dp": 2, "pp": 2}
ZERO = {"dp": 2, "pp": 2, "distributed_optimizer": True}
TP2 = {"tp": 2, "pp": 2}
TP2_SP = {"tp": 2, "sp": True, "pp": 2}
SWAPPED = "llm.blocks.0.fc.weight"
HF_SWAPPED = "model.vision_tower.encoder.layers.0.mlp.fc1.weight"


def _builtin(term: str, text: bool, **kw):
    from executor.runtime.jobs import Job
    from executor.runtime.model import ModelConfig
    from executor.runtime.model_workload import workload_for
    from mpipe_core.api import evaluate

    cfg = ModelConfig(encoder=None) if text else ModelConfig(images_min=1, images_max=3, batch=2)
    return Job.make(term, evaluate(term, workload_for(cfg)).schedule, cfg, check_grads=True, **kw), "builtin"


def _own(term: str, model: str, config: str | None, **kw):
    from executor.runtime.jobs import Job
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.workload import model_workload
    from mpipe_core.api import evaluate
    from mpipe_core.runs.model_spec import BatchShape, ModelSpec
    from mpipe_core.workloads.workload import load_workload

    spec = ModelSpec(model, config, BatchShape(microbatch_size=1, images=2, text_len=8))
    schedule = evaluate(term, load_workload(model_workload(load_model(spec)))).schedule
    return Job.make(term, schedule, spec, check_grads=True, **kw), model


def _cases(in_process: bool = False) -> dict[int, list[tuple]]:
    """world -> [(layout label, job, model label, expected pass)]."""
    four = [] if in_process else [
        ("tp2·pp2 sp", *_builtin("1f1b(p=2, m=4)", False, layout=TP2_SP), True),
        ("tp2·pp2 sp", *_builtin(MLLM[0], False, layout=TP2_SP), True),
        ("tp2·pp2", *_builtin("zbv(p=2, m=4)", True, layout=TP2), True),
        ("tp2·pp2 sp", *_builtin("balanced(1f1b(p=2, m=4))", False, layout=TP2_SP), True),
        ("tp2·pp2 sp", *_own("1f1b(p=2, m=4)", "examples.tiny_mllm:build", None, layout=TP2_SP), True),
        ("tp2·pp2 sp", *_own("1f1b(p=2, m=4)", "hf:llava", "tiny", layout=TP2_SP), True),
        ("tp2·pp2", *_own("zbv(p=2, m=4)", "hf:qwen2_5_vl", "tiny", layout=TP2), True),
        ("tp2·dp2 (pp1)", *_own("1f1b(p=1, m=2)", "hf:qwen2_5_vl", "tiny", layout={"tp": 2, "dp": 2}), True),
        ("tp2·pp2 sp, tower fc1 shards swapped",
         *_own("1f1b(p=2, m=4)", "hf:llava", "tiny", layout=TP2_SP,
               fault={"kind": "tp_swap_shards", "param": HF_SWAPPED}), False),
        ("tp2·pp2 sp, two tp shards of fc swapped",
         *_builtin("1f1b(p=2, m=4)", False, layout=TP2_SP, fault={"kind": "tp_swap_shards", "param": SWAPPED}),
         False),
        ("tp2·pp2 sp bf16", *_builtin("1f1b(p=2, m=4)", False, layout=TP2_SP, precision="bf16"), True),
        ("tp2·pp2 sp", *_builtin("recompute(zbv(p=2, m=4), mode=selective)", False, layout=TP2_SP), True),
        ("tp2·pp2 sp encoder_shard=gradients", *_builtin(MLLM[0], False, layout={**TP2_SP, "encoder_shard": "gradients"}),
         True),
    ]
    for term in LLM:
        for label, layout in (("dp2·pp2", DP2), ("pp2·dp2 ZeRO-1", ZERO)):
            four.append((label, *_builtin(term, True, layout=layout), True))
    for term in MLLM:
        four.append(("pp2·dp2 ZeRO-1", *_builtin(term, False, layout=ZERO), True))
    four.append(("dp4 (pp1)", *_builtin("1f1b(p=1, m=2)", True, layout={"dp": 4, "pp": 1}), True))
    for model, config in (("hf:llava", "tiny"), ("hf:qwen2_5_vl", "tiny"), ("examples.tiny_mllm:build", None)):
        four.append(("pp2·dp2 ZeRO-1", *_own("1f1b(p=2, m=4)", model, config, layout=ZERO), True))
    four.append(("dp2·pp2, rank 1's gradient dropped",
                 *_builtin("1f1b(p=2, m=4)", True, layout=DP2, fault={"kind": "drop_dp_grad", "global_rank": 1}),
                 False))
    for term, label, layout in ((MLLM[0], "pp2·dp2 encoder_shard=gradients", {**DP2, "encoder_shard": "gradients"}),
                                (MLLM[1], "pp2·dp2 ZeRO-1 encoder_shard=optimizer",
                                 {**ZERO, "encoder_shard": "optimizer"})):
        four.append((label, *_builtin(term, False, layout=layout), True))
    four.append(("pp2·dp2 encoder_shard, rank 1 skips a gather",
                 *_builtin(MLLM[0], False, layout={**DP2, "encoder_shard": "gradients"},
                           fault={"kind": "skip_encoder_gather", "global_rank": 1}), False))
    four.append(("pp2·dp2 ZeRO-1, rank 3 skips the all-gather",
                 *_builtin("zbv(p=2, m=4)", True, layout=ZERO, fault={"kind": "skip_zero_gather", "global_rank": 3}),
                 False))
    six = [("(pp2+1)·dp2 ZeRO-1",
            *_builtin("disaggregate(1f1b(p=2, m=4), encoder_devices=1)", False, layout={**ZERO, "pp": 3}), True)]
    eight = [
        ("cp2·pp2·dp2", *_builtin("1f1b(p=2, m=4)", False, layout={"cp": 2, "pp": 2, "dp": 2}), True),
        ("dp8 (pp1)", *_builtin("1f1b(p=1, m=2)", True, layout={"dp": 8, "pp": 1}), True),
        ("pp2·dp4 ZeRO-1", *_builtin("zbv(p=2, m=4)", False, layout={**ZERO, "dp": 4}), True),
    ] + ([] if in_process else [
        ("tp2·pp2·dp2 sp", *_builtin("zbv(p=2, m=4)", False, layout={**TP2_SP, "dp": 2}), True),
        ("tp2·pp2·dp2 sp", *_builtin(MLLM[1], False, layout={**TP2_SP, "dp": 2}), True),
        ("tp2·pp2·dp2 sp", *_own("transpose(1f1b(p=2, m=4), mode=prefix)", "hf:qwen2_5_vl", "tiny",
                                  layout={**TP2_SP, "dp": 2}), True),
        ("tp2·cp2·pp2 sp", *_builtin("1f1b(p=2, m=4)", False, layout={**TP2_SP, "cp": 2}), True),
        ("tp2·pp2·dp2 sp ZeRO-1", *_builtin("zbv(p=2, m=4)", False, layout={**TP2_SP, **ZERO}), True),
        ("tp2·pp2·dp2 sp ZeRO-1 encoder_shard=optimizer",
         *_builtin(MLLM[0], False, layout={**TP2_SP, **ZERO, "encoder_shard": "optimizer"}), True),
        ("tp2·pp2·dp2 sp encoder_shard, rank 5 skips a gather",
         *_builtin(MLLM[0], False, layout={**TP2_SP, "dp": 2, "encoder_shard": "gradients"},
                   fault={"kind": "skip_encoder_gather", "global_rank": 5}), False),
        ("tp2·pp2·dp2 sp ZeRO-1, rank 3 skips gather",
         *_builtin("1f1b(p=2, m=4)", False, layout={**TP2_SP, **ZERO},
                   fault={"kind": "skip_zero_gather", "global_rank": 3}), False),
    ])
    return {4: four, 6: six, 8: eight}


def main(argv: list[str]) -> None:
    in_process = "--in-process" in argv
    # --model TEXT: only the rows whose model label contains TEXT (e.g. hf:), to rerun a slice
    only = argv[argv.index("--model") + 1] if "--model" in argv[:-1] else None
    # --layout TEXT: only the rows whose layout label contains TEXT (e.g. dp8)
    only_layout = argv[argv.index("--layout") + 1] if "--layout" in argv[:-1] else None
    from executor.runtime.rank import run_local
    from executor.service.launch import LaunchOptions, launch

    print("layout matrix: gradients against one process over the global batch (fp32; the float64 rule of docs/running.md)")
    print(f"{'layout':<52} {'schedule':<56} {'model':<26} {'check':<5} {'max rel err':>11}  as expected")
    failures = 0
    for world, cases in _cases(in_process).items():
        cases = [c for c in cases if (only is None or only in c[2]) and (only_layout is None or only_layout in c[0])]
        if not cases:
            continue
        jobs = [job for _, job, _, _ in cases]
        t0 = time.perf_counter()
        if in_process:
            results = run_local(jobs, world)
        else:
            with tempfile.TemporaryDirectory(prefix="mpipe-layout-") as run_dir:
                results = launch(jobs, LaunchOptions(nproc=world, stall_s=180, run_dir=run_dir))
        for (label, job, model, expected), result in zip(cases, results):
            check = result.grad_check
            ok = bool(check["ok"])
            failures += ok != expected
            print(f"{label:<52} {job.name:<56} {model:<26} {'PASS' if ok else 'FAIL':<5} "
                  f"{check['max_rel_error']:>11.3g}  {'yes' if ok == expected else 'NO'}")
        print(f"  ({world} ranks, {'threads' if in_process else 'one torchrun launch, gloo'}: "
              f"{time.perf_counter() - t0:.0f} s)")
    if failures:
        print(f"{failures} case(s) not as expected")
        sys.exit(1)
