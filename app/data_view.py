"""The "data" view of a term on a workload with a `data` section (docs/data.md):
the first N drawn batches, what each costs, the static plan's step time
against `per_batch`'s on each, and the Gantt chart of any batch with the plan
that batch got.  The Designer and Compare pages call `section`; the figures
are plain functions of the core's `evaluate_stream` result.

The stream is `per_batch(t)` over the batches (`t` as typed, or the term
inside a typed per_batch): each batch gets the static plan's makespan and
the planned one, and keeps its plan (`keep_plans`) so a picked batch draws
what it ran.  Runs are cached per server process like evaluations.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.units import quantity

from .evaluation import SharedCache, WorkloadChoice
from .formatting import axis_unit, plain

DEFAULT_BATCHES, MAX_BATCHES = 16, 128
CACHE = SharedCache(8)


def has_data(workload: WorkloadChoice | None) -> bool:
    """Whether the workload carries a data section (the view is offered only then)."""
    if workload is None:
        return False
    body = workload.body()
    return isinstance(body, dict) and "data" in body


@dataclass(frozen=True)
class DataRun:
    term: str  # the static term t (per_batch(t) is what plans each batch)
    stream: Any  # mpipe_core.search.stream.StreamResult, with each batch's plans
    costs: list[float]  # each batch's work: its packs' encoder + LLM time, all layers and kinds
    time_unit: str

    @property
    def static(self) -> list[float]:
        return [b.static_makespan for b in self.stream.batches]

    @property
    def planned(self) -> list[float]:
        return [b.makespan for b in self.stream.batches]


def static_term(term: str) -> str:
    """The term per_batch plans from: `t` of a typed per_batch(t), else the term itself."""
    from mpipe_core.algebra.terms import parse

    ast = parse(term)
    return str(ast.kw("term")) if ast.name == "per_batch" else str(ast)


def data_run(term: str, workload: WorkloadChoice, batches: int) -> DataRun:
    """`per_batch(t)` over the first `batches` batches (cached); MpipeError as the core words it."""
    from mpipe_core.search.stream import evaluate_stream
    from mpipe_core.workloads.batch_costs import drawn_batches, pack_weight
    from mpipe_core.workloads.workload import parse_workload

    from .evaluation import app_max_ops, check_size

    inner = static_term(term)
    key = (inner, workload.digest, int(batches))
    hit = CACHE.get(key)
    if hit is not None:
        return hit
    check_size(inner, workload)  # the app's op limit, before anything is built
    wl = parse_workload(workload.body())
    stream = evaluate_stream(f"per_batch({inner})", wl, int(batches), max_ops=app_max_ops(), keep_plans=True)
    microbatches = stream.batches[0].plans[0].schedule.pipelines[0].microbatches
    weight = pack_weight(wl)
    costs = [float(sum(weight(p) for p in b.packs)) for b in drawn_batches(wl, microbatches, int(batches))]
    run = DataRun(inner, stream, costs, wl.time_unit)
    CACHE.put(key, run)
    return run


# --- figures -----------------------------------------------------------------------------------

def costs_figure(run: DataRun) -> go.Figure:
    """The distribution of the batches' costs (work, all microbatches and kinds)."""
    unit = axis_unit(run.time_unit)
    fig = go.Figure(go.Histogram(x=run.costs, name="batches", marker_color="#4c78a8",
                                 hovertemplate=f"%{{x}} {unit}: %{{y}} batches<extra></extra>"))
    fig.update_layout(height=320, title=f"Cost of each of {len(run.costs)} batches", bargap=0.05,
                      margin=dict(t=50, l=50, r=20, b=40), plot_bgcolor="white")
    fig.update_xaxes(title_text=f"work in the batch ({unit}): encoder + LLM, every microbatch", gridcolor="#eeeeee")
    fig.update_yaxes(title_text="batches", gridcolor="#eeeeee")
    return fig


def steps_figure(run: DataRun, picked: int | None = None) -> go.Figure:
    """Static against per-batch step time, batch by batch (the picked batch ringed)."""
    unit = axis_unit(run.time_unit)
    x = list(range(len(run.static)))
    fig = go.Figure([
        go.Scatter(x=x, y=run.static, mode="lines+markers", name=f"static {plain_term(run.term)}",
                   line=dict(color="#d94801"), hovertemplate=f"batch %{{x}}: %{{y:.4~r}} {unit}<extra>static</extra>"),
        go.Scatter(x=x, y=run.planned, mode="lines+markers", name="per_batch (its own plan)",
                   line=dict(color="#08519c"),
                   hovertemplate=f"batch %{{x}}: %{{y:.4~r}} {unit}<extra>per_batch</extra>"),
    ])
    if picked is not None and 0 <= picked < len(x):
        fig.add_trace(go.Scatter(x=[picked], y=[run.planned[picked]], mode="markers", name=f"batch {picked}",
                                 marker=dict(size=16, symbol="circle-open", color="black", line=dict(width=2)),
                                 hoverinfo="skip"))
    fig.update_layout(height=320, title="Step time per batch: the static plan against per_batch",
                      margin=dict(t=50, l=50, r=20, b=40), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(title_text="batch", gridcolor="#eeeeee")
    fig.update_yaxes(title_text=f"makespan ({unit})", gridcolor="#eeeeee")
    return fig


def plain_term(term: str, most: int = 60) -> str:
    return term if len(term) <= most else term[:most - 1] + "…"


def slowest_replica(run: DataRun, index: int) -> int:
    spans = run.stream.batches[index].replicas
    return max(range(len(spans)), key=spans.__getitem__)


def batch_timeline(run: DataRun, index: int):
    """(replica, Plan, Timeline) of the replica that sets batch `index`'s step."""
    from mpipe_core.simulation.simulator import simulate

    r = slowest_replica(run, index)
    plan = run.stream.batches[index].plans[r]
    return r, plan, simulate(plan.schedule, plan.workload)


def plan_caption(run: DataRun, index: int) -> str:
    b = run.stream.batches[index]
    r, plan = slowest_replica(run, index), b.plans[slowest_replica(run, index)]
    unit = run.time_unit
    where = f" (replica {r} of {len(b.replicas)}, the slowest)" if len(b.replicas) > 1 else ""
    gain = b.static_makespan / b.makespan if b.makespan else 1.0
    order = f"microbatch order {list(plan.order)}"
    if plan.packs is not None:  # the step's samples re-composed: say what each slot holds
        order += f" of the re-composed microbatches (tiles {[plan.packs[i].tiles for i in plan.order]})"
    return (f"Batch {index}{where}: {b.tokens:,} tokens, {b.tiles:,} tiles in {len(plan.order)} microbatches; plan: "
            f"{plan.how}, {order}; {quantity(plan.makespan, unit)} against the static plan's "
            f"{quantity(plan.static_makespan, unit)} ({gain:.3f}x), planned in {plan.plan_ms:.1f} ms"
            + (" (the budget cut the search short)" if plan.fallback else ""))


# --- the section the pages draw ------------------------------------------------------------------

def section(term: str, workload: WorkloadChoice, key: str) -> None:
    """The data view under a toggle (drawn only when the workload has a data section)."""
    from .bars import from_timeline
    from .figures import gantt_figure

    if not has_data(workload):
        return
    if not st.toggle("Data: batch by batch", key=f"{key}.data", help="the workload's data section: each drawn "
                     "batch's costs, the static plan against per_batch on each, and any batch's plan"):
        return
    batches = st.number_input("Batches", min_value=1, max_value=MAX_BATCHES, value=DEFAULT_BATCHES, step=1,
                              key=f"{key}.data.batches")
    try:
        with st.spinner(f"Planning {int(batches)} batches..."):
            run = data_run(term, workload, int(batches))
    except MpipeError as error:
        from .widgets import show_error

        show_error(error, what="Data")
        return
    summary = run.stream.summary()
    unit = run.time_unit
    st.caption(plain(f"per_batch({run.term}) over {len(run.static)} batches: mean {quantity(summary['mean'], unit)} "
                     f"against the static plan's {quantity(summary['static_mean'], unit)} (gain {summary['gain']:.3f}x, "
                     f"at least {summary['gain_min']:.3f}x a batch); planning {summary['plan_ms_mean']:.1f} ms mean, "
                     f"{summary['plan_ms_max']:.1f} ms max a batch."))
    picked = st.selectbox("Batch", list(range(len(run.static))), key=f"{key}.data.batch",
                          format_func=lambda i: f"batch {i}: {quantity(run.planned[i], unit)} "
                                                f"(static {quantity(run.static[i], unit)})")
    picked = 0 if picked is None or picked >= len(run.static) else int(picked)
    cols = st.columns(2)
    cols[0].plotly_chart(costs_figure(run), key=f"{key}.data.costs", config={"displaylogo": False})
    cols[1].plotly_chart(steps_figure(run, picked), key=f"{key}.data.steps", config={"displaylogo": False})
    replica, plan, timeline = batch_timeline(run, picked)
    bars = replace(from_timeline(timeline), unit=axis_unit(unit))
    fig, notice = gantt_figure(bars, title=f"Batch {picked}: {plan.how}")
    if notice:
        st.warning(plain(notice))
    st.plotly_chart(fig, key=f"{key}.data.gantt", config={"displaylogo": False})
    st.caption(plain(plan_caption(run, picked)))
