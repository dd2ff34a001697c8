"""Own models through the queue: `-o model=...` (a registered name: mpipe's own
`tiny-mllm` entry point, the examples plug-in) is refused at enqueue when it
cannot run, recorded on the run, run by a real worker (P=2, gloo) with the
gradient check, and a model that fails at launch ends its run with the reason."""
from __future__ import annotations

import pytest

from worker_helpers import Worker, mpipe_each, new_database, wait_for

pytestmark = pytest.mark.slow
PLUGIN = "tiny-mllm"  # registered by mpipe's pyproject: examples.tiny_mllm:build


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from storage import enqueue, get_run, save_schedule

    folder = tmp_path_factory.mktemp("own")
    url, db = new_database(folder, term="transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)")
    save_schedule(db, "wide", "interleaved(p=4, m=4, v=2)", author="tester")
    refused = mpipe_each(["runs", "enqueue", "s", "--db", url, "-o", "model=examples.nope:build"],
                         ["runs", "enqueue", "wide", "--db", url, "-o", f"model={PLUGIN}"])
    good = enqueue(db, "s", options={"model": PLUGIN, "check_grads": True}, launched_by="tester").id
    # Past the enqueue check (written straight to the database): fails when launched.
    bad = enqueue(db, "s", options={"model": PLUGIN, "model_config": "huge"}, launched_by="tester").id
    worker = Worker(url, folder)
    try:
        for run_id in (good, bad):
            wait_for(lambda: get_run(db, run_id).status not in ("queued", "running"), 240,
                     what=f"run {run_id} to end\n{worker.output()}")
    finally:
        worker.stop()
    yield {"db": db, "good": good, "bad": bad, "refused": refused, "worker": worker.output()}
    db.close()


def test_enqueue_refuses_what_cannot_run(served):
    missing, too_few = served["refused"]
    assert missing.returncode == too_few.returncode == 2
    assert missing.stderr.startswith("error: run option model: 'examples.nope:build' is not a registered model "
                                     "(registered: tiny-mllm; presets: tiny,")
    assert missing.stderr.endswith("; a queued run never imports a module:function name, only `mpipe run` "
                                   "on your own machine does\n")
    assert too_few.stderr == ("error: the LLM has 4 layers but the schedule needs 8 chunks "
                              "(each chunk needs at least one layer)\n")


def test_the_plugin_run_succeeds_with_the_gradient_check_and_records_its_model(served):
    from storage import get_run

    run = get_run(served["db"], served["good"])
    assert run.status == "succeeded", f"{run.error}\n{run.log_tail}\n{served['worker']}"
    assert run.options["model"] == PLUGIN
    assert "grad check" in run.log_tail.lower() or "gradient" in run.log_tail.lower()


def test_a_model_that_fails_at_launch_ends_its_run_with_the_reason(served):
    from storage import get_run

    run = get_run(served["db"], served["bad"])
    assert run.status == "failed"
    assert run.error == (f"cannot launch: --model {PLUGIN}: the factory raised ValueError: "
                         "unknown config 'huge' (tiny, frozen)")


def test_the_worker_records_each_ranks_measured_memory(served):
    """What the worker stored is what the same job measures with its ranks as threads
    (memory is exact bytes of tensors, whatever the machine's load)."""
    from dataclasses import replace

    from executor.runtime.rank import run_local
    from executor.service.run_setup import prepare_run
    from storage import ClaimedRun, get_run, get_version, memory_for
    from storage.models import utcnow

    db = served["db"]
    run = get_run(db, served["good"])
    version = get_version(db, run.ref)
    claimed = ClaimedRun(run.id, run.schedule, run.version, version.term, version.workload, run.backend, run.nproc,
                         run.steps, run.options, run.attempts, utcnow())
    job = replace(prepare_run(claimed).job, check_grads=False)
    (local,) = run_local([job], run.nproc)
    keys = ("rank", "activation_peak", "activation_peak_op", "parameters", "gradients", "optimizer")
    assert memory_for(db, run.id) == [{k: m[k] for k in keys} for m in local.memory]
    assert "measured memory per rank (bytes): rank 0 activation peak" in run.log_tail
    assert memory_for(db, served["bad"]) == []  # it never ran
