"""Storage: the team's schedule library and the records of runs.

    from storage import open_database, save_schedule, enqueue, claim_next_run
    db = open_database()            # $MPIPE_DB_URL, or the per-user SQLite file
    save_schedule(db, "zb-p4", "zb_h1(p=4, m=8)", tags=["zero-bubble"])
    run = enqueue(db, "zb-p4", backend="gloo")

SQLAlchemy 2 models (`storage.models`), Alembic migrations shipped in
`storage/migrations` (applied on open), the library (`storage.library`),
export/import (`storage.transfer`), the job queue (`storage.runs`), who may
write what (`storage.access`) and the audit trail of every write (`storage.audit`).
Depends on `mpipe_core` for term evaluation; `mpipe_core` never imports this.
"""
from storage.access import ROLES, Actor, authorize, local_actor
from storage.audit import AuditEntry, list_audit
from storage.db import Database, default_db_path, open_database, resolve_db_url, upgrade_schema
from storage.errors import (
    ConflictError,
    DatabaseLockedError,
    DuplicateNameError,
    ImportFileError,
    InvalidNameError,
    InvalidValueError,
    LeaseLostError,
    NotFoundError,
    PermissionDeniedError,
    SchemaError,
    StorageError,
)
from storage.library import (
    ScheduleInfo,
    VersionDiff,
    VersionInfo,
    WorkloadInfo,
    archive_schedule,
    describe_schedule,
    eval_command,
    saved_workload_name,
    saved_workload_ref,
    diff_versions,
    fork_schedule,
    get_schedule,
    get_version,
    get_workload,
    history,
    list_schedules,
    list_workloads,
    save_schedule,
    save_workload,
    shown_workload_label,
    tag_schedule,
)
from storage.runs import (
    ClaimedRun,
    RunEventInfo,
    RunInfo,
    add_timings,
    cancel_run,
    claim_next_run,
    enqueue,
    expire_leases,
    finish_run,
    get_run,
    heartbeat,
    list_runs,
    memory_for,
    release_run,
    run_events,
    timing_attempts,
    timing_count,
    timings_for,
)
from storage.spec_runs import enqueue_spec
from storage.transfer import dump_library, export_library, import_library, read_library_file

__all__ = [name for name in dir() if not name.startswith("_")]
