"""A queued data run (`-o data=PATH`) run by `mpipe worker --once`: each step's
plan and predicted makespan are kept with the run (`runs.step_plans`), as the
log tail names them, for the Runs page to set beside the measured steps."""
from __future__ import annotations

import json
import re

import pytest
from data_samples import SAMPLES as ALL_SAMPLES
from worker_helpers import mpipe

pytestmark = pytest.mark.slow

SAMPLES = ALL_SAMPLES[:6]  # no video: six samples of 0-3 images
TERM = "per_batch(transpose(1f1b(p=2, m=6), mode=dynamic))"


def test_a_queued_data_run_keeps_each_step_s_plan(tmp_path):
    from storage import get_run, list_runs, open_database, save_schedule

    data = tmp_path / "data"
    data.mkdir()
    (data / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SAMPLES))
    (data / "data.json").write_text(json.dumps({"samples": "samples.jsonl",
                                                "packing": {"max_tiles": 6, "max_tokens": 40, "buffer": 2}}))
    models = tmp_path / "models.toml"
    models.write_text(f"entry_points = false\ndata_root = {str(data)!r}\n")
    url = f"sqlite:///{tmp_path / 'q.db'}"
    db = open_database(url)
    save_schedule(db, "d", TERM, workload="vit-heavy-small")
    queued = mpipe("runs", "enqueue", "d", "-o", f"data={data / 'data.json'}", "--steps", "2", "--db", url,
                   "--models", str(models))
    assert queued.returncode == 0, queued.stderr
    worked = mpipe("worker", "--db", url, "--once", "--models", str(models), timeout=400)
    assert worked.returncode == 0, worked.stderr
    [run] = list_runs(db)
    run = get_run(db, run.id)
    assert run.status == "succeeded", run.error
    plans = run.step_plans
    assert [p["step"] for p in plans] == [0, 1]
    assert all(0 < p["predicted_makespan"] <= p["static_makespan"] for p in plans)
    # The same plans the log tail names, one line a step.
    for p in plans:
        line = next(x for x in run.log_tail.splitlines() if x.startswith(f"step {p['step']}: plan "))
        assert re.match(rf"step {p['step']}: plan {p['digest']} \({re.escape(p['how'])}\)", line)
        assert f"predicted {p['predicted_makespan']:.4g}" in line
