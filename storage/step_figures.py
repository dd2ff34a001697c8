"""An imported run's step summary (per rank and step: computing, communication,
free, bubble; `mpipe_core.formats.step_summary`) and its communication rows
(an Ascend trace's HCCL lane), written with the run and read back.

    rows = step_figures_for(db, run_id)     # [StepRow], seconds
    comm = comm_for(db, run_id)             # [CommRecord], seconds on the run's clock
"""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from mpipe_core.formats.step_summary import StepRow
from mpipe_core.formats.trace_import import CommRecord
from storage.db import Database
from storage.models import RunComm, RunStepFigure

BATCH = 5000
_FIGURES = ("computing", "comm_not_overlapped", "overlapped", "communication", "free", "stage", "bubble",
            "comm_exclude_receive", "preparing")


def write_step_figures(session: Session, run_id: int, rows: Sequence[StepRow]) -> None:
    values = [{"run_id": run_id, "rank": r.rank, "step": r.step, **{f: getattr(r, f) for f in _FIGURES},
               "dp_index": r.dp, "pp_index": r.pp, "tp_index": r.tp} for r in rows]
    for i in range(0, len(values), BATCH):
        session.execute(insert(RunStepFigure), values[i:i + BATCH])


def write_comm(session: Session, run_id: int, comm: Sequence[CommRecord]) -> None:
    values = [{"run_id": run_id, "rank": c.device, "step": c.step, "kind": c.kind[:32], "name": c.name[:128],
               "start": c.start, "end": c.end} for c in comm]
    for i in range(0, len(values), BATCH):
        session.execute(insert(RunComm), values[i:i + BATCH])


def has_step_figures(db: Database, run_id: int) -> bool:
    with db.session() as session:
        return session.execute(select(RunStepFigure.id).where(RunStepFigure.run_id == run_id).limit(1)).first() \
            is not None


def step_figures_for(db: Database, run_id: int) -> list[StepRow]:
    """The run's step summary rows, by step then rank (empty: it has none)."""
    with db.session() as session:
        found = session.scalars(select(RunStepFigure).where(RunStepFigure.run_id == run_id)
                                .order_by(RunStepFigure.step, RunStepFigure.rank)).all()
        return [StepRow(r.rank, r.step, *(getattr(r, f) for f in _FIGURES), dp=r.dp_index, pp=r.pp_index,
                        tp=r.tp_index) for r in found]


def comm_for(db: Database, run_id: int) -> list[CommRecord]:
    """The run's communication rows, by step, rank and start (empty: it has none)."""
    with db.session() as session:
        found = session.scalars(select(RunComm).where(RunComm.run_id == run_id)
                                .order_by(RunComm.step, RunComm.rank, RunComm.start)).all()
        return [CommRecord(c.rank, c.kind, c.name, c.step, c.start, c.end) for c in found]
