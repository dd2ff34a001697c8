"""Op timings per attempt: a requeued run's dead attempt keeps its rows apart
from the attempt that finishes it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows written before attempts were recorded belong to the first attempt.
    with op.batch_alter_table("op_timings") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
    op.create_index("ix_op_timings_run_id_attempt_step", "op_timings", ["run_id", "attempt", "step"])


def downgrade() -> None:
    op.drop_index("ix_op_timings_run_id_attempt_step", table_name="op_timings")
    with op.batch_alter_table("op_timings") as batch:
        batch.drop_column("attempt")
