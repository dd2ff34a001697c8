"""A queued run of a whole layout (issue 39 section 8): a schedule saved with an
analytic workload whose parallel section asks for dp=2 and ZeRO-1 is enqueued
for tp*cp*pp*dp = 4 ranks by default, a real `mpipe worker` runs it under
torchrun, the gradient check passes, and the timings stored are the first
pipeline's (devices 0 and 1)."""
from __future__ import annotations

import json

import pytest

from mpipe_core.workloads.presets import preset_document

from worker_helpers import Worker, kill_leftovers

pytestmark = pytest.mark.slow
TERM = "1f1b(p=2, m=4)"


def test_a_queued_dp2_zero1_run_is_served_on_its_whole_world(tmp_path):
    from storage import enqueue, get_run, open_database, save_schedule, timings_for

    doc = preset_document("llava-7b")
    doc["parallel"] = {"dp": 2, "distributed_optimizer": True}
    workload = tmp_path / "llava-dp2.json"
    workload.write_text(json.dumps(doc))
    url = f"sqlite:///{tmp_path / 'mpipe.db'}"
    db = open_database(url)
    try:
        save_schedule(db, "s", TERM, workload=str(workload), author="tester")
        run = enqueue(db, "s", options={"check_grads": True}, launched_by="tester")
        assert run.nproc == 4  # two pipelines of the term's 2 devices
        worker = Worker(url, tmp_path, "--once")
        try:
            assert worker.wait(300) == 0, worker.output()
        finally:
            worker.stop()
            assert not kill_leftovers(str(worker.run_root))
        done = get_run(db, run.id)
        assert done.status == "succeeded", f"{done.error}\n{done.log_tail}"
        assert "grad check PASS" in done.log_tail
        rows = timings_for(db, run.id)
        # One pipeline's ops, once: 1F1B's 16 LLM ops and the frozen encoder's 4 forwards.
        assert {r.device for r in rows} == {0, 1} and len(rows) == 20
    finally:
        db.close()
