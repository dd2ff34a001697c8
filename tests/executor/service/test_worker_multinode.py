"""The cluster launcher path for real on one machine: the worker fills a
Slurm-like template whose `srun` stand-in (`local_srun.py`) starts two
torchrun processes with `--nnodes 2`; they meet at a c10d rendezvous on
127.0.0.1, each a "node" of one rank, and run with a gradient check against
the single-process reference.  The two nodes' timings merge into one
timeline in the database."""
from __future__ import annotations

from pathlib import Path

import pytest

from worker_helpers import Worker, kill_leftovers, new_database
from bounds import EVENT_S

pytestmark = pytest.mark.slow
SRUN = Path(__file__).with_name("local_srun.py")
TEMPLATE = ("{python} " + str(SRUN) + " -N {nnodes} {torchrun} --nnodes {nnodes} "
            "--nproc-per-node {nproc_per_node} --rdzv-backend c10d --rdzv-endpoint {rdzv} "
            "--rdzv-id {rdzv_id} --max-restarts 0 --monitor-interval 1 {entry}")


def test_two_nodes_meet_at_a_rendezvous_and_match_the_reference(tmp_path):
    from storage import enqueue, get_run, timings_for

    url, db = new_database(tmp_path)
    run_id = enqueue(db, "s", steps=3, options={"nnodes": 2, "check_grads": True}, launched_by="tester").id
    worker = Worker(url, tmp_path, "--once", "--launcher", TEMPLATE)
    try:
        assert worker.wait(EVENT_S) == 0, worker.output()
    finally:
        worker.stop()
        assert not kill_leftovers(str(worker.run_root))
    run = get_run(db, run_id)
    assert run.status == "succeeded", f"{run.error}\n{run.log_tail}\n{worker.output()}"
    assert "grad check PASS" in run.log_tail and "on 2 node(s) x 1 rank(s)" in run.log_tail
    rows = timings_for(db, run_id)
    assert len(rows) == 3 * 24
    assert {(r.step, r.device) for r in rows} == {(s, k) for s in range(3) for k in range(2)}
    # One clock: on each step, rank 1's first forward starts after rank 0's chunk-0 forward ended.
    for step in range(3):
        f0 = next(r for r in rows if r.step == step and r.device == 0 and (r.module, r.kind, r.chunk, r.microbatch) == ("llm", "F", 0, 0))
        f1 = next(r for r in rows if r.step == step and r.device == 1 and (r.module, r.kind, r.chunk, r.microbatch) == ("llm", "F", 1, 0))
        assert f1.start >= f0.end
    assert min(r.start for r in rows) >= 0
