"""dp > 1 with `--data` (issue 39 section 3): each data-parallel replica runs its
own share of every step's drawn batch (`Batch.of(r)`, as the core draws it),
and the gradients are checked against one process over every replica's packs.
Replicas may run different `per_batch` plans of one step where they still run
in lockstep; where they cannot, the run is refused before launch, saying why."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from executor.runtime import rank as rank_module
from executor.runtime.rank import run_local
from executor.service.run_setup import RunSpec, prepare
from mpipe_core.runs.layout import RunLayout

from data_samples import data_file  # noqa: F401 - a fixture

DP2_PP2 = RunLayout(pp=2, dp=2)
BUDGET_MS = 60_000.0  # unbounded: the plans do not depend on how loaded the machine is


def _spec(term: str, data_file: str, steps: int = 2) -> RunSpec:
    return RunSpec(term=term, data=data_file, steps=steps, check_grads=True, plan_budget_ms=BUDGET_MS,
                   layout=DP2_PP2)


def test_each_replica_runs_its_own_share_and_the_gradients_are_the_global_batch_s(data_file):
    from executor.service.run_setup import _with_data
    from mpipe_core.workloads.batch_costs import drawn_batches

    term = "1f1b(p=2, m=3)"
    prep = prepare(_spec(term, data_file))
    # The shares are the core's draw of 2 x 3 packs a step, replica r its Batch.of(r).
    _, _, wl = _with_data(RunSpec(term=term, data=data_file))
    wl = replace(wl, data=replace(wl.data, dp=2))  # as step_plans draws for two replicas
    for step, batch in zip(prep.job.data_steps, drawn_batches(wl, 3, 2)):
        shares = step["replica_packs"]
        assert [[p["pieces"] for p in share] for share in shares] == [
            [[[list(x.tiles), x.text_tokens, x.frames] for x in pack.pieces] for pack in batch.of(r)]
            for r in range(2)]
        assert shares[0] != shares[1]
    (result,) = run_local([prep.job], 4, timeout_s=300)
    check = result.grad_check
    assert check["ok"], [s["failures"] for s in check["steps"]]
    # The loss summed over both pipelines is the reference's over the global batch.
    for s, step in enumerate(check["steps"]):
        assert result.loss[s] == pytest.approx(step["reference_loss"], rel=1e-5)


def test_a_replica_that_runs_another_replica_s_share_fails_the_check(data_file, monkeypatch):
    """The mutation: every replica runs replica 0's packs (the global batch and the
    reference stay the true ones): the check must fail."""
    original = rank_module._data_steps
    monkeypatch.setattr(rank_module, "_data_steps", lambda job, replica=0: original(job, 0))
    prep = prepare(_spec("1f1b(p=2, m=3)", data_file))
    (result,) = run_local([prep.job], 4, timeout_s=300)
    assert not result.grad_check["ok"]
    assert any(": gradient off by" in f for s in result.grad_check["steps"] for f in s["failures"])


def test_replicas_may_run_different_per_batch_plans_of_a_step_in_lockstep(data_file):
    from executor.parallel.data_parallel import last_weight_ops
    from executor.runtime.jobs import schedule_from_dict
    from executor.runtime.plan import build_plan
    from mpipe_core.ir.ops import BW, LLM, W

    prep = prepare(_spec("per_batch(transpose(zbv(p=2, m=3), mode=dynamic))", data_file, steps=3))
    steps = prep.job.data_steps
    # Some step's replicas run schedules of their own (zbv: two chunks a rank, the W orders kept).
    assert any(step["plan"]["replicas"][0]["digest"] != step["plan"]["replicas"][1]["digest"] for step in steps)
    # And a later step finishes a chunk's weight gradients later than step 0 did: the gradient
    # sync must follow each step's own op order (step 0's would reduce that chunk too early).
    last = [{c: i for i, c in last_weight_ops(build_plan(schedule_from_dict(s["schedule"])).ranks[0].ops, LLM,
                                               (W, BW)).items()} for s in steps]
    assert any(later[c] > last[0][c] for later in last[1:] for c in last[0])
    (result,) = run_local([prep.job], 4, timeout_s=300)
    assert result.grad_check["ok"], [s["failures"] for s in result.grad_check["steps"]]


def test_replicas_that_cannot_run_in_lockstep_are_refused_saying_why(data_file, monkeypatch):
    from executor.errors import RunSpecError
    from executor.runtime.jobs import schedule_to_dict
    from executor.service import data_run
    from executor.service.run_setup import _with_data
    from mpipe_core.api import evaluate

    term = "per_batch(zbv(p=2, m=3))"
    _, evaluation, wl = _with_data(RunSpec(term=term, data=data_file))
    zbv = schedule_to_dict(evaluation.schedule)
    other = schedule_to_dict(evaluate("1f1b(p=2, m=3)", evaluation.workload).schedule)
    assert data_run.lockstep_conflict(zbv, zbv) is None
    assert data_run.lockstep_conflict(zbv, other) == "its ranks would hold other chunks or encoder parameters"
    # A planner that gives replica 1 a plan holding other chunks: refused before launch, in one line.
    planned = data_run._replica_step

    def replica_step(planner, wrapped, workload, batch, replica, has_encoder, budget_ms):
        out = planned(planner, wrapped, workload, batch, replica, has_encoder, budget_ms)
        return {**out, "schedule": other} if replica == 1 else out

    monkeypatch.setattr(data_run, "_replica_step", replica_step)
    with pytest.raises(RunSpecError) as refused:
        data_run.step_plans(term, wl, 2, True, BUDGET_MS, dp=2)
    assert refused.value.message.startswith("step 0: per_batch planned data-parallel replica 1's share (")
    assert refused.value.message.endswith(
        "): its ranks would hold other chunks or encoder parameters; the replicas run in lockstep (each chunk's "
        "gradient reduction is one collective over them, launched after the chunk's last weight-gradient op), so "
        "they cannot run it: run the term without per_batch, or dp=1")


def test_a_data_section_s_dp_must_be_the_layout_s(tmp_path, data_file):
    from executor.errors import RunSpecError

    doc = json.loads(open(data_file).read())
    doc.update(samples=data_file.replace("data.json", "samples.jsonl"), dp=3)
    bad = tmp_path / "dp3.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(RunSpecError, match=r"^the data section says dp=3 but the run's layout has dp=2$"):
        prepare(_spec("1f1b(p=2, m=3)", str(bad)))
