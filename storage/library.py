"""The team's schedule library: save, list, show, history, diff, fork, tag, archive.

A schedule is a name; its content is a list of immutable versions.  Saving a
term evaluates it with the core first (an invalid term is refused with the
core's own message) and stores the canonical text the core prints, the
workload it was evaluated on, and the summary metrics for listing.  Nothing is
ever overwritten or deleted: editing adds a version, archiving hides.

Every function takes an open `Database` and returns plain frozen records, so
callers never hold a session.
"""
from __future__ import annotations

import difflib
import math
import numbers
import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.inputs import check_text
from storage.access import Actor, author_of, authorize
from storage.audit import record
from storage.db import Database
from storage.errors import ConflictError, DuplicateNameError, InvalidNameError, NotFoundError
from storage.models import (
    NAME_LENGTH,
    TAG_LENGTH,
    WORKLOAD_LABEL_LENGTH,
    Schedule,
    ScheduleTag,
    ScheduleVersion,
    Workload,
    WorkloadVersion,
    utcnow,
)

# Versions are 32-bit integers in the database.
MAX_VERSION = 2**31 - 1
# Descriptions and messages: a few pages at most.
TEXT_LENGTH = 10_000
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+/-]*\Z")
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]*\Z")
SAVED_WORKLOAD_PREFIX = "saved:"  # a saved workload as a source: "saved:NAME" or "saved:NAME@N"
# Metrics compared by `diff` and shown by `list`, in this order.
SUMMARY_METRICS = ("makespan", "bubble_ratio", "efficiency", "lower_bound", "devices", "ops")


# --- records -------------------------------------------------------------------------------

@dataclass(frozen=True)
class VersionInfo:
    schedule: str
    number: int
    term: str
    workload: dict[str, Any] | None  # the body evaluated (None: the core's default)
    workload_label: str  # "default", "saved:NAME@N", a preset with its parallel settings ("internvl-26b tp=8,sp", "NAME (edited)"), a file name
    message: str
    author: str
    created_at: datetime
    summary: dict[str, Any]
    parent: str | None  # "name@n": previous version, or the version this fork came from

    @property
    def ref(self) -> str:
        return f"{self.schedule}@{self.number}"

    def metric(self, key: str) -> Any:
        return self.summary.get(key)


@dataclass(frozen=True)
class ScheduleInfo:
    name: str
    description: str
    author: str
    created_at: datetime
    updated_at: datetime
    archived: bool
    tags: tuple[str, ...]
    latest: VersionInfo
    version_count: int
    forked_from: str | None  # "name@n" of the version version 1 was forked from


@dataclass(frozen=True)
class VersionDiff:
    a: VersionInfo
    b: VersionInfo
    term_diff: tuple[str, ...]  # unified diff lines; empty when the terms are equal
    metrics: dict[str, tuple[Any, Any, Any]]  # key -> (a, b, b - a or None)
    workload_changed: bool


@dataclass(frozen=True)
class WorkloadInfo:
    name: str
    number: int
    body: dict[str, Any]
    message: str
    author: str
    created_at: datetime
    description: str
    version_count: int

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.number}"


# --- names and references ------------------------------------------------------------------

def _shown(value: Any) -> str:
    """A user's value in a message: quoted, and cut short when long."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_name(name: str, what: str = "schedule") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > NAME_LENGTH:
        raise InvalidNameError(
            f"invalid {what} name {_shown(name)}: use letters, digits and . _ + / - "
            f"(starting with a letter or digit, at most {NAME_LENGTH} characters)"
        )
    return name


def check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not TAG_RE.match(tag) or len(tag) > TAG_LENGTH:
        raise InvalidNameError(
            f"invalid tag {_shown(tag)}: use letters, digits and . _ : + - "
            f"(starting with a letter or digit, at most {TAG_LENGTH} characters)"
        )
    return tag


def check_meta(*, author: str | None = None, description: str | None = None,
               message: str | None = None, search: str | None = None) -> None:
    """Free text bound for the database: no NUL (PostgreSQL refuses it), bounded length."""
    for value, what, limit in ((author, "author", NAME_LENGTH), (description, "description", TEXT_LENGTH),
                               (message, "message", TEXT_LENGTH), (search, "search", TEXT_LENGTH)):
        if value is not None:
            try:
                check_text(value, what, limit, single_line=what == "author")
            except MpipeError as error:
                raise InvalidNameError(error.message) from None


def parse_ref(ref: str, what: str = "schedule") -> tuple[str, int | None]:
    """`"name"` -> (name, None: the latest); `"name@3"` -> (name, 3)."""
    name, at, number = ref.partition("@")
    if not at:
        return check_name(name, what), None
    if not number.isdigit() or not 1 <= int(number) <= MAX_VERSION:
        raise InvalidNameError(f"bad version reference {_shown(ref)}: expected NAME or NAME@NUMBER (from 1)")
    return check_name(name, what), int(number)


# --- evaluation via the core ---------------------------------------------------------------

def _json_safe(value: Any) -> Any:
    """The summary as plain JSON (numbers may come back as numpy or Fraction)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return str(value)


def evaluate_term(term: str, workload: dict[str, Any] | None,
                  max_ops: int | None = None) -> tuple[str, dict[str, Any]]:
    """(canonical term, summary) from the core; raises the core's MpipeError."""
    from mpipe_core.api import evaluate

    evaluation = evaluate(term, workload, max_ops=max_ops)
    return evaluation.term, _json_safe(evaluation.summary())


def resolve_workload_source(source: Any) -> tuple[dict[str, Any] | None, str]:
    """A preset name, file path or dict -> (body, label); None -> the default."""
    if source is None:
        return None, "default"
    from mpipe_core.workloads.workload import load_workload

    from mpipe_core.workloads.labels import workload_label

    body = load_workload(source).to_dict()
    if isinstance(source, Mapping):  # a preset's document, maybe with parallel settings: named by them
        label = workload_label(body, fallback=str(source.get("name") or "inline"))
    else:
        label = os.path.basename(str(source)) or str(source)
    return body, label[:WORKLOAD_LABEL_LENGTH]


def shown_workload_label(label: str, body: dict[str, Any] | None) -> str:
    """The name a version's workload is shown by: a saved workload's reference or
    the default as stored, else the full workload (`workload_label`: the preset and
    the parallel settings that differ from it, `preset (edited)`), so a version
    saved before labels named the settings reads right too."""
    from mpipe_core.workloads.labels import workload_label

    if body is None or saved_workload_name(label) is not None:
        return label
    return workload_label(body, fallback=label)[:WORKLOAD_LABEL_LENGTH]


def eval_command(version: "VersionInfo", db_url: str | None = None) -> str:
    """The `mpipe eval` command that re-evaluates `version` to its stored figures:
    on its saved workload (`-w saved:NAME@N`), the preset and its `--parallel`
    settings, the default, or else the document stored with the version itself
    (`-w version:NAME@N`: an edited or explicit one, a plan's layout); `--db` when
    given and the command reads the database."""
    import shlex

    from mpipe_core.workloads.labels import cli_arguments

    words = ["mpipe", "eval", version.term]
    if saved_workload_name(version.workload_label) is not None:
        words += ["-w", version.workload_label] + (["--db", db_url] if db_url else [])
    elif version.workload is not None:
        arguments = cli_arguments(version.workload)
        if arguments is None:
            arguments = ["-w", f"version:{version.ref}"] + (["--db", db_url] if db_url else [])
        words += arguments
    return " ".join(shlex.quote(w) for w in words)


# --- lookups inside a session --------------------------------------------------------------

def _schedule(session: Session, name: str, *, for_update: bool = False) -> Schedule:
    query = select(Schedule).where(Schedule.name == name)
    if for_update and session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    schedule = session.scalars(query).one_or_none()
    if schedule is None:
        raise NotFoundError(f"no schedule named '{name}'{_did_you_mean(session, Schedule, name)}")
    return schedule


def _did_you_mean(session: Session, model, name: str) -> str:
    names = session.scalars(select(model.name)).all()
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


SAVED_NAMES_SHOWN = 20  # a refusal lists at most this many saved workloads


def _saved_workloads(session: Session) -> str:
    """The saved workloads there are, for a refusal: " (saved workloads: a, b)" or
    that there are none, and how one is saved."""
    names = sorted(session.scalars(select(Workload.name)).all())
    if not names:
        return (f" (this database has no saved workloads: `mpipe library workload save NAME SOURCE` saves one; "
                f"{session.get_bind().url.render_as_string(hide_password=True)})")
    shown = ", ".join(names[:SAVED_NAMES_SHOWN]) + (f" and {len(names) - SAVED_NAMES_SHOWN} more"
                                                    if len(names) > SAVED_NAMES_SHOWN else "")
    return f" (saved workloads: {shown})"


def find_version(session: Session, ref: str) -> ScheduleVersion:
    name, number = parse_ref(ref)
    schedule = _schedule(session, name)
    if number is None:
        number = _latest_number(session, ScheduleVersion, ScheduleVersion.schedule_id, schedule.id)
    version = session.scalars(
        select(ScheduleVersion).where(ScheduleVersion.schedule_id == schedule.id,
                                      ScheduleVersion.number == number)
    ).one_or_none()
    if version is None:
        latest = _latest_number(session, ScheduleVersion, ScheduleVersion.schedule_id, schedule.id)
        raise NotFoundError(f"schedule '{name}' has no version {number} (versions 1..{latest})")
    return version


def _latest_number(session: Session, model, owner_column, owner_id: int) -> int:
    return session.scalar(select(func.max(model.number)).where(owner_column == owner_id)) or 0


def _workload_version(session: Session, ref: str) -> WorkloadVersion:
    name, number = parse_ref(ref, "workload")
    workload = session.scalars(select(Workload).where(Workload.name == name)).one_or_none()
    if workload is None:
        raise NotFoundError(f"no saved workload named '{name}'{_did_you_mean(session, Workload, name)}"
                            f"{_saved_workloads(session)}")
    if number is None:
        number = _latest_number(session, WorkloadVersion, WorkloadVersion.workload_id, workload.id)
    version = session.scalars(
        select(WorkloadVersion).where(WorkloadVersion.workload_id == workload.id,
                                      WorkloadVersion.number == number)
    ).one_or_none()
    if version is None:
        raise NotFoundError(f"saved workload '{name}' has no version {number}")
    return version


def version_body(version: ScheduleVersion) -> dict[str, Any] | None:
    if version.workload_version is not None:
        return version.workload_version.body
    return version.workload


def _version_info(version: ScheduleVersion) -> VersionInfo:
    parent = version.parent
    return VersionInfo(
        schedule=version.schedule.name,
        number=version.number,
        term=version.term,
        workload=version_body(version),
        workload_label=shown_workload_label(version.workload_label, version_body(version)),
        message=version.message,
        author=version.author,
        created_at=version.created_at,
        summary=dict(version.summary),
        parent=f"{parent.schedule.name}@{parent.number}" if parent is not None else None,
    )


def _schedule_info(session: Session, schedule: Schedule) -> ScheduleInfo:
    count, lowest, highest = session.execute(
        select(func.count(), func.min(ScheduleVersion.number), func.max(ScheduleVersion.number))
        .where(ScheduleVersion.schedule_id == schedule.id)
    ).one()
    ends = {v.number: v for v in session.scalars(
        select(ScheduleVersion).where(ScheduleVersion.schedule_id == schedule.id,
                                      ScheduleVersion.number.in_([lowest, highest])))}
    first, latest = ends[lowest], ends[highest]
    forked = first.parent
    return ScheduleInfo(
        name=schedule.name,
        description=schedule.description,
        author=schedule.author,
        created_at=schedule.created_at,
        updated_at=schedule.updated_at,
        archived=schedule.archived,
        tags=tuple(t.tag for t in schedule.tags),
        latest=_version_info(latest),
        version_count=count,
        forked_from=f"{forked.schedule.name}@{forked.number}" if forked is not None else None,
    )


# --- writing -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Content:
    term: str
    summary: dict[str, Any]
    body: dict[str, Any] | None
    label: str
    saved_workload: str | None  # "name@n" when the body is a saved workload version


def saved_workload_ref(ref: str) -> str:
    """How a saved workload version is named as a workload source: "saved:NAME@N"."""
    return SAVED_WORKLOAD_PREFIX + ref


def saved_workload_name(source: Any) -> str | None:
    """"NAME" or "NAME@N" when `source` names a saved workload ("saved:..."), else None."""
    if isinstance(source, str) and source.startswith(SAVED_WORKLOAD_PREFIX):
        return source[len(SAVED_WORKLOAD_PREFIX):]
    return None


def resolve_workload(db: Database, workload: Any) -> tuple[dict[str, Any] | None, str, str | None]:
    """(body, label, saved "name@n" or None) of a workload source: "saved:NAME[@N]",
    a preset, a file, a dict or None (the core's default)."""
    name = saved_workload_name(workload)
    if name is None:
        body, label = resolve_workload_source(workload)
        return body, label, None

    def read(session: Session) -> tuple[dict[str, Any], str]:
        version = _workload_version(session, name)
        return version.body, f"{version.workload.name}@{version.number}"

    body, saved = db.read(read)
    return body, saved_workload_ref(saved), saved


def _prepare(db: Database, term: str, workload: Any) -> _Content:
    """Resolve the workload and evaluate the term, outside any write transaction
    (evaluation may take a while; the database stays free meanwhile)."""
    body, label, saved = resolve_workload(db, workload)
    canonical, summary = evaluate_term(term, body)
    return _Content(canonical, summary, body, label, saved)


def _add_version(session: Session, schedule: Schedule, content: _Content, *, message: str,
                 author: str, parent: ScheduleVersion | None, now: datetime) -> ScheduleVersion:
    number = _latest_number(session, ScheduleVersion, ScheduleVersion.schedule_id, schedule.id) + 1
    saved_version = None
    if content.saved_workload is not None:
        saved_version = _workload_version(session, content.saved_workload)
    version = ScheduleVersion(
        schedule=schedule,
        number=number,
        parent=parent,
        term=content.term,
        workload_version=saved_version,
        workload=None if saved_version is not None else content.body,
        workload_label=content.label,
        message=message,
        author=author,
        created_at=now,
        makespan=number_or_none(content.summary.get("makespan")),
        bubble_ratio=number_or_none(content.summary.get("bubble_ratio")),
        efficiency=number_or_none(content.summary.get("efficiency")),
        devices=int_or_none(content.summary.get("devices")),
        summary=content.summary,
    )
    session.add(version)
    schedule.updated_at = now
    session.flush()
    return version


def number_or_none(value: Any) -> float | None:
    """A JSON number as a float; anything else (bools included) as None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def int_or_none(value: Any) -> int | None:
    """A JSON integer as an int; anything else (bools included) as None."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def save_schedule(db: Database, name: str, term: str, *, workload: Any = None, message: str = "",
                  author: str | None = None, description: str | None = None,
                  tags: Iterable[str] = (), update: bool = False, actor: Actor | None = None,
                  reuse_same: bool = False) -> VersionInfo:
    """Save `term` as a new schedule `name` (version 1), or with `update=True`
    as the next version of the existing schedule `name`.  With `reuse_same`, a
    latest version that already has this term and workload is returned as it is
    (nothing written) instead of refused.

    `workload`: None (the core's default), a preset name, a file path, a dict,
    or "saved:NAME[@N]" for a workload saved in the library.  `actor` (default:
    the database handle's, else the local user) must be allowed to save; a
    signed-in actor is the author, the local user may name another."""
    who = authorize(db, "save", str(name), actor=actor, schedule=str(name)[:NAME_LENGTH])
    check_name(name)
    tags = sorted({check_tag(t) for t in tags})
    check_meta(author=author, description=description, message=message)
    author = author_of(who, author)
    content = _prepare(db, term, workload)

    def write(session: Session) -> VersionInfo:
        now = utcnow()
        existing = session.scalars(select(Schedule).where(Schedule.name == name)).one_or_none()
        if not update:
            if existing is not None:
                raise DuplicateNameError(
                    f"schedule '{name}' already exists; update it to add a version, "
                    f"or choose another name"
                )
            schedule = Schedule(name=name, description=description or "", author=author,
                                created_at=now, updated_at=now, archived=False)
            session.add(schedule)
            parent = None
        else:
            schedule = _schedule(session, name, for_update=True)
            if schedule.archived:
                raise ConflictError(f"schedule '{name}' is archived; restore it before adding versions")
            parent = find_version(session, name)
            if parent.term == content.term and version_body(parent) == content.body:
                if reuse_same:
                    return _version_info(parent)
                raise ConflictError(
                    f"schedule '{name}' version {parent.number} already has this term and "
                    f"workload; nothing to save"
                )
            if description is not None:
                schedule.description = description
        for tag in tags:
            if tag not in {t.tag for t in schedule.tags}:
                schedule.tags.append(ScheduleTag(tag=tag))
        version = _add_version(session, schedule, content, message=message, author=author,
                               parent=parent, now=now)
        record(session, who, "save", f"{name}@{version.number}", schedule=name,
               details=_with_author({"term": content.term, "workload": content.label, "new_version": update,
                                     "tags": tags, "message": message}, author, who))
        return _version_info(version)

    return db.write(write)


def _with_author(details: dict[str, Any], author: str, who: Actor) -> dict[str, Any]:
    """The audit details, naming the recorded author where it is not the actor."""
    return details if author == who.name else {**details, "author": author}


def fork_schedule(db: Database, source: str, new_name: str, *, author: str | None = None,
                  description: str | None = None, message: str | None = None,
                  actor: Actor | None = None) -> VersionInfo:
    """A new schedule whose version 1 copies `source` ("name" or "name@n")."""
    who = authorize(db, "fork", str(new_name), actor=actor, schedule=str(new_name)[:NAME_LENGTH],
                    details={"from": str(source)})
    check_name(new_name)
    check_meta(author=author, description=description, message=message)
    author = author_of(who, author)

    def write(session: Session) -> VersionInfo:
        origin = find_version(session, source)
        if session.scalars(select(Schedule.id).where(Schedule.name == new_name)).first() is not None:
            raise DuplicateNameError(f"schedule '{new_name}' already exists; choose another name")
        now = utcnow()
        schedule = Schedule(
            name=new_name,
            description=origin.schedule.description if description is None else description,
            author=author, created_at=now, updated_at=now, archived=False,
        )
        schedule.tags = [ScheduleTag(tag=t.tag) for t in origin.schedule.tags]
        session.add(schedule)
        saved = origin.workload_version
        content = _Content(
            origin.term, dict(origin.summary), origin.workload, origin.workload_label,
            f"{saved.workload.name}@{saved.number}" if saved is not None else None,
        )
        version = _add_version(
            session, schedule, content, author=author, parent=origin, now=now,
            message=message if message is not None else f"forked from {origin.schedule.name}@{origin.number}",
        )
        record(session, who, "fork", f"{new_name}@1", schedule=new_name,
               details=_with_author({"from": f"{origin.schedule.name}@{origin.number}"}, author, who))
        return _version_info(version)

    return db.write(write)


def tag_schedule(db: Database, name: str, add: Iterable[str] = (),
                 remove: Iterable[str] = (), *, actor: Actor | None = None) -> tuple[str, ...]:
    """Add and remove tags; returns the schedule's tags after the change."""
    who = authorize(db, "tag", str(name), actor=actor, schedule=str(name)[:NAME_LENGTH])
    add = {check_tag(t) for t in add}
    remove = {check_tag(t) for t in remove}

    def write(session: Session) -> tuple[str, ...]:
        schedule = _schedule(session, name, for_update=True)
        have = {t.tag: t for t in schedule.tags}
        missing = sorted(remove - set(have))
        if missing:
            raise NotFoundError(f"schedule '{name}' has no tag {', '.join(repr(t) for t in missing)}")
        for tag in remove:
            schedule.tags.remove(have[tag])
        for tag in sorted(add - set(have)):
            schedule.tags.append(ScheduleTag(tag=tag))
        schedule.updated_at = utcnow()
        session.flush()
        record(session, who, "tag", name, schedule=name,
               details={"added": sorted(add - set(have)), "removed": sorted(remove)})
        return tuple(sorted(t.tag for t in schedule.tags))

    return db.write(write)


def describe_schedule(db: Database, name: str, description: str, *,
                      actor: Actor | None = None) -> ScheduleInfo:
    """Set a schedule's description (what it is for; versions keep their own messages)."""
    who = authorize(db, "describe", str(name), actor=actor, schedule=str(name)[:NAME_LENGTH])
    check_name(name)
    check_meta(description=description)

    def write(session: Session) -> ScheduleInfo:
        schedule = _schedule(session, name, for_update=True)
        schedule.description = description
        schedule.updated_at = utcnow()
        session.flush()
        record(session, who, "describe", name, schedule=name, details={"description": description})
        return _schedule_info(session, schedule)

    return db.write(write)


def archive_schedule(db: Database, name: str, *, restore: bool = False,
                     actor: Actor | None = None) -> ScheduleInfo:
    """Hide a schedule from listings (or show it again).  Its versions and the
    runs that refer to them stay."""
    action = "restore" if restore else "archive"
    who = authorize(db, action, str(name), actor=actor, schedule=str(name)[:NAME_LENGTH])

    def write(session: Session) -> ScheduleInfo:
        schedule = _schedule(session, name, for_update=True)
        changed = schedule.archived != (not restore)
        if changed:
            schedule.archived = not restore
            schedule.updated_at = utcnow()
            session.flush()
        record(session, who, action, name, schedule=name, details={"changed": changed})
        return _schedule_info(session, schedule)

    return db.write(write)


# --- reading -------------------------------------------------------------------------------

def get_version(db: Database, ref: str) -> VersionInfo:
    return db.read(lambda session: _version_info(find_version(session, ref)))


def get_schedule(db: Database, name: str) -> ScheduleInfo:
    return db.read(lambda session: _schedule_info(session, _schedule(session, check_name(name))))


def history(db: Database, name: str) -> list[VersionInfo]:
    """Every version of a schedule, oldest first."""

    def read(session: Session) -> list[VersionInfo]:
        schedule = _schedule(session, check_name(name))
        return [_version_info(v) for v in schedule.versions]

    return db.read(read)


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def list_schedules(db: Database, *, search: str | None = None, tag: str | None = None,
                   author: str | None = None, include_archived: bool = False) -> list[ScheduleInfo]:
    """Schedules by name; `search` matches (case-insensitive) the name, the
    description, or any version's term or message."""
    check_meta(author=author, search=search)
    if tag:
        check_tag(tag)

    def read(session: Session) -> list[ScheduleInfo]:
        query = select(Schedule).order_by(Schedule.name)
        if not include_archived:
            query = query.where(Schedule.archived.is_(False))
        if search:
            pattern = _like_pattern(search)
            in_versions = select(ScheduleVersion.schedule_id).where(
                ScheduleVersion.term.ilike(pattern, escape="\\")
                | ScheduleVersion.message.ilike(pattern, escape="\\"))
            query = query.where(Schedule.name.ilike(pattern, escape="\\")
                                | Schedule.description.ilike(pattern, escape="\\")
                                | Schedule.id.in_(in_versions))
        if tag:
            query = query.where(Schedule.id.in_(
                select(ScheduleTag.schedule_id).where(ScheduleTag.tag == tag)))
        if author:
            query = query.where(Schedule.author == author)
        return [_schedule_info(session, s) for s in session.scalars(query).all()]

    return db.read(read)


def diff_versions(db: Database, ref_a: str, ref_b: str) -> VersionDiff:
    """Terms (a unified diff) and metrics of two versions, of one schedule or two.

    A time (makespan, lower bound) or memory (peak memory) metric has no change (None)
    when the two versions' workloads declare different units for it ("ms" and "s", or
    units and none): b - a of such numbers means nothing."""
    from mpipe_core.workloads.workload import load_workload

    a, b = db.read(lambda session: (_version_info(find_version(session, ref_a)),
                                    _version_info(find_version(session, ref_b))))
    term_diff = tuple(difflib.unified_diff(
        a.term.splitlines(), b.term.splitlines(), fromfile=a.ref, tofile=b.ref, lineterm=""))

    def units(version: VersionInfo) -> tuple[str, str]:  # (time, memory) of the workload it was saved with
        try:
            workload = load_workload(version.workload)
        except MpipeError:
            return "", ""
        return workload.time_unit, workload.memory_unit

    (time_a, memory_a), (time_b, memory_b) = units(a), units(b)
    comparable = {"makespan": time_a == time_b, "lower_bound": time_a == time_b, "peak_memory": memory_a == memory_b}
    metrics = {}
    for key in SUMMARY_METRICS:
        va, vb = a.summary.get(key), b.summary.get(key)
        if va is None and vb is None:
            continue
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
        metrics[key] = (va, vb, vb - va if numeric and comparable.get(key, True) else None)
    # Peak activation memory of the most loaded device (the summary keeps one per device).
    peaks = [_largest(v.summary.get("peak_memory")) for v in (a, b)]
    if peaks != [None, None]:
        metrics["peak_memory"] = (*peaks, peaks[1] - peaks[0]
                                  if None not in peaks and comparable["peak_memory"] else None)
    return VersionDiff(a, b, term_diff, metrics, a.workload != b.workload)


def _largest(values: Any) -> float | None:
    numbers = [v for v in values or () if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(numbers) if numbers else None


# --- saved workloads -----------------------------------------------------------------------

def _workload_info(version: WorkloadVersion) -> WorkloadInfo:
    workload = version.workload
    return WorkloadInfo(workload.name, version.number, dict(version.body), version.message,
                        version.author, version.created_at, workload.description,
                        len(workload.versions))


WORKLOAD_ACTIONS = ("save-workload", "calibrate", "profile")


def save_workload(db: Database, name: str, source: Any, *, message: str = "",
                  author: str | None = None, description: str | None = None,
                  update: bool = False, actor: Actor | None = None, action: str = "save-workload",
                  run_id: int | None = None) -> WorkloadInfo:
    """Save a workload (preset name, file path or dict) under `name`; with
    `update=True`, as the next version of the existing one.

    `action` is what the audit trail records and what the actor must be allowed:
    "save-workload" (a designer's), or "calibrate" (fitted to run `run_id`) and
    "profile" (measured from a model), an operator's."""
    if action not in WORKLOAD_ACTIONS:
        raise ValueError(f"save_workload: action must be one of {WORKLOAD_ACTIONS}, not {action!r}")
    who = authorize(db, action, f"workload {name}", actor=actor, run_id=run_id)
    check_name(name, "workload")
    check_meta(author=author, description=description, message=message)
    author = author_of(who, author)
    body, _label = resolve_workload_source(source)
    if body is None:
        raise InvalidNameError("give a workload to save: a preset name, a file, or a JSON body")

    def write(session: Session) -> WorkloadInfo:
        now = utcnow()
        workload = session.scalars(select(Workload).where(Workload.name == name)).one_or_none()
        if workload is None and update:
            raise NotFoundError(f"no saved workload named '{name}'{_did_you_mean(session, Workload, name)}")
        if workload is not None and not update:
            raise DuplicateNameError(
                f"workload '{name}' already exists; update it to add a version, "
                f"or choose another name"
            )
        if workload is None:
            workload = Workload(name=name, description=description or "", author=author,
                                created_at=now, updated_at=now, archived=False)
            session.add(workload)
            session.flush()
        elif description is not None:
            workload.description = description
        number = _latest_number(session, WorkloadVersion, WorkloadVersion.workload_id, workload.id) + 1
        version = WorkloadVersion(workload=workload, number=number, body=body, message=message,
                                  author=author, created_at=now)
        session.add(version)
        workload.updated_at = now
        session.flush()
        record(session, who, action, f"workload {name}@{number}", run_id=run_id,
               details=_with_author({"new_version": update, "message": message}, author, who))
        return _workload_info(version)

    return db.write(write)


def get_workload(db: Database, ref: str) -> WorkloadInfo:
    return db.read(lambda session: _workload_info(_workload_version(session, ref)))


def list_workloads(db: Database) -> list[WorkloadInfo]:
    def read(session: Session) -> list[WorkloadInfo]:
        infos = []
        for workload in session.scalars(select(Workload).order_by(Workload.name)).all():
            infos.append(_workload_info(workload.versions[-1]))
        return infos

    return db.read(read)
