"""A run's measured communication, drawn as the Designer draws the predicted one.

A run of a layout (tp x cp x dp replicas of the term's pipeline) streams every
pipeline's ops and its timed collectives (`timeline_record.COMM_KINDS`).  This
section shows one pipeline at a time, picked by its tp / cp / dp coordinates,
as a Gantt chart of its ops with the collectives over them in the Designer's
colours and places (`figures.COMM_STYLES`): what runs inside an op (tp, cp)
as a strip along the op's lower edge, the asynchronous dp reductions along
the upper edge (they overlap the rest of the backward), the ZeRO gathers and
the optimizer step as bars of their own; and a table of measured time per
kind.  The Runs page calls `section`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.bars import from_timings
from app.figures import COMM_STRIP, COMM_STYLES, gantt_figure
from app.formatting import human
from mpipe_core.errors import MpipeError
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.runs.layout import RunLayout, runnable_workload_layout

# Measured kind -> (the Designer's group, where it is drawn: "inside", "async" or "bar").
KIND_PLACES = {
    "tp_comm": ("tp", "inside"),
    "cp_comm": ("cp", "inside"),
    "dp_comm": ("dp", "async"),
    "dp_gather": ("dp", "bar"),
    "optimizer": ("optimizer", "bar"),
}
PICK_DIMS = ("dp", "cp", "tp")  # the coordinates that pick a pipeline (pp runs along it)


def run_layout(version) -> RunLayout | None:
    """The layout a run of `version` ran (its workload's parallel section), or None."""
    devices = None if version is None else version.metric("devices")
    if devices is None:
        return None
    try:
        return runnable_workload_layout(version.workload, int(devices))
    except MpipeError:
        return None


def pipeline_index(layout: RunLayout, coords: dict[str, int]) -> int:
    """The pipeline at these tp/cp/dp coordinates: the grid's pipelines are in rank order
    of their first stage, whose global rank this is (tp fastest)."""
    return layout.rank_layout().rank_of({"tp": 0, "cp": 0, "dp": 0, **coords, "pp": 0})


def pick_pipeline(layout: RunLayout | None, key: str) -> tuple[int, str]:
    """Selectors for the coordinates wider than 1; (pipeline index, its label)."""
    if layout is None:
        return 0, "the run's pipeline"
    dims = [d for d in PICK_DIMS if getattr(layout, d) > 1]
    if not dims:
        return 0, "the run's pipeline"
    columns = st.columns(len(dims))
    coords = {}
    for column, dim in zip(columns, dims):
        with column:
            coords[dim] = st.selectbox(f"{dim} coordinate", list(range(getattr(layout, dim))),
                                       key=f"{key}.{dim}", help=f"which of the {getattr(layout, dim)} "
                                       f"{dim} replicas' pipeline to show")
    label = ", ".join(f"{d}={coords[d]}" for d in dims)
    return pipeline_index(layout, coords), f"pipeline {label}"


def comm_traces_measured(rows: Sequence[TimelineRecord], origin: float, scale: float = 1000.0) -> list[go.Bar]:
    """One bar trace per Designer group, measured rows (seconds) in the bars' unit."""
    traces = []
    for group, (colour, label) in COMM_STYLES.items():
        mine = [r for r in rows if KIND_PLACES.get(r.kind, ("", ""))[0] == group]
        if not mine:
            continue
        places = [KIND_PLACES[r.kind][1] for r in mine]
        start = (np.array([r.start for r in mine], float) - origin) * scale
        end = (np.array([r.end for r in mine], float) - origin) * scale
        strip = np.array([p != "bar" for p in places], bool)
        side = np.array([-1.0 if p == "async" else 1.0 for p in places])
        offset = np.where(strip, side * (0.4 - COMM_STRIP / 2), 0.0)
        hover = [f"<b>{r.kind}</b> on stage {r.device}"
                 + (f", chunk {r.chunk}" if r.chunk >= 0 else "")
                 + f" (step {r.step})<br>{human((r.end - r.start) * 1e3, 3)} ms measured" for r in mine]
        traces.append(go.Bar(
            orientation="h", base=start, x=end - start, y=np.array([r.device for r in mine]) + offset,
            width=np.where(strip, COMM_STRIP, 0.8), name=f"measured {label}", legendgroup=f"comm {group}",
            marker=dict(color=colour, line=dict(width=0.4, color="white")),
            hovertext=hover, hovertemplate="%{hovertext}<extra></extra>"))
    return traces


def comm_figure(ops: Sequence[TimelineRecord], comm: Sequence[TimelineRecord], title: str) -> go.Figure:
    """The pipeline's ops as a Gantt chart with its measured collectives drawn over them."""
    origin = min((r.start for r in list(ops) + list(comm)), default=0.0)
    devices = 1 + max((r.device for r in list(ops) + list(comm)), default=0)
    bars = from_timings(ops, devices, origin=origin)
    fig, _ = gantt_figure(bars, title=title)
    fig.add_traces(comm_traces_measured(comm, origin))
    return fig


def kind_table(comm: Sequence[TimelineRecord]) -> pd.DataFrame:
    """Measured time per kind and stage, per step (ms)."""
    steps = max(1, len({r.step for r in comm}))
    rows: dict[tuple[str, int], list[float]] = {}
    for r in comm:
        rows.setdefault((r.kind, r.device), []).append(r.end - r.start)
    return pd.DataFrame([{"kind": kind, "stage": device, "count per step": len(v) / steps,
                          "ms per step": sum(v) * 1e3 / steps}
                         for (kind, device), v in sorted(rows.items())])


def section(db, run, version) -> None:
    """The Runs page's communication section for a run with timed collectives."""
    from storage import timings_for

    layout = run_layout(version)
    pipeline, label = pick_pipeline(layout, f"runs.comm.{run.id}")
    rows = timings_for(db, run.id, pipeline=pipeline, rows="all")
    comm = [r for r in rows if r.is_comm]
    ops = [r for r in rows if not r.is_comm]
    if not rows:
        st.info(f"No timings of {label} (only the first pipeline streams in runs before collectives were timed).")
        return
    described = f" of layout {layout.describe()}" if layout is not None else ""
    st.plotly_chart(comm_figure(ops, comm, f"Measured communication, {label}{described}"),
                    key=f"runs.comm.chart.{run.id}")
    if comm:
        st.dataframe(kind_table(comm), hide_index=True)
    else:
        st.caption(f"{label} timed no collectives.")
