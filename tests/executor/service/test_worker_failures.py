"""How runs end when they do not end well: the worker SIGKILLed (run requeued
after the lease, no torchrun left behind, the next attempt's rows kept apart),
a cancel from the database, a run past its timeout, and SIGTERM to the worker
(the run goes back to the queue).  On SQLite and on PostgreSQL."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from executor.service.launch import _alive
from worker_helpers import (Worker, guard_processes, kill_leftovers, mpipe, new_database, run_processes,
                            wait_for)
from bounds import EVENT_S

pytestmark = pytest.mark.slow
LONG = 5000  # steps: minutes of work, never reached
REQUEUED_STEPS = 30  # a run killed two steps in, then finished by the next attempt
OPS_PER_STEP = 24  # 1f1b(p=2, m=4) on the tiny MLLM: 16 LLM ops + 8 encoder ops
LEASE = 3


def _status(db, run_id):
    from storage import get_run

    return get_run(db, run_id).status


def _rows(db, run_id):
    from storage import timing_count

    return timing_count(db, run_id)


def test_sigkilled_worker_run_is_requeued_and_the_next_attempt_keeps_its_rows_apart(tmp_path, db_url):
    """A worker SIGKILLed two steps into a run: no torchrun is left behind, the run is
    requeued when the lease runs out, the dead attempt's run directory is removed by the
    next worker, which runs attempt 2 to the end; the run shows attempt 2's rows only,
    attempt 1's stay apart."""
    from storage import expire_leases, get_run, run_events, timing_attempts, timings_for

    url, db = new_database(tmp_path, url=db_url)
    run = mpipe("runs", "enqueue", "s", "--steps", str(REQUEUED_STEPS), "--max-attempts", "2", "--db", url)
    assert run.returncode == 0, run.stderr
    worker = Worker(url, tmp_path, "--lease", str(LEASE))
    t_start = time.monotonic()
    try:
        wait_for(lambda: _rows(db, 1) >= 2 * OPS_PER_STEP, EVENT_S, what=f"rows of run 1\n{worker.output()}")
        t_rows = time.monotonic()
        assert run_processes(str(worker.run_root)), "the run's processes should be up"
        [guard] = guard_processes(str(worker.run_root))
        worker.signal(signal.SIGKILL)
        worker.wait(EVENT_S)
        killed_at = time.monotonic()
        kept = _rows(db, 1)
        # The guard learns of the worker's death from the kernel and ends torchrun and its ranks;
        # it exits only once none of them is left.  The bound is for a failure only (a loaded
        # machine just takes longer); once the guard is gone nothing may be left, at once.
        wait_for(lambda: not _alive(guard), EVENT_S, what="the run's guard to end the run's processes")
        t_gone = time.monotonic()
        assert not run_processes(str(worker.run_root)), "a process of the run outlived its guard"
        assert _status(db, 1) == "running"  # nobody has noticed yet
        assert len(list(worker.run_root.glob("run-1-a1-*"))) == 1  # left behind by the killed worker
        wait_for(lambda: expire_leases(db) == [1], LEASE + EVENT_S, what="the lease to run out")
        assert _status(db, 1) == "queued"
        assert [e.to_status for e in run_events(db, 1)] == ["queued", "running", "queued"]
    finally:
        worker.stop()
        assert not kill_leftovers(str(worker.run_root))
    second = Worker(url, tmp_path)
    try:
        wait_for(lambda: _status(db, 1) not in ("queued", "running"), EVENT_S, what=f"attempt 2\n{second.output()}")
    finally:
        second.stop()
        assert not kill_leftovers(str(second.run_root))
    info = get_run(db, 1)
    assert info.status == "succeeded" and info.attempts == 2, f"{info.error}\n{second.output()}"
    assert "removed 1 run directory of attempts that are over: run-1-a1-" in second.output()
    assert not list(second.run_root.glob("run-1-*"))
    assert timing_attempts(db, 1) == {1: kept, 2: REQUEUED_STEPS * OPS_PER_STEP}
    shown = timings_for(db, 1)
    assert len(shown) == REQUEUED_STEPS * OPS_PER_STEP
    assert len({(t.step, t.device, t.module, t.kind, t.chunk, t.microbatch) for t in shown}) == len(shown)
    print(f"\nSIGKILL: rows after {t_rows - t_start:.1f} s; run's processes gone {t_gone - killed_at:.1f} s "
          f"after the kill; attempt 1 kept {kept} rows apart; attempt 2 recorded {len(shown)}")


def _rows_in_files(run_dir) -> int:
    """Op timings the ranks wrote to their per-step files (complete lines)."""
    total = 0
    for path in run_dir.glob("timings.*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                total += len(json.loads(line)["ops"])
            except ValueError:
                pass
    return total


def test_cancel_crash_timeout_and_sigterm_stop_whole_process_groups(tmp_path, db_url):
    """One worker, three runs at a time: one cancelled from the database, one
    whose rank 1 is killed, one past its timeout, and a fourth still going
    when the worker gets SIGTERM."""
    from storage import enqueue, get_run, run_events, timing_attempts

    url, db = new_database(tmp_path, url=db_url)
    cancel = enqueue(db, "s", steps=LONG, launched_by="tester").id
    crash = enqueue(db, "s", steps=LONG, launched_by="tester").id
    slow = enqueue(db, "s", steps=LONG, options={"timeout_s": 10}, launched_by="tester").id
    last = enqueue(db, "s", steps=LONG, launched_by="tester").id
    worker = Worker(url, tmp_path, "--max-parallel", "3", "--lease", "6", "--keep-run-dirs")
    try:
        wait_for(lambda: _rows(db, cancel) > 0, EVENT_S, what=f"rows of run {cancel}\n{worker.output()}")
        t0 = time.monotonic()
        out = mpipe("runs", "cancel", str(cancel), "--db", url)
        assert out.returncode == 0 and "asked it to stop" in out.stdout, out.stdout + out.stderr
        wait_for(lambda: _status(db, cancel) == "cancelled", EVENT_S, what=f"the cancel\n{worker.output()}")
        stopped_in = time.monotonic() - t0
        info = get_run(db, cancel)
        assert info.error.startswith("cancelled on request")
        assert not run_processes(f"{worker.run_root}/run-{cancel}-a1-"), "cancelled run left processes"
        frozen = _rows(db, cancel)
        time.sleep(0.5)
        assert _rows(db, cancel) == frozen > 0

        # A rank dies mid-run: the run fails naming it, and keeps every row the ranks wrote.
        wait_for(lambda: _rows(db, crash) > 0, EVENT_S, what=f"rows of run {crash}\n{worker.output()}")
        (run_dir,) = worker.run_root.glob(f"run-{crash}-a1-*")
        os.kill(int((run_dir / "pid.1").read_text()), signal.SIGKILL)
        wait_for(lambda: _status(db, crash) == "failed", EVENT_S, what=f"the crash\n{worker.output()}")
        info = get_run(db, crash)
        assert "rank 1 died" in info.error, info.error
        assert _rows(db, crash) == _rows_in_files(run_dir) > 0
        assert not run_processes(f"{worker.run_root}/run-{crash}-a1-"), "crashed run left processes"
        crash_rows = _rows(db, crash)

        wait_for(lambda: _status(db, slow) == "failed", EVENT_S, what=f"the timeout\n{worker.output()}")
        info = get_run(db, slow)
        assert info.error.startswith("timed out: still running after 10 s"), info.error
        assert not run_processes(f"{worker.run_root}/run-{slow}-a1-"), "timed-out run left processes"

        wait_for(lambda: _rows(db, last) > 0, EVENT_S, what=f"rows of run {last}\n{worker.output()}")
        assert _status(db, last) == "running"
        worker.signal(signal.SIGTERM)
        assert worker.wait(EVENT_S) == 0
        info = get_run(db, last)  # handed back to the queue, its attempt not counted
        assert (info.status, info.worker_id, info.attempts, info.max_attempts) == ("queued", None, 1, 2), info
        assert run_events(db, last)[-1].note == "released by the worker (SIGTERM); attempt 1 does not count"
        assert list(timing_attempts(db, last)) == [1] and _rows(db, last) == 0  # attempt 1's rows, apart
        assert not run_processes(str(worker.run_root)), "SIGTERM left processes"
        print(f"\ncancel took effect in {stopped_in:.1f} s; the crashed run kept {crash_rows} rows")
    finally:
        worker.stop()
        assert not kill_leftovers(str(worker.run_root))


@pytest.mark.parametrize("launcher,message", [
    ("srun {torchrun} {entry} --x {bogus}", "error: launcher template: unknown field {bogus}"),
    ("srun -N {nnodes} {torchrun}", "error: launcher template: it must start {entry}"),
])
def test_bad_launcher_templates_exit_2(tmp_path, launcher, message):
    out = mpipe("worker", "--db", str(tmp_path / "x.db"), "--once", "--launcher", launcher)
    assert out.returncode == 2 and out.stderr.startswith(message), out.stderr
    assert out.stderr.count("\n") == 1
