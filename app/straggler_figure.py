"""Figures of an imported Ascend run: the slow-card heatmap (rank x step) and
the communication rows of its HCCL lanes over one step's ops.

The heatmap reads at 512 ranks without scrolling: ranks run along the x axis
(one column each, no per-rank tick labels), steps up the y axis, a fixed
height; colour is each rank's busy time in that step against its stage's
median that step (diverging, white at the median, capped at +-3 thresholds so
one extreme card does not wash the rest out).  Hover names the rank, its
dp/pp/tp index, the step, the busy time and both deviations.
"""
from __future__ import annotations

import html
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from executor.analysis.stragglers import StragglerReport
from mpipe_core.formats.trace_import import CommRecord

HEATMAP_HEIGHT = 420
COMM_COLOURS = ("#e6ab02", "#252525", "#e7298a", "#66a61e", "#7570b3", "#a6761d")
COMM_STRIP = 0.22


def _index(value: int | None) -> str:
    return "–" if value is None else str(value)


def straggler_heatmap(report: StragglerReport) -> go.Figure:
    """Rank x step heatmap of busy time against the stage's median; flagged ranks marked in a strip below."""
    from plotly.subplots import make_subplots

    ranks = [r.rank for r in report.ranks]
    z = report.step_vs_stage.T * 100.0  # [step, rank], percent
    cap = 3 * report.threshold * 100.0
    labels = np.array([f"{_index(r.dp)}/{_index(r.pp)}/{_index(r.tp)}" for r in report.ranks], dtype=object)
    custom = np.dstack([np.broadcast_to(labels, z.shape), np.round(report.busy_ms.T, 3),
                        np.broadcast_to(np.array([r.vs_job * 100 for r in report.ranks]), z.shape)])
    steps = [str(s) for s in report.steps]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.9, 0.1], vertical_spacing=0.02)
    fig.add_trace(go.Heatmap(
        x=ranks, y=steps, z=z, zmin=-cap, zmax=cap, zmid=0.0, colorscale="RdBu_r", customdata=custom,
        colorbar=dict(title=dict(text="busy vs stage median", side="right"), ticksuffix="%", len=0.85, y=0.55),
        hovertemplate=("<b>rank %{x}</b> (dp/pp/tp %{customdata[0]})<br>step %{y}<br>"
                       "busy %{customdata[1]} ms<br>vs its stage's median this step %{z:+.1f}%<br>"
                       "rank's mean vs the job's median %{customdata[2]:+.1f}%<extra></extra>"),
        xgap=0, ygap=1), row=1, col=1)
    flagged = report.flagged
    fig.add_trace(go.Scatter(
        x=[r.rank for r in flagged], y=[0] * len(flagged), mode="markers+text",
        text=[str(r.rank) for r in flagged], textposition="middle right", textfont=dict(size=10),
        marker=dict(symbol="triangle-up", size=10, color=["#b2182b" if r.flag == "slow" else "#2166ac"
                                                             for r in flagged]),
        name="flagged", showlegend=False,
        customdata=[[f"{_index(r.dp)}/{_index(r.pp)}/{_index(r.tp)}", r.flag, r.vs_stage * 100] for r in flagged],
        hovertemplate=("<b>rank %{x}</b> (dp/pp/tp %{customdata[0]}): %{customdata[1]}, "
                       "%{customdata[2]:+.1f}% vs its stage's median<extra></extra>")), row=2, col=1)
    fig.update_layout(
        height=HEATMAP_HEIGHT, margin=dict(l=60, r=20, t=40, b=50), plot_bgcolor="white",
        title=dict(text=f"Busy time per rank and step against its pipeline stage's median: "
                        f"{len(flagged)} of {len(ranks)} ranks beyond {report.threshold:.0%} (▲)", x=0.0,
                   font=dict(size=14)))
    fig.update_yaxes(title_text="step", type="category", row=1, col=1)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, range=[-1, 1], row=2, col=1)
    fig.update_xaxes(range=[min(ranks) - 0.5, max(ranks) + 0.5], showgrid=False)
    fig.update_xaxes(title_text="rank", row=2, col=1)
    return fig


def comm_traces(comm: Sequence[CommRecord], origin: float, scale: float = 1000.0) -> list[go.Bar]:
    """The communication rows of one step as thin strips along each rank's bars, one trace per kind;
    `origin` (seconds) is the step's start, times in ms."""
    kinds = sorted({c.kind for c in comm})
    traces = []
    for n, kind in enumerate(kinds):
        mine = [c for c in comm if c.kind == kind]
        start = np.array([(c.start - origin) * scale for c in mine])
        end = np.array([(c.end - origin) * scale for c in mine])
        traces.append(go.Bar(
            orientation="h", base=start, x=np.maximum(end - start, 1e-6), y=np.array([c.device for c in mine]) + 0.29,
            width=COMM_STRIP, name=f"hcom {kind}", legendgroup=f"hcom {kind}",
            marker=dict(color=COMM_COLOURS[n % len(COMM_COLOURS)]),
            hovertext=[f"<b>{html.escape(c.name)}</b> on rank {c.device}<br>{(c.end - c.start) * scale:.3f} ms"
                       for c in mine],
            hovertemplate="%{hovertext}<extra></extra>"))
    return traces
