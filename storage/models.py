"""The tables: schedule library (schedules, immutable versions, saved workloads),
run records (runs, their status history, per-op timings, measured memory per
rank) and the audit trail
(who changed what, and what was refused).

The schema itself is owned by the Alembic migrations in `storage/migrations`;
these classes must describe the same tables (a test compares them).  Rows are
never deleted: archiving hides a schedule, and versions cannot be updated.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    event,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

RUN_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "lost")
AUDIT_OUTCOMES = ("ok", "refused")
FINISHED_STATUSES = ("succeeded", "failed", "cancelled", "lost")

NAME_LENGTH = 100
WORKLOAD_LABEL_LENGTH = 200
WORKER_ID_LENGTH = 200
TAG_LENGTH = 64
AUDIT_TARGET_LENGTH = 300


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every database.

    PostgreSQL stores `timestamptz`; SQLite has no time zones, so the value is
    stored as naive UTC text and made aware again when read.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


# Integer primary keys that may grow large; SQLite needs plain INTEGER for its rowid alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class Workload(Base):
    """A saved, named workload; its bodies live in immutable versions."""

    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(NAME_LENGTH))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)

    versions: Mapped[list[WorkloadVersion]] = relationship(
        back_populates="workload", order_by="WorkloadVersion.number"
    )


class WorkloadVersion(Base):
    __tablename__ = "workload_versions"
    __table_args__ = (UniqueConstraint("workload_id", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    number: Mapped[int]
    body: Mapped[dict[str, Any]]
    message: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(NAME_LENGTH))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    workload: Mapped[Workload] = relationship(back_populates="versions")


class Schedule(Base):
    """A named entry of the library.  Its content lives in immutable versions."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(NAME_LENGTH), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)

    versions: Mapped[list[ScheduleVersion]] = relationship(
        back_populates="schedule", order_by="ScheduleVersion.number"
    )
    tags: Mapped[list[ScheduleTag]] = relationship(
        back_populates="schedule", order_by="ScheduleTag.tag", cascade="all, delete-orphan"
    )


class ScheduleTag(Base):
    __tablename__ = "schedule_tags"

    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(TAG_LENGTH), primary_key=True, index=True)

    schedule: Mapped[Schedule] = relationship(back_populates="tags")


class ScheduleVersion(Base):
    """One immutable state of a schedule: the canonical term, the workload it was
    evaluated on, and the evaluated summary cached for listing.

    `parent_id` is the lineage: the previous version of the same schedule, or,
    for version 1 of a fork, the version it was forked from.
    """

    __tablename__ = "schedule_versions"
    __table_args__ = (UniqueConstraint("schedule_id", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id"))
    number: Mapped[int]
    parent_id: Mapped[Optional[int]] = mapped_column(ForeignKey("schedule_versions.id"), index=True)
    term: Mapped[str] = mapped_column(Text)
    # Either a saved workload version, or an inline body, or neither (the core's default).
    workload_version_id: Mapped[Optional[int]] = mapped_column(ForeignKey("workload_versions.id"))
    workload: Mapped[Optional[dict[str, Any]]]
    workload_label: Mapped[str] = mapped_column(String(WORKLOAD_LABEL_LENGTH), default="default")
    message: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(NAME_LENGTH))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    makespan: Mapped[Optional[float]] = mapped_column(Float)
    bubble_ratio: Mapped[Optional[float]] = mapped_column(Float)
    efficiency: Mapped[Optional[float]] = mapped_column(Float)
    devices: Mapped[Optional[int]]
    summary: Mapped[dict[str, Any]]

    schedule: Mapped[Schedule] = relationship(back_populates="versions")
    parent: Mapped[Optional[ScheduleVersion]] = relationship(remote_side=[id])
    workload_version: Mapped[Optional[WorkloadVersion]] = relationship()


class Run(Base):
    """One launch of a schedule version, from queued to a finished status."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in RUN_STATUSES) + ")", name="status"
        ),
        Index("ix_runs_status_id", "status", "id"),
        Index("ix_runs_status_lease_expires_at", "status", "lease_expires_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    schedule_version_id: Mapped[int] = mapped_column(ForeignKey("schedule_versions.id"), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    nproc: Mapped[int]
    steps: Mapped[int]
    options: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), default="queued")
    launched_by: Mapped[str] = mapped_column(String(NAME_LENGTH))
    worker_id: Mapped[Optional[str]] = mapped_column(String(WORKER_ID_LENGTH))
    attempts: Mapped[int] = mapped_column(default=0)
    max_attempts: Mapped[int] = mapped_column(default=1)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    lease_expires_at: Mapped[Optional[datetime]]
    heartbeat_at: Mapped[Optional[datetime]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[Optional[datetime]]
    finished_at: Mapped[Optional[datetime]]
    exit_code: Mapped[Optional[int]]
    error: Mapped[Optional[str]] = mapped_column(Text)
    log_tail: Mapped[Optional[str]] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16), default="queued", server_default="queued")
    # sha256 of the imported trace files (None for a queued run)
    source_digest: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    # A data run (`--data`): per step the plan it ran and its predicted makespan (`runs.STEP_PLAN_FIELDS`).
    step_plans: Mapped[Optional[list[Any]]] = mapped_column(JSON)

    version: Mapped[ScheduleVersion] = relationship()
    events: Mapped[list[RunEvent]] = relationship(order_by="RunEvent.id")


class RunEvent(Base):
    """A status transition of a run, with when it happened and who caused it."""

    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("runs.id"), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    from_status: Mapped[Optional[str]] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    worker_id: Mapped[Optional[str]] = mapped_column(String(WORKER_ID_LENGTH))
    note: Mapped[str] = mapped_column(Text, default="")


class OpTiming(Base):
    """When one op of a run ran: seconds on the run's common clock (a stored
    `mpipe_core.ir.timeline_record.TimelineRecord`: `rank` is its device index,
    `device` its host label)."""

    __tablename__ = "op_timings"
    __table_args__ = (Index("ix_op_timings_run_id_step", "run_id", "step"),
                      Index("ix_op_timings_run_id_attempt_step", "run_id", "attempt", "step"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("runs.id"))
    # Which attempt of the run wrote it (`Run.attempts` when it was written): a
    # requeued run's dead attempt keeps its rows apart.
    attempt: Mapped[int] = mapped_column(Integer, server_default="1")
    step: Mapped[int]
    rank: Mapped[int]
    module: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # an op's (F, B, ...) or a collective's (dp_comm, ...)
    chunk: Mapped[int]
    microbatch: Mapped[int]
    start: Mapped[float] = mapped_column("start_s", Float)
    end: Mapped[float] = mapped_column("end_s", Float)
    device: Mapped[str] = mapped_column(String(64), default="")
    # Which pipeline of the run's layout (`TimelineRecord.pipeline`); 0: the first, or the only one.
    pipeline: Mapped[int] = mapped_column(Integer, server_default="0", default=0)


class RunMemory(Base):
    """What one rank of a run measured about memory, in bytes (per attempt, as
    timings are): the most that autograd kept saved for backward at once, and
    the op running then; the parameters of the parts it held, their gradients
    and the optimizer's state (`executor.runtime.memory_meter`)."""

    __tablename__ = "run_memory"
    __table_args__ = (UniqueConstraint("run_id", "attempt", "rank"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("runs.id"))
    attempt: Mapped[int]
    rank: Mapped[int]
    activation_peak: Mapped[int] = mapped_column(BigInteger)
    activation_peak_op: Mapped[str] = mapped_column(String(64))
    parameters: Mapped[int] = mapped_column(BigInteger)
    gradients: Mapped[int] = mapped_column(BigInteger)
    optimizer: Mapped[int] = mapped_column(BigInteger)


class RunStepFigure(Base):
    """One rank's step summary in one step of an imported run, seconds (Ascend's
    step_trace_time.csv or msprof-analyze's cluster_step_trace_time.csv;
    `mpipe_core.formats.step_summary`), with the rank's dp/pp/tp index when
    the summary gives it."""

    __tablename__ = "run_step_figures"
    __table_args__ = (UniqueConstraint("run_id", "rank", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("runs.id"))
    rank: Mapped[int]
    step: Mapped[int]
    computing: Mapped[float] = mapped_column(Float)
    comm_not_overlapped: Mapped[float] = mapped_column(Float)
    overlapped: Mapped[float] = mapped_column(Float)
    communication: Mapped[float] = mapped_column(Float)
    free: Mapped[float] = mapped_column(Float)
    stage: Mapped[float] = mapped_column(Float)
    bubble: Mapped[float] = mapped_column(Float)
    comm_exclude_receive: Mapped[float] = mapped_column(Float)
    preparing: Mapped[float] = mapped_column(Float)
    dp_index: Mapped[Optional[int]] = mapped_column(Integer)
    pp_index: Mapped[Optional[int]] = mapped_column(Integer)
    tp_index: Mapped[Optional[int]] = mapped_column(Integer)


class RunComm(Base):
    """One communication event of an imported run's rank (an Ascend trace's HCCL
    lane: `hcom_allReduce_…`, `hcom_send_…`), seconds on the run's clock."""

    __tablename__ = "run_comm"
    __table_args__ = (Index("ix_run_comm_run_id_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("runs.id"))
    rank: Mapped[int]
    step: Mapped[int]
    kind: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(128))
    start: Mapped[float] = mapped_column("start_s", Float)
    end: Mapped[float] = mapped_column("end_s", Float)


class AuditEvent(Base):
    """One write a person made, or tried to make and was refused: who, when, what.

    `actor` is the signed-in identity (the app) or the local user (CLI, API);
    `db_user` the database's own user name where the database has one
    (PostgreSQL), which `MPIPE_USER` cannot change.  `schedule` and `run_id`
    name what it touched, so a schedule's or a run's trail is one indexed
    query; they are plain columns, not foreign keys: a refused request may
    name something that does not exist.
    """

    __tablename__ = "audit_events"
    __table_args__ = (
        CheckConstraint("outcome IN (" + ", ".join(f"'{s}'" for s in AUDIT_OUTCOMES) + ")", name="outcome"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(NAME_LENGTH), index=True)
    role: Mapped[str] = mapped_column(String(16))
    via: Mapped[str] = mapped_column(String(16))
    db_user: Mapped[Optional[str]] = mapped_column(String(NAME_LENGTH))
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(AUDIT_TARGET_LENGTH))
    schedule: Mapped[Optional[str]] = mapped_column(String(NAME_LENGTH), index=True)
    run_id: Mapped[Optional[int]] = mapped_column(BigInteger, index=True)
    outcome: Mapped[str] = mapped_column(String(8))
    details: Mapped[dict[str, Any]]


@event.listens_for(ScheduleVersion, "before_update")
@event.listens_for(WorkloadVersion, "before_update")
def _refuse_version_update(mapper, connection, target) -> None:
    # The database refuses too (a trigger); this stops it before any SQL is sent.
    raise ValueError(f"{type(target).__name__} rows are immutable; save a new version")
