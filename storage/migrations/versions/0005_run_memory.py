"""Measured memory of a run: one row per rank and attempt (the peak of what
autograd kept saved for backward, with the op it was reached in, and the
bytes of the parameters, gradients and optimizer state the rank held).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLE = "run_memory"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("activation_peak", sa.BigInteger(), nullable=False),
        sa.Column("activation_peak_op", sa.String(64), nullable=False),
        sa.Column("parameters", sa.BigInteger(), nullable=False),
        sa.Column("gradients", sa.BigInteger(), nullable=False),
        sa.Column("optimizer", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_memory_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_memory")),
        sa.UniqueConstraint("run_id", "attempt", "rank", name=op.f("uq_run_memory_run_id_attempt_rank")),
    )


def downgrade() -> None:
    op.drop_table(TABLE)
