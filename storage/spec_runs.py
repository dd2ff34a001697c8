"""Queue a run spec (`mpipe plan --emit mpipe`'s file, the Plan page's row): the
queue runs saved schedule versions, so the spec is saved first as a version of
a schedule whose workload carries the spec's layout in its `parallel` section,
then queued like any version.  What of that layout runs is the queue's one rule
(`layout.runnable_workload_layout`, applied by `enqueue`)."""
from __future__ import annotations

from typing import Any, Mapping

from mpipe_core.runs.run_spec import RunSpec, spec_workload
from storage.access import Actor, authorize
from storage.db import Database
from storage.errors import NotFoundError
from storage.library import check_name, get_schedule, save_schedule
from storage.models import NAME_LENGTH
from storage.runs import RunInfo, enqueue


def enqueue_spec(db: Database, spec: RunSpec, name: str, *, backend: str = "gloo", steps: int = 1,
                 options: Mapping[str, Any] | None = None, message: str = "", max_attempts: int = 1,
                 actor: Actor | None = None, registry=None) -> RunInfo:
    """Save `spec` as schedule `name` (its first version, or the next one; the latest
    one again if it already has this term and workload) and queue a run of it on the
    ranks its layout needs.  The actor must be allowed to launch: refused (and audited)
    before anything is saved."""
    who = authorize(db, "launch", f"{str(name)[:NAME_LENGTH]} (run spec)", actor=actor,
                    schedule=str(name)[:NAME_LENGTH])
    check_name(name)
    document = spec_workload(spec)
    try:
        exists = get_schedule(db, name) is not None
    except NotFoundError:
        exists = False
    version = save_schedule(db, name, spec.term, workload=document, update=exists, reuse_same=True,
                            message=message or spec.source or "a run spec", actor=who)
    return enqueue(db, version.ref, backend=backend, steps=steps, options=options, max_attempts=max_attempts,
                   actor=who, registry=registry)
