"""Run records and the job queue the executor's workers take runs from.

Life of a run::

    enqueue ─> queued ─claim─> running ─finish─> succeeded | failed | cancelled
                 │  ^             │ lease expires (worker died)
          cancel │  ├─requeue─────┤ (while attempts < max_attempts)
                 │  └─release─────┘ (the worker shuts down: SIGTERM)
                 v                v
             cancelled           lost

A worker calls `claim_next_run` (atomic: `UPDATE ... RETURNING` on SQLite,
`SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL, so no run is ever claimed
twice), then `heartbeat` well within the lease (it returns True once someone
asked to cancel), `add_timings` as ops complete, and finally `finish_run` (or
`release_run` when it shuts down).  Timings are kept per attempt: a requeued
run shows the attempt that finished it; a dead attempt's rows stay, apart
(`timing_attempts`, `timings_for(..., attempt=N)`), and a worker that lost its
lease can no longer add any.  What each rank measured about memory is
recorded with the end of the run (`finish_run(..., memory=...)`, `memory_for`).
Anyone may call `expire_leases`; the worker does before each claim.  Every
status change is recorded in `run_events` with its time.

Leases compare against the clock of the process that checks them: hosts that
share a team database need synchronised clocks (NTP), as for any lease.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Collection, Iterable, Mapping

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session, joinedload

from mpipe_core.errors import MpipeError
from mpipe_core.ir.timeline_record import COMM_KINDS, TimelineRecord
from mpipe_core.runs.layout import runnable_workload_layout
from mpipe_core.runs.run_options import (
    BACKENDS,
    MAX_ATTEMPTS,
    MAX_PROCS,
    MAX_STEPS,
    check_run_options,
    devices_text,
    encoder_devices_of,
)
from mpipe_core.workloads.inputs import check_text
from storage.access import Actor, author_of, authorize
from storage.audit import record
from storage.db import Database
from storage.errors import ConflictError, InvalidNameError, InvalidValueError, LeaseLostError, NotFoundError
from storage.library import check_name, find_version, version_body
from storage.models import (
    FINISHED_STATUSES,
    NAME_LENGTH,
    RUN_STATUSES,
    WORKER_ID_LENGTH,
    OpTiming,
    Run,
    RunEvent,
    RunMemory,
    ScheduleVersion,
    utcnow,
)

LOG_TAIL_CHARS = 64 * 1024
# A timing row is a `TimelineRecord` with times in seconds on the run's common
# clock; its `device` (the rank) and `host` are the `rank` and `device` columns.
COLUMN_OF = {"device": "rank", "host": "device"}


@dataclass(frozen=True)
class RunInfo:
    id: int
    schedule: str
    version: int
    backend: str
    nproc: int
    steps: int
    options: dict[str, Any]
    status: str
    launched_by: str
    worker_id: str | None
    attempts: int
    max_attempts: int
    cancel_requested: bool
    lease_expires_at: datetime | None
    heartbeat_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    exit_code: int | None
    error: str | None
    log_tail: str | None
    source: str = "queued"  # or "imported" (`mpipe import-trace`)
    source_digest: str | None = None  # the imported files' sha256
    step_plans: list[dict[str, Any]] | None = None  # a data run: per step its plan (STEP_PLAN_FIELDS)

    @property
    def ref(self) -> str:
        return f"{self.schedule}@{self.version}"


@dataclass(frozen=True)
class RunEventInfo:
    at: datetime
    from_status: str | None
    to_status: str
    worker_id: str | None
    note: str


@dataclass(frozen=True)
class ClaimedRun:
    """What a worker needs to launch a run it now holds."""

    id: int
    schedule: str
    version: int
    term: str
    workload: dict[str, Any] | None
    backend: str
    nproc: int
    steps: int
    options: dict[str, Any]
    attempt: int
    lease_expires_at: datetime


def _run_info(run: Run) -> RunInfo:
    version = run.version
    return RunInfo(
        id=run.id, schedule=version.schedule.name, version=version.number, backend=run.backend,
        nproc=run.nproc, steps=run.steps, options=dict(run.options), status=run.status,
        launched_by=run.launched_by, worker_id=run.worker_id, attempts=run.attempts,
        max_attempts=run.max_attempts, cancel_requested=run.cancel_requested,
        lease_expires_at=run.lease_expires_at, heartbeat_at=run.heartbeat_at,
        created_at=run.created_at, started_at=run.started_at, finished_at=run.finished_at,
        exit_code=run.exit_code, error=run.error, log_tail=run.log_tail,
        source=run.source or "queued", source_digest=run.source_digest, step_plans=run.step_plans,
    )


def _event(session: Session, run_id: int, from_status: str | None, to_status: str, at: datetime,
           worker_id: str | None = None, note: str = "") -> None:
    session.add(RunEvent(run_id=run_id, at=at, from_status=from_status, to_status=to_status,
                         worker_id=worker_id, note=note))


def _get_run(session: Session, run_id: int, *, for_update: bool = False) -> Run:
    # One query for the run and what RunInfo / ClaimedRun read (version, schedule, workload).
    version = joinedload(Run.version)
    query = select(Run).where(Run.id == run_id).options(
        version.joinedload(ScheduleVersion.schedule),
        version.joinedload(ScheduleVersion.workload_version),
    )
    if for_update and session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(of=Run)
    run = session.scalars(query).one_or_none()
    if run is None:
        raise NotFoundError(f"no run {run_id}")
    return run


# --- launching and inspecting --------------------------------------------------------------

def _in_range(value: Any, what: str, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise InvalidValueError(f"{what} must be an integer from 1 to {hi}, not {value!r}")


def enqueue(db: Database, ref: str, *, backend: str = "gloo", nproc: int | None = None,
            steps: int = 1, options: Mapping[str, Any] | None = None, max_attempts: int = 1,
            launched_by: str | None = None, actor: Actor | None = None, registry=None) -> RunInfo:
    """Queue a run of schedule version `ref` ("name" for the latest, or "name@n").

    `nproc` defaults to the schedule's device count and must equal it.  A run
    whose worker dies is requeued while it has had fewer than `max_attempts`
    attempts, and marked `lost` after that (default 1: lost at once).  The
    `model` option must be one `registry` (default: this process's,
    `mpipe_core.runs.model_registry`) admits.  `actor` must be allowed to launch
    (see `storage.access`)."""
    who = authorize(db, "launch", str(ref), actor=actor, schedule=str(ref).partition("@")[0][:NAME_LENGTH],
                    details={"backend": backend, "steps": steps})
    if backend not in BACKENDS:
        raise InvalidNameError(f"unknown backend '{backend}' (choose from {', '.join(BACKENDS)})")
    _in_range(steps, "steps", MAX_STEPS)
    _in_range(max_attempts, "max attempts", MAX_ATTEMPTS)
    if nproc is not None:
        _in_range(nproc, "ranks (nproc)", MAX_PROCS)
    launched_by = author_of(who, launched_by)

    def write(session: Session) -> RunInfo:
        version = find_version(session, ref)
        if version.schedule.archived:
            raise ConflictError(f"schedule '{version.schedule.name}' is archived; restore it to run it")
        devices = version.devices
        layout = runnable_workload_layout(version_body(version), devices) if devices is not None else None
        if layout is not None and layout.world != devices:  # tp * cp * dp replicas of the term's devices
            devices = layout.world
        count = nproc if nproc is not None else devices
        if count is None:
            raise InvalidValueError(f"{version.schedule.name}@{version.number}: give the number of ranks "
                                    f"(nproc; the saved summary has no device count)")
        if devices is not None and count != devices:
            needed = (devices_text(devices, encoder_devices_of(version.term)) if layout.world == version.devices
                      else f"{devices} ranks (the layout {layout.describe()})")
            raise InvalidValueError(f"{version.schedule.name}@{version.number} runs on {needed}; "
                                    f"{count} ranks (nproc) do not match")
        checked = check_run_options(options or {}, ranks=count, registry=registry)
        now = utcnow()
        run = Run(version=version, backend=backend, nproc=count, steps=steps,
                  options=checked, status="queued", launched_by=launched_by,
                  attempts=0, max_attempts=max_attempts, cancel_requested=False, created_at=now)
        session.add(run)
        session.flush()
        _event(session, run.id, None, "queued", now, note=f"by {launched_by}")
        record(session, who, "launch", f"run {run.id}", schedule=version.schedule.name, run_id=run.id,
               details={"version": f"{version.schedule.name}@{version.number}", "backend": backend, "nproc": count,
                        "steps": steps, "options": checked, **({} if launched_by == who.name
                                                               else {"launched_by": launched_by})})
        return _run_info(run)

    return db.write(write)


def get_run(db: Database, run_id: int) -> RunInfo:
    return db.read(lambda session: _run_info(_get_run(session, run_id)))


def run_events(db: Database, run_id: int) -> list[RunEventInfo]:
    def read(session: Session) -> list[RunEventInfo]:
        run = _get_run(session, run_id)
        return [RunEventInfo(e.at, e.from_status, e.to_status, e.worker_id, e.note) for e in run.events]

    return db.read(read)


def list_runs(db: Database, *, status: str | None = None, schedule: str | None = None,
              limit: int | None = 100) -> list[RunInfo]:
    """Newest first."""
    if status is not None and status not in RUN_STATUSES:
        raise InvalidNameError(f"unknown status '{status}' (choose from {', '.join(RUN_STATUSES)})")
    if schedule is not None:
        check_name(schedule)

    def read(session: Session) -> list[RunInfo]:
        query = select(Run).order_by(Run.id.desc())
        if status is not None:
            query = query.where(Run.status == status)
        if schedule is not None:
            from storage.models import Schedule

            query = query.join(Run.version).join(ScheduleVersion.schedule).where(Schedule.name == schedule)
        if limit is not None:
            query = query.limit(limit)
        return [_run_info(run) for run in session.scalars(query).all()]

    return db.read(read)


def cancel_run(db: Database, run_id: int, *, by: str | None = None, actor: Actor | None = None) -> RunInfo:
    """A queued run is cancelled at once; a running one is flagged, and its
    worker sees the flag at its next heartbeat and stops it."""
    who = authorize(db, "cancel", f"run {run_id}", actor=actor, run_id=run_id)
    by = author_of(who, by)

    def write(session: Session) -> RunInfo:
        run = _get_run(session, run_id, for_update=True)
        now = utcnow()
        before = run.status
        if run.status == "queued":
            run.status, run.finished_at = "cancelled", now
            _event(session, run.id, "queued", "cancelled", now, note=f"by {by}")
        elif run.status == "running":
            if not run.cancel_requested:
                run.cancel_requested = True
                _event(session, run.id, "running", "running", now, run.worker_id,
                       note=f"cancel requested by {by}")
        else:
            raise ConflictError(f"run {run_id} already {run.status}; nothing to cancel")
        session.flush()
        record(session, who, "cancel", f"run {run_id}", schedule=run.version.schedule.name, run_id=run_id,
               details={"status": before, **({} if by == who.name else {"by": by})})
        return _run_info(run)

    return db.write(write)


# --- the worker's side ---------------------------------------------------------------------

def check_worker_id(worker_id: str) -> str:
    """A worker id fit for the database: one line of at most WORKER_ID_LENGTH characters."""
    try:
        check_text(worker_id, "worker id", WORKER_ID_LENGTH, single_line=True)
    except MpipeError as error:
        raise InvalidNameError(error.message) from None
    if not worker_id.strip():
        raise InvalidNameError("worker id: empty")
    return worker_id


def claim_next_run(db: Database, worker_id: str, lease_seconds: float,
                   backends: Collection[str] | None = None) -> ClaimedRun | None:
    """Atomically take the oldest queued run (of `backends`, if given) for
    `worker_id`, leased for `lease_seconds`; None when the queue is empty."""
    check_worker_id(worker_id)

    def write(session: Session) -> ClaimedRun | None:
        now = utcnow()
        expires = now + timedelta(seconds=lease_seconds)
        oldest = select(Run.id).where(Run.status == "queued").order_by(Run.id).limit(1)
        if backends is not None:
            oldest = oldest.where(Run.backend.in_(list(backends)))
        if db.dialect == "postgresql":
            # Rows another worker is claiming right now are skipped, not waited for.
            oldest = oldest.with_for_update(skip_locked=True)
        claim = (
            update(Run)
            .where(Run.id == oldest.scalar_subquery(), Run.status == "queued")
            .values(status="running", worker_id=worker_id, attempts=Run.attempts + 1,
                    lease_expires_at=expires, heartbeat_at=now, started_at=now,
                    cancel_requested=False)
            .returning(Run.id)
            .execution_options(synchronize_session=False)
        )
        run_id = session.execute(claim).scalar_one_or_none()
        if run_id is None:
            return None
        _event(session, run_id, "queued", "running", now, worker_id, note="claimed")
        run = _get_run(session, run_id)
        version = run.version
        return ClaimedRun(
            id=run.id, schedule=version.schedule.name, version=version.number, term=version.term,
            workload=version_body(version), backend=run.backend, nproc=run.nproc, steps=run.steps,
            options=dict(run.options), attempt=run.attempts, lease_expires_at=expires,
        )

    return db.write(write)


def _held(session: Session, run_id: int, worker_id: str) -> Run:
    run = _get_run(session, run_id, for_update=True)
    if run.status != "running" or run.worker_id != worker_id:
        raise LeaseLostError(
            f"run {run_id} is no longer held by worker {worker_id} "
            f"(status {run.status}, worker {run.worker_id})"
        )
    return run


def heartbeat(db: Database, run_id: int, worker_id: str, lease_seconds: float) -> bool:
    """Extend the lease; True when a cancel was requested (stop the run and
    `finish_run(..., "cancelled")`).  LeaseLostError if the lease had already
    expired and the run was marked lost or requeued."""

    def write(session: Session) -> bool:
        run = _held(session, run_id, worker_id)
        now = utcnow()
        run.heartbeat_at = now
        run.lease_expires_at = now + timedelta(seconds=lease_seconds)
        return run.cancel_requested

    return db.write(write)


def finish_run(db: Database, run_id: int, worker_id: str, status: str, *,
               exit_code: int | None = None, error: str | None = None,
               log_tail: str | None = None, memory: Iterable[Mapping[str, Any]] | None = None,
               step_plans: Iterable[Mapping[str, Any]] | None = None) -> RunInfo:
    """Record the end of a run the worker holds: `succeeded`, `failed` or
    `cancelled`, with exit code, error text and the tail of its log, and
    (`memory`) what each rank measured, in the same transaction (see `memory_for`);
    (`step_plans`) a data run's plan per step (`STEP_PLAN_FIELDS` of each are kept)."""
    if status not in ("succeeded", "failed", "cancelled"):
        raise InvalidNameError(f"a worker finishes a run as succeeded, failed or cancelled, not {status!r}")
    rows = [_memory_values(run_id, row) for row in memory or ()]
    plans = None if step_plans is None else [_step_plan(run_id, plan) for plan in step_plans]

    def write(session: Session) -> RunInfo:
        run = _held(session, run_id, worker_id)
        now = utcnow()
        run.status, run.finished_at = status, now
        run.exit_code, run.error = exit_code, error
        run.log_tail = log_tail[-LOG_TAIL_CHARS:] if log_tail else log_tail
        run.lease_expires_at = None
        if plans is not None:
            run.step_plans = plans
        _event(session, run.id, "running", status, now, worker_id,
               note="" if exit_code is None else f"exit code {exit_code}")
        for values in rows:
            session.add(RunMemory(attempt=run.attempts, **values))
        session.flush()
        return _run_info(run)

    return db.write(write)


# --- a data run's plans ----------------------------------------------------------------------

# What a step's plan keeps (executor.service.data_run.step_plans' "plan"): the step, how it was
# planned, the plan's digest, and its predicted and static makespans (the workload's time unit).
STEP_PLAN_FIELDS = ("step", "how", "digest", "predicted_makespan", "static_makespan")
MAX_STEP_PLANS = 10_000


def _step_plan(run_id: int, plan: Mapping[str, Any]) -> dict[str, Any]:
    where = f"step plan of run {run_id}"
    if not isinstance(plan, Mapping):
        raise InvalidValueError(f"{where}: expected an object, got {type(plan).__name__}")
    step = plan.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < MAX_STEP_PLANS:
        raise InvalidValueError(f"{where}: 'step' must be a whole number from 0 to {MAX_STEP_PLANS - 1}, "
                                f"got {step!r}")
    out: dict[str, Any] = {"step": step}
    for name in ("predicted_makespan", "static_makespan"):
        value = plan.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise InvalidValueError(f"{where} {step}: '{name}' must be a number >= 0, got {value!r}")
        out[name] = float(value)
    for name in ("how", "digest"):
        value = plan.get(name, "")
        if not isinstance(value, str):
            raise InvalidValueError(f"{where} {step}: '{name}' must be text")
        out[name] = value[:200]
    return out


# --- measured memory -------------------------------------------------------------------------

MEMORY_FIELDS = ("rank", "activation_peak", "parameters", "gradients", "optimizer")


def _memory_values(run_id: int, row: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {"run_id": run_id}
    for name in MEMORY_FIELDS:
        value = row.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidValueError(f"memory row for run {run_id}: '{name}' must be a whole number >= 0, "
                                    f"got {value!r}")
        values[name] = value
    op_text = row.get("activation_peak_op", "")
    if not isinstance(op_text, str):
        raise InvalidValueError(f"memory row for run {run_id}: 'activation_peak_op' must be text")
    values["activation_peak_op"] = op_text[:64]
    return values


def memory_for(db: Database, run_id: int, attempt: int | None = None) -> list[dict[str, Any]]:
    """What each rank of the run measured (rank order, bytes): `rank`,
    `activation_peak` (the most autograd kept saved for backward at once) and
    `activation_peak_op`, `parameters`, `gradients`, `optimizer`; the run's
    current attempt's (or `attempt`'s); empty when none was recorded."""

    def read(session: Session) -> list[dict[str, Any]]:
        run = _get_run(session, run_id)
        wanted = attempt if attempt is not None else current_attempt(run)
        query = select(RunMemory).where(RunMemory.run_id == run_id, RunMemory.attempt == wanted) \
            .order_by(RunMemory.rank)
        return [{"rank": m.rank, "activation_peak": m.activation_peak, "activation_peak_op": m.activation_peak_op,
                 "parameters": m.parameters, "gradients": m.gradients, "optimizer": m.optimizer}
                for m in session.scalars(query).all()]

    return db.read(read)


def expire_leases(db: Database, now: datetime | None = None) -> list[int]:
    """Runs whose lease ran out (their worker died or hung): requeued while
    attempts < max_attempts, otherwise `lost`.  Returns their ids."""

    def write(session: Session) -> list[int]:
        at = now or utcnow()
        expired = select(Run).where(Run.status == "running", Run.lease_expires_at < at).order_by(Run.id)
        if db.dialect == "postgresql":
            expired = expired.with_for_update(skip_locked=True)
        ids = []
        for run in session.scalars(expired).all():
            requeue = run.attempts < run.max_attempts and not run.cancel_requested
            new_status = "queued" if requeue else "lost"
            note = (f"lease expired (attempt {run.attempts} of {run.max_attempts}); "
                    + ("requeued" if requeue else "worker presumed dead"))
            _event(session, run.id, "running", new_status, at, run.worker_id, note=note)
            run.status = new_status
            run.lease_expires_at = None
            if requeue:
                run.worker_id = None
            else:
                run.finished_at = at
                run.error = run.error or f"lease expired: worker {run.worker_id} stopped heartbeating"
            ids.append(run.id)
        session.flush()
        return ids

    return db.write(write)


# --- timings -------------------------------------------------------------------------------

def _timing_values(run_id: int, row: TimelineRecord | Mapping[str, Any]) -> dict[str, Any]:
    get = row.get if isinstance(row, Mapping) else row._asdict().get
    values = {"run_id": run_id}
    for field in TimelineRecord._fields:
        value = get(field, {"host": "", "pipeline": 0}.get(field))
        if value is None:
            raise InvalidValueError(f"timing row for run {run_id} lacks '{field}'")
        values[COLUMN_OF.get(field, field)] = value
    return values


def current_attempt(run: "Run | RunInfo") -> int:
    """The attempt whose timings a run shows: the one going or the one that
    finished it; a requeued run waiting in the queue shows its next attempt."""
    return run.attempts + 1 if run.status == "queued" else max(run.attempts, 1)


def add_timings(db: Database, run_id: int, rows: Iterable[TimelineRecord | Mapping[str, Any]], *,
                worker_id: str | None = None, attempt: int | None = None) -> int:
    """Insert a batch of op timings (`TimelineRecord`s in seconds, or mappings
    with its fields) in one statement and one transaction; returns how many.

    A worker passes its `worker_id` and the `attempt` it claimed: the rows are
    refused (LeaseLostError) unless it still holds that attempt, so a late write
    from a worker whose lease ran out never lands among the next attempt's rows.
    Without `worker_id` (imports, tests) the rows join the run's current attempt."""
    batch = [_timing_values(run_id, row) for row in rows]
    if not batch:
        return 0

    def write(session: Session) -> int:
        if worker_id is not None:
            run = _held(session, run_id, worker_id)
            if attempt is not None and run.attempts != attempt:
                raise LeaseLostError(f"run {run_id} is on attempt {run.attempts}; worker {worker_id} "
                                     f"holds attempt {attempt} no longer")
        else:
            run = _get_run(session, run_id)
        for values in batch:
            values["attempt"] = run.attempts if worker_id is not None else current_attempt(run)
        session.execute(insert(OpTiming), batch)
        return len(batch)

    return db.write(write)


def _timings_query(session: Session, run_id: int, attempt: int | None):
    run = _get_run(session, run_id)
    return select(OpTiming).where(OpTiming.run_id == run_id,
                                  OpTiming.attempt == (attempt if attempt is not None else current_attempt(run)))


def _which_timings(query, pipeline: int | None, rows: str):
    if rows not in ("ops", "comm", "all"):
        raise ValueError(f"rows: 'ops', 'comm' or 'all', not {rows!r}")
    if pipeline is not None:
        query = query.where(OpTiming.pipeline == pipeline)
    if rows == "ops":
        query = query.where(OpTiming.kind.not_in(COMM_KINDS))
    elif rows == "comm":
        query = query.where(OpTiming.kind.in_(COMM_KINDS))
    return query


def timings_for(db: Database, run_id: int, step: int | None = None,
                attempt: int | None = None, *, pipeline: int | None = 0,
                rows: str = "ops") -> list[TimelineRecord]:
    """A run's timings (of one step, if given) ordered by step, start, rank; seconds.
    Only one attempt's: the run's current one (the one that succeeded, for a
    finished run), or `attempt` to inspect an earlier, dead one.  Only one
    pipeline's (`pipeline`, the first by default; None: every pipeline's), and
    `rows` "ops" (the schedule's ops), "comm" (the timed collectives and
    optimizer steps, `COMM_KINDS`) or "all"."""

    def read(session: Session) -> list[TimelineRecord]:
        query = _which_timings(_timings_query(session, run_id, attempt), pipeline, rows)
        if step is not None:
            query = query.where(OpTiming.step == step)
        query = query.order_by(OpTiming.step, OpTiming.start, OpTiming.rank, OpTiming.id)
        return [TimelineRecord(t.rank, t.module, t.kind, t.chunk, t.microbatch, t.step, t.start, t.end,
                               t.device, t.pipeline) for t in session.scalars(query).all()]

    return db.read(read)


def timing_count(db: Database, run_id: int, attempt: int | None = None, *, pipeline: int | None = 0,
                 rows: str = "ops") -> int:
    """How many timings the run's current attempt (or `attempt`) recorded (which: as `timings_for`)."""
    return db.read(lambda session: session.scalar(
        select(func.count()).select_from(
            _which_timings(_timings_query(session, run_id, attempt), pipeline, rows).subquery())) or 0)


def timing_attempts(db: Database, run_id: int, *, pipeline: int | None = 0, rows: str = "ops") -> dict[int, int]:
    """Timings recorded per attempt, {attempt: count}, oldest first (which: as `timings_for`)."""

    def read(session: Session) -> dict[int, int]:
        _get_run(session, run_id)
        query = _which_timings(select(OpTiming.attempt, func.count()).where(OpTiming.run_id == run_id),
                               pipeline, rows)
        rows_ = session.execute(query.group_by(OpTiming.attempt).order_by(OpTiming.attempt)).all()
        return {int(a): int(n) for a, n in rows_}

    return db.read(read)


def release_run(db: Database, run_id: int, worker_id: str, *, reason: str) -> RunInfo:
    """Hand a run the worker holds back to the queue (the worker is shutting down):
    it is `queued` again for any worker.  The released attempt does not count
    against `max_attempts` (its limit grows by one); its timings stay apart,
    under their attempt number."""

    def write(session: Session) -> RunInfo:
        run = _held(session, run_id, worker_id)
        now = utcnow()
        run.status, run.worker_id, run.lease_expires_at = "queued", None, None
        run.max_attempts += 1
        _event(session, run.id, "running", "queued", now, worker_id,
               note=f"released by the worker ({reason}); attempt {run.attempts} does not count")
        session.flush()
        return _run_info(run)

    return db.write(write)


def is_finished(status: str) -> bool:
    return status in FINISHED_STATUSES


# The error a worker ends a run with when it ran to the end but its gradients differ from the
# reference (`executor.service.queue_worker.grad_check_failure`); before issue 38 it began
# "gradient check failed".
GRADIENTS_DIFFER = "ran; gradients differ"
_GRADIENTS_DIFFER_ERRORS = (GRADIENTS_DIFFER, "gradient check failed")


def shown_status(run) -> str:
    """A run's status as shown: one that ran to the end but whose gradients differ from the
    reference is "ran; gradients differ", not a crash's "failed" (it is stored as failed)."""
    if run.status == "failed" and (run.error or "").startswith(_GRADIENTS_DIFFER_ERRORS):
        return GRADIENTS_DIFFER
    return run.status
