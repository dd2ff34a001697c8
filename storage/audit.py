"""The audit trail: every write a person makes to the library or the run queue,
and every one refused, with who, when and what.

Each write function of the storage layer records its row inside its own
transaction (`record`), so a write and its row are committed together or not
at all, and no caller can forget it.  A refused request is recorded in a
transaction of its own (`record_refusal`), since the write it asked for never
starts.  The worker's bookkeeping (claims, heartbeats, timings, finishing,
expired leases) is not a person's write: a run's status history
(`storage.run_events`) records it, with the worker's id.

The database keeps the rows as written: its triggers refuse to update or
delete them (migration 0003).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.models import AUDIT_TARGET_LENGTH, NAME_LENGTH, AuditEvent, utcnow

DEFAULT_LIMIT = 200
DETAIL_TEXT = 500  # a long value in the details (a description, a term) is cut to this


class Actor(Protocol):
    """Who acts (`storage.access.Actor`, which imports this module)."""

    name: str
    role: str
    via: str


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    actor: str
    role: str
    via: str
    db_user: str | None
    action: str
    target: str
    schedule: str | None
    run_id: int | None
    outcome: str
    details: dict[str, Any]


def _clean(text: str) -> str:
    """Text fit for the database: no NUL (PostgreSQL refuses it, also inside JSON)."""
    return text.replace("\x00", "\ufffd")


def _short(value: Any) -> Any:
    if isinstance(value, str):
        value = _clean(value)
        return value if len(value) <= DETAIL_TEXT else value[:DETAIL_TEXT - 3] + "..."
    if isinstance(value, dict):
        return {str(k): _short(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_short(v) for v in value]
    return value


def _db_user(session: Session) -> str | None:
    """The database's own name for this connection's user (None on SQLite, which has none)."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    return session.scalar(select(func.current_user()))


def record(session: Session, actor: Actor, action: str, target: str, *, outcome: str = "ok",
           schedule: str | None = None, run_id: int | None = None,
           details: dict[str, Any] | None = None) -> None:
    """Add the audit row of a write to the write's own transaction."""
    session.add(AuditEvent(
        at=utcnow(), actor=_clean(actor.name)[:NAME_LENGTH], role=actor.role, via=actor.via,
        db_user=_db_user(session), action=action, target=_clean(target)[:AUDIT_TARGET_LENGTH],
        schedule=None if schedule is None else _clean(schedule)[:NAME_LENGTH], run_id=run_id, outcome=outcome,
        details=_short(details or {})))


def record_refusal(db, actor: Actor, action: str, target: str, *, schedule: str | None = None,
                   run_id: int | None = None, details: dict[str, Any] | None = None) -> None:
    """Record a refused request, in a transaction of its own."""
    db.write(lambda session: record(session, actor, action, target, outcome="refused", schedule=schedule,
                                    run_id=run_id, details=details))


def _entry(row: AuditEvent) -> AuditEntry:
    return AuditEntry(row.at, row.actor, row.role, row.via, row.db_user, row.action, row.target,
                      row.schedule, row.run_id, row.outcome, dict(row.details))


def list_audit(db, *, since: datetime | None = None, user: str | None = None, schedule: str | None = None,
               run_id: int | None = None, actions: tuple[str, ...] | None = None,
               limit: int | None = DEFAULT_LIMIT) -> list[AuditEntry]:
    """Audit rows, newest first: since a time, by one user (the actor, or the
    database user), about one schedule or one run, of some actions."""

    def read(session: Session) -> list[AuditEntry]:
        query = select(AuditEvent).order_by(AuditEvent.at.desc(), AuditEvent.id.desc())
        if since is not None:
            query = query.where(AuditEvent.at >= since)
        if user is not None:
            query = query.where((AuditEvent.actor == user) | (AuditEvent.db_user == user))
        if schedule is not None:
            query = query.where(AuditEvent.schedule == schedule)
        if run_id is not None:
            query = query.where(AuditEvent.run_id == run_id)
        if actions is not None:
            query = query.where(AuditEvent.action.in_(actions))
        if limit is not None:
            query = query.limit(limit)
        return [_entry(row) for row in session.scalars(query).all()]

    return db.read(read)
