"""Timings of every pipeline of a layout, and of collectives: op_timings gains
`pipeline` (which of the layout's pipelines; rows before it are the first's)
and its `kind` widens to 16 characters (`dp_gather`, `optimizer`, ...).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("op_timings") as batch:
        batch.add_column(sa.Column("pipeline", sa.Integer(), nullable=False, server_default="0"))
        batch.alter_column("kind", existing_type=sa.String(8), type_=sa.String(16), existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("op_timings") as batch:
        batch.alter_column("kind", existing_type=sa.String(16), type_=sa.String(8), existing_nullable=False)
        batch.drop_column("pipeline")
