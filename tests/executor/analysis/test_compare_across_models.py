"""A run compared with a workload of another model than the one that ran is labelled
across models, never a prediction error; its own workload or a fit is not."""
from __future__ import annotations

import pytest

from mpipe_core.api import evaluate
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.workloads.presets import preset_document

TERM = "1f1b(p=2, m=4)"


@pytest.fixture()
def internvl_run(tmp_path):
    """A finished run of a version saved with InternVL-26B at tp=8, dp=16 (the built-in model ran)."""
    import json

    from storage import add_timings, claim_next_run, enqueue, finish_run, open_database, save_schedule

    doc = dict(preset_document("internvl-26b"), parallel={"tp": 8, "dp": 16})
    path = tmp_path / "internvl.json"
    path.write_text(json.dumps(doc))
    db = open_database(f"sqlite:///{tmp_path / 'mpipe.db'}")
    save_schedule(db, "big", TERM, workload=str(path), author="tester")
    run = enqueue(db, "big", steps=3)
    claim_next_run(db, "w", 60)
    timeline = evaluate(TERM, doc).timeline  # ms; the run measures a thousandth of it, in seconds
    rows = []
    for step in range(3):
        base = step * 0.01
        rows += [TimelineRecord.of(op._replace(step=step), d, base + s / 1e6, base + e / 1e6)
                 for op, d, s, e in timeline.rows()]
    add_timings(db, run.id, rows)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    yield db, run.id
    db.close()


def test_the_launched_workload_of_another_model_compares_across_models(internvl_run):
    from executor.analysis.compare_run import LAUNCHED, compare_run

    db, run = internvl_run
    cmp = compare_run(db, run, workload=LAUNCHED)
    assert cmp.across_models and cmp.as_dict(timelines=False)["across_models"] is True
    text = cmp.format()
    assert "another model than the one that ran, so this compares across models and is no prediction" in text
    assert "another model / measured - 1 = " in text and "predicted / measured" not in text
    fit = compare_run(db, run)  # a fit on the run itself: the model that ran
    assert fit.fitted and not fit.across_models
