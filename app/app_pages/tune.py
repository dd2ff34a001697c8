"""Tune: search the algebra for the fastest schedules of a workload on P
devices and M microbatches (under a memory cap), see the makespan / peak
memory front against the fused and balanced baselines, and open a candidate
in the Designer or in Before / after."""
import pandas as pd
import streamlit as st

from app import state, widgets
from app.database import database_or_none
from app.figures import pareto_figure
from app.formatting import fmt, pct
from mpipe_core.errors import MpipeError

RESULT = "tune.result"  # (inputs, TuneResult) of the last search

st.title("Tune")
st.caption("A search over generators, partitions and combinators (what `tune` does on the command line): "
           "the makespan / peak-memory front, against the fused and balanced baselines.")
db = database_or_none("saved workloads are not offered")

left, right = st.columns([3, 2], gap="large")
with right:
    workload = widgets.workload_picker(db, key="tune.wl")
with left:
    cols = st.columns(2)
    devices = cols[0].number_input("Devices", min_value=1, max_value=64, value=4, step=1, key="tune.devices")
    microbatches = cols[1].number_input("Microbatches", min_value=1, max_value=512, value=8, step=1,
                                        key="tune.microbatches")
    cols = st.columns(2)
    cap = cols[0].number_input("Memory cap per device (0: none)", min_value=0.0, value=0.0, key="tune.cap",
                               help="peak activation memory, in the workload's memory unit")
    limit = cols[1].slider("Time limit (s)", 5, 120, 15, key="tune.limit")
    search = st.button("Search", type="primary", key="tune.search")

if workload is None:
    st.stop()
inputs = (workload.digest, int(devices), int(microbatches), float(cap) or None, int(limit))
if search:
    from mpipe_core.tune import tune

    with st.status("Searching...", expanded=True) as status:
        line = st.empty()
        try:
            result = tune(workload.body(), int(devices), int(microbatches), float(cap) or None, float(limit),
                          progress=lambda text: line.text(text))
        except MpipeError as error:
            status.update(label="No schedule found", state="error")
            widgets.show_error(error)
            st.stop()
        status.update(label=f"{len(result.candidates)} candidates in {result.seconds:.1f} s", state="complete",
                      expanded=False)
    st.session_state[RESULT] = (inputs, result)

stored = st.session_state.get(RESULT)
if stored is None:
    st.info("Set the workload, devices, microbatches and a memory cap, then Search.")
    st.stop()
if stored[0] != inputs:
    st.warning("These results are for other inputs: Search again to update them.")
result = stored[1]
tu, mu = workload.time_unit, workload.memory_unit

cols = st.columns(4)
cols[0].metric("Best makespan", fmt(result.best.makespan, tu))
cols[1].metric("vs fused", f"{result.fused.makespan / result.best.makespan:.3g}x")
cols[2].metric("vs balanced", f"{result.balanced.makespan / result.best.makespan:.3g}x")
cols[3].metric("Efficiency vs LB", pct(result.lower_bound / result.best.makespan))
st.plotly_chart(pareto_figure(result, tu, mu), key="tune.pareto", config={"displaylogo": False})

rows = [{"term": c.term, "makespan": fmt(c.makespan, tu), "peak memory": fmt(c.peak_memory, mu),
         "efficiency": pct(result.lower_bound / c.makespan if c.makespan else 1.0),
         "on the front": "yes" if c.term in result.pareto else ""} for c in result.candidates]
st.dataframe(pd.DataFrame(rows), hide_index=True, key="tune.table", width="stretch")

terms = [c.term for c in result.candidates]
picked = st.selectbox("Candidate", terms, key="tune.picked",
                      format_func=lambda t: ("★ " if t in result.pareto else "") + t)
cols = st.columns(2)
if cols[0].button("Open in the Designer", key="tune.designer"):
    state.open_in_designer(picked, workload.body(), workload.label)
    st.switch_page("app_pages/designer.py")
if cols[1].button("Before / after against the fused baseline", key="tune.ba"):
    state.set_before_after(result.fused.term, picked)
    st.switch_page("app_pages/before_after.py")
