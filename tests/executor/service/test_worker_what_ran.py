"""A queued run of a version saved with another model's workload (InternVL-26B at tp=8,
dp=16) runs the built-in model on the pipeline's ranks; its summary says so: which
model ran, on what, that the workload is another model's, what of its layout was
dropped, and the gradient check's verdict in the rule's words."""
from __future__ import annotations

import json

import pytest
from worker_helpers import mpipe

from mpipe_core.workloads.presets import preset_document

pytestmark = pytest.mark.slow


def test_the_summary_says_which_model_ran_and_what_was_dropped(tmp_path):
    from storage import get_run, list_runs, open_database, save_schedule

    doc = dict(preset_document("internvl-26b"), parallel={"tp": 8, "dp": 16})
    path = tmp_path / "internvl.json"
    path.write_text(json.dumps(doc))
    url = f"sqlite:///{tmp_path / 'q.db'}"
    db = open_database(url)
    save_schedule(db, "big", "1f1b(p=2, m=2)", workload=str(path))
    queued = mpipe("runs", "enqueue", "big", "-o", "check_grads=true", "--db", url)
    assert queued.returncode == 0, queued.stderr
    worked = mpipe("worker", "--db", url, "--once", timeout=400)
    assert worked.returncode == 0, worked.stderr
    [run] = list_runs(db)
    run = get_run(db, run.id)
    assert run.status == "succeeded", run.error
    summary = run.log_tail.split("--- worker ---\n")[1].splitlines()
    assert "ran: the built-in model sized from the workload (48 LLM layers of width 32, encoder vision " \
           "(trainable)) on 2 ranks (gloo, CPU)" in summary
    assert ("workload: internvl-26b (model internlm2-20b on ascend-910c), another model: a comparison with it is "
            "across models, not a prediction of this run") in summary
    assert ("dropped from the workload's layout: tp=8, dp=16 (it spans 256 devices; this run executed the "
            "2-device pipeline)") in summary
    assert any(line.startswith("grad check PASS: ") for line in summary), summary
    db.close()
