"""A data run's steps (`mpipe run --data`, queued with a data section): each
step's measured makespan beside the makespan predicted for the plan that step
ran (stored with the run: `storage.runs.STEP_PLAN_FIELDS`)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from .bars import Bars
from .formatting import plain

MS_PER = {"us": 1e-3, "ms": 1.0, "s": 1e3}  # a workload time unit in milliseconds


def measured_steps(bars: Bars) -> dict[int, float]:
    """Each step's measured makespan (ms): its last op's end − its first op's start."""
    out = {}
    for step in np.unique(bars.step):
        mine = bars.step == step
        out[int(step)] = float(bars.end[mine].max() - bars.start[mine].min())
    return out


def rows(plans: list[dict], measured: dict[int, float], time_unit: str) -> list[dict]:
    """Per planned step: measured and predicted (ms where the workload's unit is a time), the plan."""
    factor = MS_PER.get(time_unit)
    out = []
    for p in plans:
        predicted = p["predicted_makespan"] * factor if factor is not None else None
        m = measured.get(p["step"])
        out.append({"step": p["step"], "measured (ms)": m, "predicted (ms)": predicted,
                    "error": f"{predicted / m - 1:+.1%}" if m and predicted is not None else "–",
                    "static plan (ms)": p["static_makespan"] * factor if factor is not None else None,
                    "plan": f"{p['how']} ({p['digest']})"})
    return out


def steps_figure(table: list[dict]) -> go.Figure:
    steps = [r["step"] for r in table]
    fig = go.Figure([
        go.Scatter(x=steps, y=[r["measured (ms)"] for r in table], mode="lines+markers", name="measured",
                   line=dict(color="#222222"), hovertemplate="step %{x}: %{y:.4~r} ms<extra>measured</extra>"),
        go.Scatter(x=steps, y=[r["predicted (ms)"] for r in table], mode="lines+markers",
                   name="predicted (the plan it ran)", line=dict(color="#08519c", dash="dash"),
                   hovertemplate="step %{x}: %{y:.4~r} ms<extra>predicted</extra>"),
    ])
    fig.update_layout(height=320, title="Per-step makespan: measured against the prediction for the step's plan",
                      margin=dict(t=50, l=50, r=20, b=40), plot_bgcolor="white", legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(title_text="step", gridcolor="#eeeeee", dtick=1)
    fig.update_yaxes(title_text="makespan (ms)", gridcolor="#eeeeee")
    return fig


def section(run, bars: Bars, time_unit: str) -> None:
    """The per-step table and chart of a run with stored step plans."""
    table = rows(run.step_plans, measured_steps(bars), time_unit)
    if MS_PER.get(time_unit) is None:
        st.info(plain(f"The run's workload states no time unit ({time_unit or 'unitless'}): its predictions are "
                      f"in workload units and are not set against the measured milliseconds."))
    else:
        st.plotly_chart(steps_figure(table), key=f"runs.data_steps.{run.id}", config={"displaylogo": False})
    st.dataframe(pd.DataFrame(table), hide_index=True, key=f"runs.data_table.{run.id}", width="stretch")
    st.caption("Each step ran the plan per_batch made for its own drawn batch (or the static plan when the term "
               "is not wrapped); predicted: that plan simulated on the batch's costs. Step 0 includes the "
               "warm-up.")
