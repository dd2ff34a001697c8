"""The executor benchmark's pieces: torch stages built from our chunks compute
exactly our loss; torch's `_PipelineScheduleRuntime` runs our exported CSV on
gloo with our losses and gradients; a profile fits a workload the simulator
can place transpose on."""
import pytest
import torch

from benchmarks.torch_runtime_bench import StageModule, compare
from executor.runtime.model import MLLM, ModelConfig, make_microbatch, tokens_per_step
from executor.runtime.model_workload import workload_for
from executor.runtime.partition import make_chunks
from mpipe_core.api import evaluate

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


# --------------------------------------------------------------------------- the causes it names

def _result(rows, steps=2):
    """A job result with the given (device, module, kind, chunk, step, start, end) rows (seconds)."""
    from types import SimpleNamespace

    from mpipe_core.ir.timeline_record import TimelineRecord

    return SimpleNamespace(steps=steps, timeline=[TimelineRecord(d, m, k, c, 0, s, a, b)
                                                  for d, m, k, c, s, a, b in rows])


def test_encoder_slowdown_compares_encoders_side_by_side_with_encoders_alone():
    from benchmarks.executor_bench import encoder_slowdown

    # Fused: step 1's encoder runs alone for 0.100 s (step 0, a warm-up, is left out: 0.5 s).
    fused = _result([(0, "vision", "F", 0, 0, 0.0, 0.5), (0, "vision", "F", 0, 1, 1.0, 1.1),
                     (1, "llm", "F", 1, 1, 1.1, 1.105)])
    # Transposed: the two encoders overlap fully and take 0.120 s each: c = 0.2.  One beside an
    # LLM op only (not >= 80% beside an encoder) is not counted.
    transposed = _result([(0, "vision", "F", 0, 1, 0.0, 0.12), (1, "vision", "F", 0, 1, 0.0, 0.12),
                          (0, "vision", "F", 0, 1, 0.2, 0.3), (1, "llm", "F", 1, 1, 0.2, 0.3)])
    run = {"results": {"t": [transposed], "b": [fused]}}
    assert encoder_slowdown(run, "t", "b") == pytest.approx(0.2)
    run = {"results": {"t": [fused], "b": [fused]}}  # no encoder beside an encoder: nothing to say
    assert encoder_slowdown(run, "t", "b") is None


def test_cold_llm_ops_sizes_the_llm_time_a_busy_device_saves():
    from types import SimpleNamespace

    from benchmarks.executor_bench import cold_llm_ops

    # Device 1 in the baseline: F 6 ms, BW 10 ms, idle in between (1 s step); in the transposed
    # run F 4 ms, BW 8 ms: -4 ms per step, -25% of its 16 ms.  Device 0 runs no LLM op in both.
    base = _result([(0, "vision", "F", 0, 1, 0.0, 0.9), (1, "llm", "F", 1, 1, 0.9, 0.906),
                    (1, "llm", "BW", 1, 1, 0.99, 1.0)])
    trans = _result([(0, "vision", "F", 0, 1, 0.0, 0.5), (1, "llm", "F", 1, 1, 0.5, 0.504),
                     (1, "llm", "BW", 1, 1, 0.504, 0.512)])
    evals = {"t": SimpleNamespace(schedule=SimpleNamespace(orders=[(), ()]))}
    text = cold_llm_ops({"results": {"t": [trans], "b": [base]}}, "t", "b", evals)
    assert text == "device 1 -4.0 ms per step (-25% of its LLM time; baseline idle 98%)"


def test_probes_average_every_pair():
    from benchmarks.executor_bench import average_hosts

    hosts = [{"contention": 0.1, "dispatch": 1.0, "pairs": {"llm": {"encoder": 0.2, "llm": 0.0}}},
             {"contention": 0.3, "dispatch": 3.0, "pairs": {"llm": {"encoder": 0.4, "llm": 0.1}}}]
    assert average_hosts(hosts) == {"devices": None, "contention": pytest.approx(0.2), "dispatch": 2.0,
                                    "pairs": {"llm": {"encoder": pytest.approx(0.3), "llm": pytest.approx(0.05)}}}
    assert "pairs" not in average_hosts([{"contention": 0.1, "dispatch": 1.0}])
