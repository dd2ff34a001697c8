"""A data run's step plans kept with the run (what the Runs page sets beside each measured step)."""
from __future__ import annotations

import pytest

from storage import claim_next_run, enqueue, finish_run, get_run, save_schedule
from storage.errors import InvalidValueError

PLAN = {"step": 0, "how": "re-placed (earliest arrival)", "digest": "0123456789ab", "order": [1, 0],
        "predicted_makespan": 12.5, "static_makespan": 13.0, "tiles": [3, 9], "tokens": [100, 120]}


def _running(db):
    save_schedule(db, "s", "1f1b(p=2, m=2)")
    run = enqueue(db, "s", steps=2)
    claim_next_run(db, "w", 60)
    return run


def test_step_plans_are_kept_with_their_predictions_and_nothing_else(db):
    run = _running(db)
    finish_run(db, run.id, "w", "succeeded", exit_code=0, step_plans=[PLAN, {**PLAN, "step": 1}])
    kept = get_run(db, run.id).step_plans
    assert kept == [{"step": s, "how": PLAN["how"], "digest": PLAN["digest"], "predicted_makespan": 12.5,
                     "static_makespan": 13.0} for s in (0, 1)]


def test_a_run_without_data_keeps_none(db):
    run = _running(db)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    assert get_run(db, run.id).step_plans is None


def test_a_bad_step_plan_is_refused_naming_the_field_and_nothing_is_written(db):
    run = _running(db)
    with pytest.raises(InvalidValueError) as caught:
        finish_run(db, run.id, "w", "succeeded", exit_code=0, step_plans=[{**PLAN, "predicted_makespan": -1}])
    assert caught.value.message == f"step plan of run {run.id} 0: 'predicted_makespan' must be a number >= 0, got -1"
    assert get_run(db, run.id).status == "running"
