"""Export and import of the library as one JSON document.

The document holds schedules (every version, tags, lineage) and the saved
workloads they use.  Export then import into an empty library then export
again gives the same document, byte for byte (`dump_library`).  Import is one
transaction: a file that is malformed, holds an invalid term, or whose names
the library already has is refused whole (with `rename=True`, conflicting
names get a free `-2`, `-3`, ... suffix instead).  Nothing is ever overwritten.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mpipe_core.algebra.terms.parser import MAX_TERM_TEXT
from mpipe_core.errors import MpipeError
from mpipe_core.workloads.inputs import LIBRARY_FILE_LIMIT, check_text, load_document, read_bounded
from storage.access import Actor, authorize
from storage.audit import record
from storage.db import Database
from storage.errors import ConflictError, ImportFileError, NotFoundError
from storage.library import (
    MAX_VERSION,
    NAME_RE,
    TAG_RE,
    TEXT_LENGTH,
    evaluate_term,
    int_or_none,
    number_or_none,
)
from storage.models import (
    NAME_LENGTH,
    WORKLOAD_LABEL_LENGTH,
    Schedule,
    ScheduleTag,
    ScheduleVersion,
    Workload,
    WorkloadVersion,
)

FORMAT = "mpipe-library"
FORMAT_VERSION = 1


# --- export --------------------------------------------------------------------------------

def _time(value: datetime) -> str:
    return value.isoformat()


def _ref(version: ScheduleVersion | None) -> dict[str, Any] | None:
    if version is None:
        return None
    return {"schedule": version.schedule.name, "version": version.number}


def _export_workload(workload: Workload) -> dict[str, Any]:
    return {
        "name": workload.name, "description": workload.description, "author": workload.author,
        "created_at": _time(workload.created_at), "updated_at": _time(workload.updated_at),
        "archived": workload.archived,
        "versions": [
            {"number": v.number, "body": v.body, "message": v.message, "author": v.author,
             "created_at": _time(v.created_at)}
            for v in workload.versions
        ],
    }


def _export_schedule(schedule: Schedule) -> dict[str, Any]:
    versions = []
    for v in schedule.versions:
        saved = v.workload_version
        versions.append({
            "number": v.number,
            "parent": _ref(v.parent),
            "term": v.term,
            "workload": v.workload,
            "workload_ref": {"name": saved.workload.name, "version": saved.number} if saved else None,
            "workload_label": v.workload_label,
            "message": v.message,
            "author": v.author,
            "created_at": _time(v.created_at),
            "summary": v.summary,
        })
    return {
        "name": schedule.name, "description": schedule.description, "author": schedule.author,
        "created_at": _time(schedule.created_at), "updated_at": _time(schedule.updated_at),
        "archived": schedule.archived, "tags": sorted(t.tag for t in schedule.tags),
        "versions": versions,
    }


def export_library(db: Database, names: list[str] | None = None) -> dict[str, Any]:
    """The whole library (archived schedules included), or the named schedules
    plus the saved workloads they use."""

    def read(session: Session) -> dict[str, Any]:
        if names:
            schedules = []
            for name in names:
                schedule = session.scalars(select(Schedule).where(Schedule.name == name)).one_or_none()
                if schedule is None:
                    raise NotFoundError(f"no schedule named '{name}'")
                schedules.append(schedule)
            used = {v.workload_version.workload.name for s in schedules for v in s.versions
                    if v.workload_version is not None}
            workloads = session.scalars(
                select(Workload).where(Workload.name.in_(sorted(used))).order_by(Workload.name)).all()
        else:
            schedules = session.scalars(select(Schedule).order_by(Schedule.name)).all()
            workloads = session.scalars(select(Workload).order_by(Workload.name)).all()
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "workloads": [_export_workload(w) for w in workloads],
            "schedules": [_export_schedule(s) for s in sorted(schedules, key=lambda s: s.name)],
        }

    return db.read(read)


def dump_library(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def read_library_file(path: str | Path) -> dict[str, Any]:
    """The parsed export file; ImportFileError if it is unreadable, too big,
    not UTF-8 JSON, or nested deeper than any export is."""
    try:
        return load_document(read_bounded(path, LIBRARY_FILE_LIMIT, "the library file"), str(path), kind="JSON")
    except ImportFileError:
        raise
    except MpipeError as error:
        raise ImportFileError(error.message) from None


# --- validation ----------------------------------------------------------------------------

def _bad(where: str, message: str) -> ImportFileError:
    return ImportFileError(f"malformed library file: {where}: {message}")


def _field(obj: dict, key: str, kind, where: str, *, optional: bool = False):
    if key not in obj:
        if optional:
            return None
        raise _bad(where, f"missing '{key}'")
    value = obj[key]
    if value is None and optional:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise _bad(where, f"'{key}' must be {kinds[0].__name__}")
    if not isinstance(value, kinds):
        raise _bad(where, f"'{key}' must be {kinds[0].__name__}, not {type(value).__name__}")
    return value


def _text(obj: dict, key: str, where: str, limit: int = TEXT_LENGTH) -> str:
    value = _field(obj, key, str, where)
    try:
        return check_text(value, f"'{key}'", limit)
    except MpipeError as error:
        raise _bad(where, error.message) from None


def _timestamp(obj: dict, key: str, where: str) -> datetime:
    text = _field(obj, key, str, where)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise _bad(where, f"'{key}' is not an ISO timestamp: {text!r}") from None
    if value.tzinfo is None:
        raise _bad(where, f"'{key}' has no time zone: {text!r}")
    return value


def _name(obj: dict, where: str, what: str = "name") -> str:
    name = _field(obj, what, str, where)
    if not NAME_RE.match(name) or len(name) > NAME_LENGTH:
        raise _bad(where, f"invalid name {name!r}")
    return name


def _list(obj: dict, key: str, where: str) -> list:
    return _field(obj, key, list, where)


def _validate(doc: Any) -> None:
    if not isinstance(doc, dict):
        raise _bad("top level", "expected a JSON object")
    if doc.get("format") != FORMAT:
        raise _bad("top level", f"'format' must be {FORMAT!r} (is this an mpipe library export?)")
    if doc.get("format_version") != FORMAT_VERSION:
        raise _bad("top level", f"unsupported format_version {doc.get('format_version')!r} "
                                f"(this mpipe reads {FORMAT_VERSION})")
    seen: set[str] = set()
    for i, w in enumerate(_list(doc, "workloads", "top level")):
        where = f"workloads[{i}]"
        if not isinstance(w, dict):
            raise _bad(where, "expected an object")
        name = _name(w, where)
        if name in seen:
            raise _bad(where, f"workload '{name}' appears twice")
        seen.add(name)
        _common(w, where)
        numbers = set()
        for j, v in enumerate(_list(w, "versions", where)):
            vw = f"{where}.versions[{j}]"
            if not isinstance(v, dict):
                raise _bad(vw, "expected an object")
            numbers.add(_version_number(v, vw, numbers))
            _field(v, "body", dict, vw)
            _text(v, "message", vw)
            _text(v, "author", vw, NAME_LENGTH)
            _timestamp(v, "created_at", vw)
        if not numbers:
            raise _bad(where, "has no versions")
    seen = set()
    for i, s in enumerate(_list(doc, "schedules", "top level")):
        where = f"schedules[{i}]"
        if not isinstance(s, dict):
            raise _bad(where, "expected an object")
        name = _name(s, where)
        if name in seen:
            raise _bad(where, f"schedule '{name}' appears twice")
        seen.add(name)
        _common(s, where)
        for tag in _list(s, "tags", where):
            if not isinstance(tag, str) or not TAG_RE.match(tag):
                raise _bad(where, f"invalid tag {tag!r}")
        numbers = set()
        for j, v in enumerate(_list(s, "versions", where)):
            vw = f"{where}.versions[{j}]"
            if not isinstance(v, dict):
                raise _bad(vw, "expected an object")
            numbers.add(_version_number(v, vw, numbers))
            _text(v, "term", vw, MAX_TERM_TEXT)
            _field(v, "workload", dict, vw, optional=True)
            for key in ("parent", "workload_ref"):
                ref = _field(v, key, dict, vw, optional=True)
                if ref is not None:
                    _name(ref, f"{vw}.{key}", "schedule" if key == "parent" else "name")
                    _version_number(ref, f"{vw}.{key}", set(), key="version")
            _text(v, "workload_label", vw, WORKLOAD_LABEL_LENGTH)
            _text(v, "message", vw)
            _text(v, "author", vw, NAME_LENGTH)
            _timestamp(v, "created_at", vw)
            _field(v, "summary", dict, vw)
        if not numbers:
            raise _bad(where, "has no versions")


def _common(obj: dict, where: str) -> None:
    _text(obj, "description", where)
    _text(obj, "author", where, NAME_LENGTH)
    _field(obj, "archived", bool, where)
    _timestamp(obj, "created_at", where)
    _timestamp(obj, "updated_at", where)


def _version_number(obj: dict, where: str, seen: set[int], key: str = "number") -> int:
    number = _field(obj, key, int, where)
    if not 1 <= number <= MAX_VERSION:
        raise _bad(where, f"'{key}' must be from 1 to {MAX_VERSION}")
    if number in seen:
        raise _bad(where, f"version {number} appears twice")
    return number


# --- import --------------------------------------------------------------------------------

@dataclass
class ImportResult:
    schedules: dict[str, str] = field(default_factory=dict)  # name in file -> name in library
    workloads: dict[str, str] = field(default_factory=dict)  # reused ones map to themselves
    reused_workloads: list[str] = field(default_factory=list)
    unlinked: list[str] = field(default_factory=list)  # "name@n" whose fork origin is in neither
    recomputed: list[str] = field(default_factory=list)  # "name@n: ..." whose file claimed other metrics

    @property
    def renamed(self) -> dict[str, str]:
        both = {**self.workloads, **self.schedules}
        return {old: new for old, new in both.items() if old != new}


def _free_name(name: str, taken: set[str]) -> str:
    k = 2
    while True:
        suffix = f"-{k}"
        candidate = name[: NAME_LENGTH - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        k += 1


def _evaluate_versions(doc: dict[str, Any], max_ops: int | None) -> dict[tuple[str, int], tuple[str, dict]]:
    """Every workload must still load and every term evaluate on its workload (the
    core's message if not): (schedule, version) -> (canonical term, summary)
    recomputed, so a file cannot claim metrics its terms do not have."""
    from mpipe_core.workloads.workload import load_workload

    bodies = {}
    for w in doc["workloads"]:
        for v in w["versions"]:
            try:
                load_workload(v["body"])
            except MpipeError as error:
                raise ImportFileError(f"workload '{w['name']}' version {v['number']}: {error.message}") from None
            bodies[(w["name"], v["number"])] = v["body"]
    results = {}
    for s in doc["schedules"]:
        for v in s["versions"]:
            ref = v.get("workload_ref")
            if ref is not None and (ref["name"], ref["version"]) not in bodies:
                raise _bad(f"schedule '{s['name']}' version {v['number']}",
                           f"workload {ref['name']}@{ref['version']} is not in the file")
            body = bodies[(ref["name"], ref["version"])] if ref else v.get("workload")
            try:
                results[(s["name"], v["number"])] = evaluate_term(v["term"], body, max_ops=max_ops)
            except MpipeError as error:
                raise ImportFileError(
                    f"schedule '{s['name']}' version {v['number']}: {error.message}") from None
    return results


def _shown(value: Any) -> str:
    return format(value, ".6g") if isinstance(value, float) else repr(value)[:40]


def _differs(claimed: Any, recomputed: Any) -> bool:
    if isinstance(recomputed, (int, float)) and isinstance(claimed, (int, float)):
        return not math.isclose(claimed, recomputed, rel_tol=1e-9, abs_tol=1e-12)
    return claimed != recomputed


def import_library(db: Database, doc: Any, *, rename: bool = False, max_ops: int | None = None,
                   actor: Actor | None = None, source: str = "a library file") -> ImportResult:
    """Add the schedules and workloads of an exported document to the library.
    Metrics are recomputed from the terms; `result.recomputed` lists the versions
    whose file claimed other values.  `max_ops` bounds each term's evaluation.
    The audit trail gets a row per schedule imported (or one for `source` when
    it holds only workloads); imported versions keep the authors the file names."""
    who = authorize(db, "import", source, actor=actor)
    _validate(doc)
    # Terms are evaluated first, outside the write transaction (it may take a while).
    evaluated = _evaluate_versions(doc, max_ops)

    def write(session: Session) -> ImportResult:
        result = ImportResult()
        existing_workloads = {w.name: w for w in session.scalars(select(Workload)).all()}
        taken_workloads = set(existing_workloads) | {w["name"] for w in doc["workloads"]}
        conflicts = []
        workload_versions: dict[tuple[str, int], WorkloadVersion] = {}
        for w in doc["workloads"]:
            name = w["name"]
            have = existing_workloads.get(name)
            if have is not None:
                bodies = {v.number: v.body for v in have.versions}
                if all(bodies.get(v["number"]) == v["body"] for v in w["versions"]):
                    result.workloads[name] = name
                    result.reused_workloads.append(name)
                    for v in have.versions:
                        workload_versions[(name, v.number)] = v
                    continue
                if not rename:
                    conflicts.append(f"workload '{name}'")
                    continue
                new = _free_name(name, taken_workloads)
                taken_workloads.add(new)
            else:
                new = name
            result.workloads[name] = new
            workload = Workload(name=new, description=w["description"], author=w["author"],
                                created_at=_timestamp(w, "created_at", ""),
                                updated_at=_timestamp(w, "updated_at", ""), archived=w["archived"])
            session.add(workload)
            for v in sorted(w["versions"], key=lambda v: v["number"]):
                version = WorkloadVersion(workload=workload, number=v["number"], body=v["body"],
                                          message=v["message"], author=v["author"],
                                          created_at=_timestamp(v, "created_at", ""))
                session.add(version)
                workload_versions[(name, v["number"])] = version

        existing = set(session.scalars(select(Schedule.name)).all())
        taken = existing | {s["name"] for s in doc["schedules"]}
        for s in doc["schedules"]:
            name = s["name"]
            if name in existing:
                if not rename:
                    conflicts.append(f"schedule '{name}'")
                    continue
                new = _free_name(name, taken)
                taken.add(new)
                result.schedules[name] = new
            else:
                result.schedules[name] = name
        if conflicts:
            raise ConflictError(
                f"import refused, the library already has: {', '.join(conflicts)}; nothing was "
                f"imported (import with rename to take them under new names)"
            )
        session.flush()

        schedules: dict[str, Schedule] = {}
        entries: dict[tuple[str, int], dict] = {}
        for s in doc["schedules"]:
            schedule = Schedule(
                name=result.schedules[s["name"]], description=s["description"], author=s["author"],
                created_at=_timestamp(s, "created_at", ""), updated_at=_timestamp(s, "updated_at", ""),
                archived=s["archived"],
            )
            schedule.tags = [ScheduleTag(tag=t) for t in sorted(set(s["tags"]))]
            session.add(schedule)
            schedules[s["name"]] = schedule
            for v in s["versions"]:
                entries[(s["name"], v["number"])] = v
        session.flush()

        # Versions are immutable (no UPDATE), so each parent is inserted before its children.
        inserted: dict[tuple[str, int], ScheduleVersion] = {}
        visiting: set[tuple[str, int]] = set()

        def insert(key: tuple[str, int]) -> ScheduleVersion:
            if key in inserted:
                return inserted[key]
            if key in visiting:
                raise _bad(f"schedule '{key[0]}' version {key[1]}", "its lineage is a cycle")
            visiting.add(key)
            v = entries[key]
            parent = None
            ref = v.get("parent")
            if ref is not None:
                parent_key = (ref["schedule"], ref["version"])
                if parent_key in entries:
                    parent = insert(parent_key)
                elif ref["schedule"] in schedules:
                    raise _bad(f"schedule '{key[0]}' version {key[1]}",
                               f"parent {ref['schedule']}@{ref['version']} is not in the file")
                else:
                    parent = session.scalars(
                        select(ScheduleVersion).join(ScheduleVersion.schedule)
                        .where(Schedule.name == ref["schedule"], ScheduleVersion.number == ref["version"])
                    ).one_or_none()
                    if parent is None:
                        result.unlinked.append(f"{result.schedules[key[0]]}@{key[1]}")
            saved = None
            wref = v.get("workload_ref")
            if wref is not None:
                saved = workload_versions.get((wref["name"], wref["version"]))
                if saved is None:
                    raise _bad(f"schedule '{key[0]}' version {key[1]}",
                               f"workload {wref['name']}@{wref['version']} is not in the file")
            term, summary = evaluated[key]
            claimed = v["summary"]
            changed = sorted(k for k in summary if k in claimed and _differs(claimed[k], summary[k]))
            if changed:
                result.recomputed.append(
                    f"{result.schedules[key[0]]}@{key[1]}: " + ", ".join(
                        f"{k} {_shown(claimed[k])} in the file, {_shown(summary[k])} recomputed" for k in changed))
            version = ScheduleVersion(
                schedule=schedules[key[0]], number=key[1], parent=parent, term=term,
                workload_version=saved, workload=v.get("workload"), workload_label=v["workload_label"],
                message=v["message"], author=v["author"], created_at=_timestamp(v, "created_at", ""),
                makespan=number_or_none(summary.get("makespan")),
                bubble_ratio=number_or_none(summary.get("bubble_ratio")),
                efficiency=number_or_none(summary.get("efficiency")),
                devices=int_or_none(summary.get("devices")), summary=summary,
            )
            session.add(version)
            session.flush()
            visiting.discard(key)
            inserted[key] = version
            return version

        for key in sorted(entries):
            insert(key)
        session.flush()
        new_workloads = sorted(new for old, new in result.workloads.items() if old not in result.reused_workloads)
        for old, new in result.schedules.items():
            record(session, who, "import", new, schedule=new,
                   details={"file": source, "versions": len(schedules[old].versions),
                            **({"renamed_from": old} if old != new else {}), "workloads": new_workloads})
        if not result.schedules:
            record(session, who, "import", source, details={"workloads": new_workloads})
        return result

    return db.write(write)

