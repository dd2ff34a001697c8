"""Many schedules through the real runtime, ranks as threads of this process
(in-memory FIFO channels with the same ordering rules).  The torchrun tests
repeat the required list over gloo."""
import pytest

from executor.runtime.jobs import Job
from executor.errors import ExecutorError
from executor.runtime.rank import run_local

from executor_matrix import EXTRA_LLM_TERMS, FROZEN, TEXT, TRAIN, job


def _check(jobs, ranks):
    """Run the jobs; each must come back, checked against the reference, and pass."""
    results = run_local(jobs, ranks)
    assert [r.name for r in results] == [j.name for j in jobs] and jobs
    assert all(r.grad_check is not None and len(r.grad_check["steps"]) == j.steps for r, j in zip(results, jobs))
    bad = [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in results
           if not r.grad_check["ok"]]
    assert not bad


def test_more_llm_schedules_and_derivations():
    _check([job(t.format(p=2, m=4), TEXT) for t in EXTRA_LLM_TERMS], 2)


@pytest.mark.parametrize("cfg", [TRAIN, FROZEN], ids=["trainable", "frozen"])
def test_encoder_baselines_and_transpose_variants(cfg):
    p = 2
    terms = ["zb_h1(p={p}, m={m})", "interleaved(p={p}, m={m})",
             "transpose(1f1b(p={p}, m={m}), mode=prefix, overflow=min)",
             "transpose(dualpipev(p={p}, m={m}), mode=dynamic, shards=3, backward=owner)",
             "transpose(interleaved(p={p}, m={m}), mode=dynamic)"]
    _check([job(t.format(p=p, m=4), cfg) for t in terms], p)
    # The encoder on its own extra device: p + 1 ranks.
    _check([job("encoder_stage(1f1b(p=2, m=4))", cfg)], 3)


def test_adamw_two_steps_single_schedule():
    j = job("1f1b(p=2, m=4)", TEXT, steps=2, optimizer={"name": "adamw", "lr": 1e-3, "momentum": 0.0})
    (r,) = run_local([j], 2)
    check = r.grad_check
    assert len(r.loss) == 2 and [s["ok"] for s in check["steps"]] == [True, True]
    # Step 1's gradients are taken after one AdamW update, and the parameters after the second: both
    # match the reference run's only if every rank applied each update exactly once.
    assert check["final_params_ok"] and check["ok"]
    assert r.loss[1] != r.loss[0] and abs(r.loss[1] - check["steps"][1]["reference_loss"]) <= 1e-5 * abs(r.loss[1])


def test_model_and_schedule_must_agree():
    j = job("1f1b(p=2, m=4)", TEXT)
    j.model = TRAIN.to_dict()  # an MLLM with an LLM-only schedule
    with pytest.raises(ExecutorError, match="places no encoder ops"):
        run_local([j], 2, timeout_s=5)


def test_timeline_rows_have_the_eval_shape():
    (r,) = run_local([job("zbv(p=2, m=4)", TEXT)], 2)
    row = r.to_dict()["timeline"][0]
    assert {"device", "module", "kind", "chunk", "microbatch", "step", "start", "end", "wait"} <= set(row)
    assert len(r.timeline) == len(r.waits) == 4 * 4 * 3  # chunks x microbatches x (F, B, W)
    assert all(row.end >= row.start >= 0 for row in r.timeline)
    assert r.makespan[0] >= max(row.end for row in r.timeline) - 1e-9
