"""Initial schema: schedule library, saved workloads, runs, run events, op timings.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

RUN_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "lost")
IMMUTABLE_TABLES = ("schedule_versions", "workload_versions")


def _timestamp() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _big_id() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("author", sa.String(100), nullable=False),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_schedules_name")),
    )
    op.create_index(op.f("ix_schedules_author"), "schedules", ["author"])

    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("author", sa.String(100), nullable=False),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workloads")),
        sa.UniqueConstraint("name", name=op.f("uq_workloads_name")),
    )

    op.create_table(
        "schedule_tags",
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(["schedule_id"], ["schedules.id"],
                                name=op.f("fk_schedule_tags_schedule_id_schedules")),
        sa.PrimaryKeyConstraint("schedule_id", "tag", name=op.f("pk_schedule_tags")),
    )
    op.create_index(op.f("ix_schedule_tags_tag"), "schedule_tags", ["tag"])

    op.create_table(
        "workload_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("author", sa.String(100), nullable=False),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"],
                                name=op.f("fk_workload_versions_workload_id_workloads")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workload_versions")),
        sa.UniqueConstraint("workload_id", "number", name=op.f("uq_workload_versions_workload_id_number")),
    )

    op.create_table(
        "schedule_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("term", sa.Text(), nullable=False),
        sa.Column("workload_version_id", sa.Integer(), nullable=True),
        sa.Column("workload", sa.JSON(), nullable=True),
        sa.Column("workload_label", sa.String(200), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("author", sa.String(100), nullable=False),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("makespan", sa.Float(), nullable=True),
        sa.Column("bubble_ratio", sa.Float(), nullable=True),
        sa.Column("efficiency", sa.Float(), nullable=True),
        sa.Column("devices", sa.Integer(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["schedule_versions.id"],
                                name=op.f("fk_schedule_versions_parent_id_schedule_versions")),
        sa.ForeignKeyConstraint(["schedule_id"], ["schedules.id"],
                                name=op.f("fk_schedule_versions_schedule_id_schedules")),
        sa.ForeignKeyConstraint(["workload_version_id"], ["workload_versions.id"],
                                name=op.f("fk_schedule_versions_workload_version_id_workload_versions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_versions")),
        sa.UniqueConstraint("schedule_id", "number", name=op.f("uq_schedule_versions_schedule_id_number")),
    )
    op.create_index(op.f("ix_schedule_versions_parent_id"), "schedule_versions", ["parent_id"])

    op.create_table(
        "runs",
        sa.Column("id", _big_id(), nullable=False),
        sa.Column("schedule_version_id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("nproc", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("launched_by", sa.String(100), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("lease_expires_at", _timestamp(), nullable=True),
        sa.Column("heartbeat_at", _timestamp(), nullable=True),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("started_at", _timestamp(), nullable=True),
        sa.Column("finished_at", _timestamp(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.CheckConstraint("status IN (" + ", ".join(f"'{s}'" for s in RUN_STATUSES) + ")",
                           name=op.f("ck_runs_status")),
        sa.ForeignKeyConstraint(["schedule_version_id"], ["schedule_versions.id"],
                                name=op.f("fk_runs_schedule_version_id_schedule_versions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index(op.f("ix_runs_schedule_version_id"), "runs", ["schedule_version_id"])
    op.create_index("ix_runs_status_id", "runs", ["status", "id"])
    op.create_index("ix_runs_status_lease_expires_at", "runs", ["status", "lease_expires_at"])

    op.create_table(
        "op_timings",
        sa.Column("id", _big_id(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("module", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("microbatch", sa.Integer(), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=False),
        sa.Column("end_s", sa.Float(), nullable=False),
        sa.Column("device", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_op_timings_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_op_timings")),
    )
    op.create_index("ix_op_timings_run_id_step", "op_timings", ["run_id", "step"])

    op.create_table(
        "run_events",
        sa.Column("id", _big_id(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("at", _timestamp(), nullable=False),
        sa.Column("from_status", sa.String(16), nullable=True),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_events_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_events")),
    )
    op.create_index(op.f("ix_run_events_run_id"), "run_events", ["run_id"])

    _create_immutability_triggers()


def _create_immutability_triggers() -> None:
    """Versions are never overwritten: the database itself refuses an UPDATE."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION mpipe_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'rows of % are immutable; save a new version', TG_TABLE_NAME; END $$"
        )
        for table in IMMUTABLE_TABLES:
            op.execute(f"CREATE TRIGGER {table}_immutable BEFORE UPDATE ON {table} "
                       "FOR EACH ROW EXECUTE FUNCTION mpipe_refuse_update()")
    else:
        for table in IMMUTABLE_TABLES:
            op.execute(f"CREATE TRIGGER {table}_immutable BEFORE UPDATE ON {table} BEGIN "
                       f"SELECT RAISE(ABORT, 'rows of {table} are immutable; save a new version'); END")


def downgrade() -> None:
    for table in IMMUTABLE_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_immutable" +
                   (f" ON {table}" if op.get_bind().dialect.name == "postgresql" else ""))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS mpipe_refuse_update()")
    for table in ("run_events", "op_timings", "runs", "schedule_versions", "workload_versions",
                  "schedule_tags", "workloads", "schedules"):
        op.drop_table(table)
