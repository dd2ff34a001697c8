"""Imported runs: a run record can come from another stack's traces instead of
the queue (`mpipe import-trace`); it says where it came from and which files.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every run before this one came through the queue.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("source", sa.String(length=16), nullable=False, server_default="queued"))
        batch.add_column(sa.Column("source_digest", sa.String(length=64), nullable=True))
    op.create_index("ix_runs_source_digest", "runs", ["source_digest"])


def downgrade() -> None:
    op.drop_index("ix_runs_source_digest", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("source_digest")
        batch.drop_column("source")
