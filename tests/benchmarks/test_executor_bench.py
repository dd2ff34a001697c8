"""The executor benchmark's pieces: torch stages built from our chunks compute
exactly our loss; torch's `_PipelineScheduleRuntime` runs our exported CSV on
gloo with our losses and gradients; a profile fits a workload the simulator
can place transpose on."""
import pytest
import torch

from mpipe_core.api import evaluate

from benchmarks.torch_runtime_bench import StageModule, compare
from executor.runtime.model import MLLM, ModelConfig, make_microbatch, tokens_per_step
from executor.runtime.partition import make_chunks
from executor.runtime.model_workload import workload_for

TEXT = ModelConfig(encoder=None)


@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_stage_modules_chain_to_the_reference_loss(chunks):
    cfg, m = TEXT, 3
    stages = [StageModule(cfg, c) for c in make_chunks(cfg, chunks)]
    ref = MLLM(cfg)
    norm = tokens_per_step(cfg, m)
    for mb in range(m):
        batch = make_microbatch(cfg, 0, mb, m)
        x = batch.tokens
        for st in stages:
            x = st(x)
        loss = torch.nn.functional.cross_entropy(x.reshape(-1, cfg.vocab), batch.targets.reshape(-1),
                                                 ignore_index=-1, reduction="sum") / norm
        assert torch.equal(loss, ref.microbatch_loss(batch, norm))


@pytest.mark.slow
def test_torch_runtime_runs_our_csv_with_our_losses_and_gradients():
    rows = compare(p=2, m=4, steps=2, cfg=TEXT, timeout_s=180, builds=2)
    assert [r["term"] for r in rows] == ["1f1b(p=2, m=4)", "interleaved(p=2, m=4, v=2)"]
    for r in rows:
        assert r["grad_ok"] and r["params"] > 0
        assert r["loss_rel_error"] <= 1e-5
        assert r["builds"] == 2 and len(r["ours_steps"]) == len(r["torch_steps"]) == 2
        assert all(t > 0 for t in r["ours_steps"] + r["torch_steps"])


@pytest.mark.slow
def test_profile_fit_places_transpose(tmp_path):
    from benchmarks.executor_bench import _calibrated_schedule, fit_profile, simulated_ms
    from executor.runtime.jobs import Job
    from executor.service.launch import LaunchOptions, launch

    cfg = ModelConfig(trainable_encoder=False, images_min=2, images_max=2)
    wl = workload_for(cfg)
    terms = ["1f1b(p=2, m=4)", "zb_h1(p=2, m=4)"]
    jobs = [Job.make(t, evaluate(t, wl).schedule, cfg, steps=2) for t in terms]
    results = launch(jobs, LaunchOptions(nproc=2, stall_s=60, run_dir=str(tmp_path)))
    fits = {kind: fit_profile([r], t, wl) for kind, t, r in zip(("BW", "split"), terms, results)}
    docs = {k: f.workload for k, f in fits.items()}
    assert fits["BW"].predicted_ms > 0 and fits["split"].measured_ms > 0
    ev = _calibrated_schedule("transpose(zb_h1(p=2, m=4), mode=dynamic, shards=2)", docs)
    assert ev.workload.llm.chunk_costs["B"] == tuple(docs["split"]["llm"]["chunk_costs"]["B"])
    assert ev.summary()["makespan"] > 0 and any(op.module == "vision" for o in ev.schedule.orders for op in o)
    assert simulated_ms(ev.schedule, docs["split"]) == pytest.approx(ev.summary()["makespan"])
    # Pooling jobs: each later job's warm-up step is left out, fit() leaves out the first's.
    pooled = fit_profile([results[0], results[0]], terms[0], wl)
    assert pooled.steps == [1, 3]
