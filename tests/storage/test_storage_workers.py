"""The queue with real worker processes (spawned, as the executor's are) on both databases:
every run is claimed exactly once, and a worker killed with SIGKILL leaves a `lost`
run whose timings survive."""
from __future__ import annotations

import collections
import multiprocessing
import os
import signal
import time

from storage import (
    claim_next_run,
    enqueue,
    expire_leases,
    get_run,
    list_runs,
    run_events,
    save_schedule,
    timings_for,
)
from storage.db import head_revision
from storage.models import Run, RunEvent

import queue_workers
from bounds import EVENT_S

RUNS = 300
WORKERS = 4


def _enqueue_many(db, count: int) -> set[int]:
    """`count` queued runs of s@1, inserted in one transaction (enqueue() makes
    one transaction per run, which is slow to repeat hundreds of times)."""
    first = enqueue(db, "s")

    def write(session):
        template = session.get(Run, first.id)
        runs = [Run(schedule_version_id=template.schedule_version_id, backend="gloo", nproc=2,
                    steps=1, options={}, status="queued", launched_by="tester", attempts=0,
                    max_attempts=1, cancel_requested=False) for _ in range(count - 1)]
        session.add_all(runs)
        session.flush()
        return {first.id} | {run.id for run in runs}

    return db.write(write)


def test_concurrent_workers_claim_every_run_exactly_once(db, db_url, capsys):
    save_schedule(db, "s", "1f1b(p=2, m=2)")
    ids = _enqueue_many(db, RUNS)
    spawn = multiprocessing.get_context("spawn")
    start, results = spawn.Event(), spawn.Queue()
    workers = [spawn.Process(target=queue_workers.claim_until_empty,
                             args=(db_url, f"worker-{i}", start, results)) for i in range(WORKERS)]
    for worker in workers:
        worker.start()
    start.set()
    reports = [results.get(timeout=EVENT_S) for _ in workers]
    for worker in workers:
        worker.join(30)
    assert [r[2] for r in reports] == [None] * WORKERS, reports
    claimed = [run_id for _, runs, _ in reports for run_id in runs]
    double_claims = len(claimed) - len(set(claimed))
    per_worker = {worker_id: len(runs) for worker_id, runs, _ in sorted(reports)}
    with capsys.disabled():
        print(f"\n[{db.dialect}] {RUNS} runs, {WORKERS} spawned workers: claimed {len(claimed)}, "
              f"distinct {len(set(claimed))}, double claims {double_claims}; per worker {per_worker}")
    assert double_claims == 0
    assert len(claimed) == RUNS and set(claimed) == ids
    # The database agrees: one claim each, held by the worker that reported it.
    rows = db.read(lambda s: [(r.id, r.status, r.attempts, r.worker_id) for r in s.query(Run)])
    owner = {run_id: worker_id for worker_id, runs, _ in reports for run_id in runs}
    assert all(status == "running" and attempts == 1 and owner[run_id] == worker_id
               for run_id, status, attempts, worker_id in rows)
    claims = db.read(lambda s: collections.Counter(
        e.run_id for e in s.query(RunEvent).filter(RunEvent.to_status == "running")))
    assert set(claims.values()) == {1} and len(claims) == RUNS


def test_a_killed_worker_leaves_a_lost_run_with_its_timings(db, db_url):
    save_schedule(db, "s", "1f1b(p=2, m=2)")
    lost = enqueue(db, "s")  # default: a dead worker's run is lost
    retried = enqueue(db, "s", max_attempts=2)  # by option: requeued once
    lease = 1.5
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    worker = spawn.Process(target=queue_workers.run_and_hang,
                           args=(db_url, "doomed", 2, lease, 25, ready))
    worker.start()
    try:
        assert ready.wait(EVENT_S), "the worker never claimed its runs"
        # Only the heartbeat keeps them: wait for it to extend both leases (an event, however
        # slowly a loaded machine schedules the worker), then look just past the first lease.
        first = max(get_run(db, run.id).lease_expires_at for run in (lost, retried))
        deadline = time.monotonic() + EVENT_S
        while True:
            renewed = min(get_run(db, run.id).lease_expires_at for run in (lost, retried))
            if renewed > first:
                break
            assert time.monotonic() < deadline, "the worker never renewed its leases"
            time.sleep(0.05)
        # A moment past both first leases and before either renewed one ends: nothing expires.
        assert expire_leases(db, now=first + (renewed - first) / 2) == []
        assert get_run(db, lost.id).status == "running"
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        assert worker.exitcode == -signal.SIGKILL
    finally:
        if worker.is_alive():
            worker.kill()
    deadline = time.monotonic() + lease + 5
    expired = []
    while time.monotonic() < deadline and len(expired) < 2:
        expired += expire_leases(db)
        time.sleep(0.1)
    assert sorted(expired) == [lost.id, retried.id]

    run = get_run(db, lost.id)
    assert (run.status, run.worker_id, run.attempts) == ("lost", "doomed", 1)
    assert run.error == "lease expired: worker doomed stopped heartbeating"
    assert run.finished_at is not None
    assert [(e.from_status, e.to_status) for e in run_events(db, lost.id)][-1] == ("running", "lost")
    assert len(timings_for(db, lost.id)) == 25  # what it wrote before dying is kept
    assert [r.id for r in list_runs(db, status="lost")] == [lost.id]

    assert get_run(db, retried.id).status == "queued"
    again = claim_next_run(db, "rescuer", 30)
    assert (again.id, again.attempt) == (retried.id, 2)
    # The dead attempt's rows are kept apart: the run shows its new attempt's (none yet).
    assert timings_for(db, retried.id) == [] and len(timings_for(db, retried.id, attempt=1)) == 25


def test_processes_opening_a_new_database_at_once_migrate_it_once(db_url):
    spawn = multiprocessing.get_context("spawn")
    start, results = spawn.Event(), spawn.Queue()
    openers = [spawn.Process(target=queue_workers.open_fresh, args=(db_url, start, results))
               for _ in range(3)]
    for opener in openers:
        opener.start()
    start.set()
    revisions = [results.get(timeout=EVENT_S) for _ in openers]
    for opener in openers:
        opener.join(30)
    assert revisions == [head_revision()] * 3
