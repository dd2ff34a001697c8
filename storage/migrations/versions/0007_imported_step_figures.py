"""Imported runs from Ascend clusters: each rank's step summary per step
(step_trace_time.csv, msprof-analyze's cluster_step_trace_time.csv) and the
communication events of its HCCL lane.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
FIGURES = ("computing", "comm_not_overlapped", "overlapped", "communication", "free", "stage", "bubble",
           "comm_exclude_receive", "preparing")


def upgrade() -> None:
    op.create_table(
        "run_step_figures",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in FIGURES),
        sa.Column("dp_index", sa.Integer(), nullable=True),
        sa.Column("pp_index", sa.Integer(), nullable=True),
        sa.Column("tp_index", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_step_figures_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_step_figures")),
        sa.UniqueConstraint("run_id", "rank", "step", name=op.f("uq_run_step_figures_run_id_rank_step")),
    )
    op.create_table(
        "run_comm",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=False),
        sa.Column("end_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_comm_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_comm")),
    )
    op.create_index("ix_run_comm_run_id_step", "run_comm", ["run_id", "step"])


def downgrade() -> None:
    op.drop_index("ix_run_comm_run_id_step", table_name="run_comm")
    op.drop_table("run_comm")
    op.drop_table("run_step_figures")
