"""The audit trail: one row per write a person made or was refused, which the
database keeps as written (triggers refuse UPDATE and DELETE of its rows).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLE = "audit_events"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("via", sa.String(16), nullable=False),
        sa.Column("db_user", sa.String(100), nullable=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(300), nullable=False),
        sa.Column("schedule", sa.String(100), nullable=True),
        sa.Column("run_id", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.String(8), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.CheckConstraint("outcome IN ('ok', 'refused')", name=op.f("ck_audit_events_outcome")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    for column in ("at", "actor", "schedule", "run_id"):
        op.create_index(op.f(f"ix_audit_events_{column}"), TABLE, [column])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION mpipe_refuse_audit_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'the audit trail is append-only (% refused)', TG_OP; END $$"
        )
        op.execute(f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
                   "FOR EACH ROW EXECUTE FUNCTION mpipe_refuse_audit_change()")
    else:
        for what in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER {TABLE}_no_{what.lower()} BEFORE {what} ON {TABLE} BEGIN "
                       f"SELECT RAISE(ABORT, 'the audit trail is append-only ({what} refused)'); END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}")
        op.execute("DROP FUNCTION IF EXISTS mpipe_refuse_audit_change()")
    else:
        for what in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_{what}")
    for column in ("at", "actor", "schedule", "run_id"):
        op.drop_index(op.f(f"ix_audit_events_{column}"), table_name=TABLE)
    op.drop_table(TABLE)
