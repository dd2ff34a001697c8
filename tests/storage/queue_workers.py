"""Worker processes for the queue tests (a module of its own so `spawn` can import it).

They use only the public queue API, the way the executor's worker will.
"""
from __future__ import annotations

import time
from bounds import EVENT_S


def claim_until_empty(url: str, worker_id: str, start, results) -> None:
    """Claim runs as fast as possible until none is queued; report the ids.
    (Runs stay `running`: the claim is what is under test, so nothing else
    slows the race down.)"""
    from storage import claim_next_run, open_database

    db = open_database(url)
    claimed = []
    start.wait(EVENT_S)
    try:
        while True:
            run = claim_next_run(db, worker_id, lease_seconds=120)
            if run is None:
                break
            claimed.append(run.id)
        results.put((worker_id, claimed, None))
    except Exception as error:  # report, so the test fails with the cause
        results.put((worker_id, claimed, repr(error)))
    finally:
        db.close()


def run_and_hang(url: str, worker_id: str, claims: int, lease_seconds: float, timings_per_run: int,
                 ready) -> None:
    """Claim `claims` runs, write some timings for each, then keep heartbeating
    (as a live worker does) until the test kills this process."""
    from mpipe_core.ir.timeline_record import TimelineRecord
    from storage import add_timings, claim_next_run, heartbeat, open_database

    db = open_database(url)
    held = []
    for _ in range(claims):
        run = claim_next_run(db, worker_id, lease_seconds)
        held.append(run.id)
        add_timings(db, run.id, [TimelineRecord(0, "llm", "F", 0, m, 0, float(m), m + 0.5, "cpu")
                                 for m in range(timings_per_run)])
    ready.set()
    while True:
        for run_id in held:
            heartbeat(db, run_id, worker_id, lease_seconds)
        time.sleep(lease_seconds / 6)


def open_fresh(url: str, start, results) -> None:
    """Open (and so migrate) a database at the same moment as other processes."""
    from storage import open_database
    from storage.db import current_revision

    start.wait(EVENT_S)
    try:
        db = open_database(url)
        results.put(current_revision(db))
        db.close()
    except Exception as error:
        results.put(repr(error))
