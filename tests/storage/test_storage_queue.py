"""Run queue semantics in one process, on both databases (real processes: test_storage_workers.py)."""
from __future__ import annotations

from datetime import timedelta

import pytest

from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.runs.run_options import RunOptionError
from storage import (
    ConflictError,
    InvalidNameError,
    InvalidValueError,
    LeaseLostError,
    NotFoundError,
    add_timings,
    cancel_run,
    claim_next_run,
    enqueue,
    expire_leases,
    finish_run,
    get_run,
    heartbeat,
    list_runs,
    release_run,
    run_events,
    save_schedule,
    timing_attempts,
    timing_count,
    timings_for,
)
from storage.models import utcnow


@pytest.fixture
def sched(db):
    save_schedule(db, "s", "1f1b(p=2, m=4)")
    save_schedule(db, "s", "gpipe(p=2, m=4)", update=True)
    return db


def _transitions(db, run_id):
    return [(e.from_status, e.to_status) for e in run_events(db, run_id)]


def test_enqueue_defaults_and_validation(sched):
    run = enqueue(sched, "s@1", steps=3, options={"lr": 1})
    assert (run.ref, run.status, run.nproc, run.backend, run.steps, run.options) == (
        "s@1", "queued", 2, "gloo", 3, {"lr": 1.0})
    assert enqueue(sched, "s").ref == "s@2"
    with pytest.raises(InvalidValueError, match=r"^s@2 runs on 2 devices; 4 ranks \(nproc\) do not match$"):
        enqueue(sched, "s", nproc=4)
    with pytest.raises(InvalidNameError, match=r"^unknown backend 'mpi' \(choose from gloo, nccl, hccl\)$"):
        enqueue(sched, "s", backend="mpi")
    with pytest.raises(InvalidValueError, match=r"^steps must be an integer from 1 to 1000000, not 0$"):
        enqueue(sched, "s", steps=0)
    with pytest.raises(InvalidValueError, match=r"^steps must be an integer from 1 to 1000000, not 10{30}$"):
        enqueue(sched, "s", steps=10**30)
    # Options follow the rules the worker applies; NaN would switch a limit off.
    for options, message in [
        ({"lr": float("nan")}, r"run option lr: expected a finite number in \(0, 10\], got nan"),
        ({"timeout_s": float("inf")}, r"run option timeout_s: expected a finite number in \(0, 604800\], got inf"),
        ({"timeout_s": -5}, r"run option timeout_s: expected a finite number in \(0, 604800\], got -5"),
        ({"bogus": 1}, r"unknown run option 'bogus' \(known: model, model_config, microbatch_size, seq_len, "
                       r"images, optimizer, lr, momentum, check_grads, precision, "
                       r"timeout_s, stall_s, startup_s, nnodes, data\)"),
        ({"check_grads": "yes"}, r"run option check_grads: expected true or false, got 'yes'"),
        ({"model": "huge"}, r"run option model: 'huge' is not a registered model \(registered: [^;]*; presets: "
                            r"tiny, tiny-text, tiny-frozen, tiny-varimg, small, vit-heavy; hf:llava, hf:qwen2_5_vl; "
                            r"no local checkpoints \(no checkpoint root is set\)\)"),
        ({"images": 0}, r"run option images: expected an integer in \[1, 100000\], got 0"),
        ({"nnodes": 3}, r"run option nnodes: 2 ranks do not split evenly over 3 nodes"),
    ]:
        with pytest.raises(RunOptionError, match=f"^{message}$"):
            enqueue(sched, "s", options=options)
    with pytest.raises(NotFoundError, match=r"^schedule 's' has no version 3"):
        enqueue(sched, "s@3")
    assert len(list_runs(sched)) == 2


def test_claim_heartbeat_finish_records_every_transition(sched):
    first = enqueue(sched, "s@1")
    second = enqueue(sched, "s@2", backend="nccl")
    claimed = claim_next_run(sched, "w1", lease_seconds=30)
    assert (claimed.id, claimed.term, claimed.attempt, claimed.nproc) == (first.id, "1f1b(p=2, m=4)", 1, 2)
    assert claim_next_run(sched, "w2", 30, backends=["gloo"]) is None  # only an nccl run is left
    assert heartbeat(sched, first.id, "w1", 30) is False
    with pytest.raises(LeaseLostError, match=f"run {first.id} is no longer held by worker w2"):
        heartbeat(sched, first.id, "w2", 30)
    add_timings(sched, first.id, [TimelineRecord(r, "llm", "F", r, m, 0, m + r, m + r + 0.5, "cpu")
                                  for r in range(2) for m in range(4)])
    add_timings(sched, first.id, [{"step": 1, "device": 0, "module": "llm", "kind": "B", "chunk": 0,
                                   "microbatch": 0, "start": 9.0, "end": 10.0}])
    done = finish_run(sched, first.id, "w1", "succeeded", exit_code=0, log_tail="x" * 100_000)
    assert (done.status, done.exit_code, len(done.log_tail), done.worker_id) == ("succeeded", 0, 65536, "w1")
    assert done.created_at <= done.started_at <= done.finished_at
    assert _transitions(sched, first.id) == [(None, "queued"), ("queued", "running"), ("running", "succeeded")]
    assert len(timings_for(sched, first.id)) == 9
    step0 = timings_for(sched, first.id, step=0)
    assert len(step0) == 8 and [t.start for t in step0] == sorted(t.start for t in step0)
    assert timings_for(sched, first.id, step=1) == [TimelineRecord(0, "llm", "B", 0, 0, 1, 9.0, 10.0, "")]
    with pytest.raises(LeaseLostError):
        finish_run(sched, first.id, "w1", "failed")
    assert claim_next_run(sched, "w3", 30, backends=["nccl"]).id == second.id


def test_cancel_queued_at_once_and_running_by_flag(sched):
    queued = enqueue(sched, "s")
    running = enqueue(sched, "s")
    assert claim_next_run(sched, "w", 30).id == queued.id
    # The first one is running now; cancel the other while it is still queued.
    assert cancel_run(sched, running.id).status == "cancelled"
    assert claim_next_run(sched, "w", 30) is None
    flagged = cancel_run(sched, queued.id)
    assert (flagged.status, flagged.cancel_requested) == ("running", True)
    assert heartbeat(sched, queued.id, "w", 30) is True  # the worker learns it must stop
    assert finish_run(sched, queued.id, "w", "cancelled", exit_code=-15).status == "cancelled"
    with pytest.raises(ConflictError, match=f"^run {queued.id} already cancelled; nothing to cancel$"):
        cancel_run(sched, queued.id)
    with pytest.raises(NotFoundError, match="^no run 999$"):
        cancel_run(sched, 999)
    assert _transitions(sched, running.id) == [(None, "queued"), ("queued", "cancelled")]


def test_expired_lease_means_lost_or_requeued_by_option(sched):
    lost = enqueue(sched, "s")
    retried = enqueue(sched, "s", max_attempts=2)
    assert claim_next_run(sched, "dead", 30).id == lost.id
    assert claim_next_run(sched, "dead", 30).id == retried.id
    assert expire_leases(sched) == []
    later = utcnow() + timedelta(seconds=31)
    assert expire_leases(sched, now=later) == [lost.id, retried.id]
    run = get_run(sched, lost.id)
    assert (run.status, run.error) == ("lost", "lease expired: worker dead stopped heartbeating")
    assert get_run(sched, retried.id).status == "queued"
    again = claim_next_run(sched, "alive", 30)
    assert (again.id, again.attempt) == (retried.id, 2)
    assert expire_leases(sched, now=utcnow() + timedelta(seconds=31)) == [retried.id]
    assert get_run(sched, retried.id).status == "lost"  # out of attempts
    assert _transitions(sched, retried.id) == [
        (None, "queued"), ("queued", "running"), ("running", "queued"), ("queued", "running"),
        ("running", "lost")]
    with pytest.raises(LeaseLostError):
        heartbeat(sched, lost.id, "dead", 30)


def test_list_runs_filters(sched):
    a = enqueue(sched, "s@1")
    b = enqueue(sched, "s@2")
    cancel_run(sched, a.id)
    assert [r.id for r in list_runs(sched)] == [b.id, a.id]
    assert [r.id for r in list_runs(sched, status="cancelled")] == [a.id]
    assert [r.id for r in list_runs(sched, schedule="s", limit=1)] == [b.id]
    assert list_runs(sched, schedule="other") == []
    with pytest.raises(InvalidNameError, match="unknown status 'done'"):
        list_runs(sched, status="done")


def test_timings_need_a_run_and_complete_rows(sched):
    with pytest.raises(NotFoundError, match="no run 42"):
        add_timings(sched, 42, [TimelineRecord(0, "llm", "F", 0, 0, 0, 0.0, 1.0)])
    run = enqueue(sched, "s")
    with pytest.raises(InvalidValueError, match="lacks 'end'"):
        add_timings(sched, run.id, [{"step": 0, "device": 0, "module": "llm", "kind": "F", "chunk": 0,
                                     "microbatch": 0, "start": 0.0}])
    assert add_timings(sched, run.id, []) == 0
    assert timings_for(sched, run.id) == []


def _step_rows(term: str, steps: range, offset: float = 0.0) -> list[TimelineRecord]:
    """Every op of `term` for each step in `steps` (its simulated timeline, in seconds)."""
    from mpipe_core.api import evaluate

    ev = evaluate(term)
    return [TimelineRecord(r["device"], r["module"], r["kind"], r["chunk"], r["microbatch"], step,
                           offset + step * 100 + r["start"], offset + step * 100 + r["end"], "host")
            for step in steps for r in ev.timeline_rows()]


def _key(t: TimelineRecord) -> tuple:
    return (t.step, t.device, t.module, t.kind, t.chunk, t.microbatch)


def test_a_requeued_run_keeps_each_attempts_timings_apart(sched):
    """The issue's scenario: a worker dies part way through (steps 0-1 recorded),
    its run is requeued, the next attempt records every step.  The run shows the
    successful attempt only, the dead attempt's rows stay inspectable, and the dead
    worker's late writes are refused, even once the same worker holds a newer attempt."""
    term = "1f1b(p=2, m=4)"
    per_step = len(_step_rows(term, range(1)))
    run = enqueue(sched, "s@1", steps=4, max_attempts=2)
    first = claim_next_run(sched, "w1", lease_seconds=30)
    assert first.attempt == 1
    dead_rows = _step_rows(term, range(2))[: per_step + 3]  # step 0 and part of step 1
    add_timings(sched, run.id, dead_rows, worker_id="w1", attempt=1)
    assert expire_leases(sched, now=utcnow() + timedelta(seconds=31)) == [run.id]
    assert get_run(sched, run.id).status == "queued"
    with pytest.raises(LeaseLostError, match=f"^run {run.id} is no longer held by worker w1"):
        add_timings(sched, run.id, _step_rows(term, range(1, 2)), worker_id="w1", attempt=1)
    second = claim_next_run(sched, "w1", lease_seconds=30)  # the same worker id, a new attempt
    assert second.attempt == 2
    with pytest.raises(LeaseLostError, match=f"^run {run.id} is on attempt 2; worker w1 holds attempt 1 no longer"):
        add_timings(sched, run.id, _step_rows(term, range(1, 2)), worker_id="w1", attempt=1)
    good_rows = _step_rows(term, range(4), offset=1000.0)
    for step in range(4):  # streamed step by step, as a worker does
        add_timings(sched, run.id, [r for r in good_rows if r.step == step], worker_id="w1", attempt=2)
    finish_run(sched, run.id, "w1", "succeeded")

    shown = timings_for(sched, run.id)
    assert len(shown) == 4 * per_step == len(good_rows)
    assert len({_key(t) for t in shown}) == len(shown)  # no op twice
    assert sorted(shown) == sorted(good_rows)
    assert timing_count(sched, run.id) == 4 * per_step
    assert timing_attempts(sched, run.id) == {1: per_step + 3, 2: 4 * per_step}
    assert sorted(timings_for(sched, run.id, attempt=1)) == sorted(dead_rows)
    assert timings_for(sched, run.id, step=0) == [t for t in shown if t.step == 0]


def test_a_worker_shutting_down_releases_its_run_to_the_queue(sched):
    run = enqueue(sched, "s@1", max_attempts=1)
    claimed = claim_next_run(sched, "w1", lease_seconds=30)
    add_timings(sched, run.id, _step_rows("1f1b(p=2, m=4)", range(1)), worker_id="w1", attempt=claimed.attempt)
    with pytest.raises(LeaseLostError):
        release_run(sched, run.id, "w2", reason="SIGTERM")  # only the holder can
    released = release_run(sched, run.id, "w1", reason="SIGTERM")
    assert (released.status, released.worker_id, released.attempts, released.max_attempts) == ("queued", None, 1, 2)
    assert run_events(sched, run.id)[-1].note == "released by the worker (SIGTERM); attempt 1 does not count"
    assert timing_count(sched, run.id) == 0  # the next attempt's, none yet
    again = claim_next_run(sched, "w2", lease_seconds=30)
    assert again.attempt == 2
    # Had w2 died too, the run would now be lost: the release did not use up its one attempt.
    assert expire_leases(sched, now=utcnow() + timedelta(seconds=31)) == [run.id]
    assert get_run(sched, run.id).status == "lost"
    assert timing_attempts(sched, run.id) == {1: len(_step_rows("1f1b(p=2, m=4)", range(1)))}
