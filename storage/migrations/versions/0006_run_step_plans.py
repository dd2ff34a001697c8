"""A data run's plans: per step the plan it ran (how, digest, microbatch order)
and its predicted and static makespans, so the Runs page can set each step's
measured makespan beside its prediction.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("step_plans", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("step_plans")
