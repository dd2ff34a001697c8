"""Tune: search the algebra for the fastest schedules of a workload on P
devices and M microbatches (under a memory cap), see the makespan / peak
memory front against every baseline `mpipe tune` prints (fused, balanced,
colocated, disaggregated, transpose), and open a candidate in the Designer or
in Before / after."""
import pandas as pd
import streamlit as st

from app import state, widgets
from app.database import database_or_none
from app.evaluation import APP_LIMIT_SETTING, app_max_ops
from app.figures import OVER_COLOUR, OVER_MARK, pareto_figure
from app.formatting import BASELINE_NAMES, FITS_WORD, device_count, devices_total, fmt, pct, plain
from app.step_headline import step_cards, step_columns
from mpipe_core.errors import MpipeError

RESULT = "tune.result"  # (inputs, TuneResult, the WorkloadChoice it searched) of the last search
DEVICE_MEMORY, OWN_CAP, NO_CAP = "the device's memory", "a cap of my own", "no cap"
CAP_MODES = (DEVICE_MEMORY, OWN_CAP, NO_CAP)
MAX_DEVICES = 1024  # the tool is about 512-device jobs, and twice that
MAX_MICROBATCHES = 8 * MAX_DEVICES  # a few microbatches per device at the largest size

st.title("Tune")
st.caption("A search over generators, partitions and combinators (what `tune` does on the command line): "
           "the makespan / peak-memory front, against the baselines teams deploy.")
db = database_or_none("saved workloads are not offered")

left, right = st.columns([3, 2], gap="large")
with right:
    workload = widgets.workload_picker(db, key="tune.wl", parallel_open=True)
capacity = workload.capacity if workload is not None else None
mu = workload.memory_unit if workload is not None else ""
with left:
    cols = st.columns(2)
    devices = cols[0].number_input("Devices", min_value=1, max_value=MAX_DEVICES, value=4, step=1,
                                   key="tune.devices", help="the pipeline's devices (p); under tensor parallelism "
                                                            "each is tp devices")
    microbatches = cols[1].number_input("Microbatches", min_value=1, max_value=MAX_MICROBATCHES, value=8, step=1,
                                        key="tune.microbatches")
    cols = st.columns(2)
    cap_mode = cols[0].radio(
        "Memory cap per device", CAP_MODES, key="tune.cap_mode",
        format_func=lambda mode: mode if mode != DEVICE_MEMORY else
        f"{mode} ({fmt(capacity, mu)})" if capacity is not None else f"{mode} (unknown here: no cap)",
        help="the peak memory (static + activations) every device of a candidate must stay within")
    own_cap = None
    if cap_mode == OWN_CAP:
        own_cap = cols[0].number_input(f"Cap ({mu or 'memory units'})", min_value=0.0,
                                       value=float(capacity) if capacity is not None else 1.0, key="tune.cap")
    limit = cols[1].slider("Time limit (s)", 5, 120, 15, key="tune.limit")
    if workload is not None and (devices_total(int(devices), workload.degrees) != int(devices)
                                 or workload.dies_per_npu > 1):
        st.caption(plain(f"Devices in all: {device_count(int(devices), workload.degrees, workload.dies_per_npu)} — "
                         f"each pipeline device is tp × cp devices, the pipeline replicated dp times."))
    search = st.button("Search", type="primary", key="tune.search")

if workload is None:
    st.stop()
cap = {DEVICE_MEMORY: capacity, OWN_CAP: own_cap, NO_CAP: None}[cap_mode]
inputs = (workload.digest, int(devices), int(microbatches), None if cap is None else float(cap), int(limit))


def _too_big(wl: dict, devices: int, microbatches: int) -> str | None:
    """Why the smallest candidate (1F1B) is over the app's op limit, or None."""
    from mpipe_core.algebra.evaluate import estimate_ops
    from mpipe_core.algebra.terms import parse
    from mpipe_core.workloads.workload import parse_workload

    ops = estimate_ops(parse(f"1f1b(p={devices}, m={microbatches})"), parse_workload(wl))
    limit = app_max_ops()
    if ops <= limit:
        return None
    return (f"{devices:,} devices × {microbatches:,} microbatches: every candidate has at least {ops:,} ops, "
            f"over the app's limit of {limit:,} ({APP_LIMIT_SETTING}); or use `mpipe tune` on the command line")


def candidate_count(result) -> str:
    """One count of what the search evaluated, with its parts."""
    evaluated = len(result.candidates) + len(result.over_cap)
    text = f"{evaluated:,} candidates evaluated" + (
        f": {len(result.candidates):,} within the memory cap, {len(result.over_cap):,} over it"
        if result.memory_cap is not None else " (no memory cap)")
    if result.not_tried:
        text += f" ({result.not_tried:,} more terms left out by the time limit)"
    return text


if search:
    from mpipe_core.search.tune import tune

    failure: MpipeError | None = None
    with st.status("Searching...", expanded=True) as status:
        line = st.empty()
        try:
            refused = _too_big(workload.body(), int(devices), int(microbatches))
            if refused:
                raise MpipeError(refused)
            result = tune(workload.body(), int(devices), int(microbatches), cap, float(limit),
                          progress=lambda text: line.text(text), max_ops=app_max_ops(),
                          cap_is_capacity=cap_mode == DEVICE_MEMORY and cap is not None)
        except MpipeError as error:
            failure = error
            status.update(label="No schedule found (the reason is below)", state="error", expanded=False)
        else:
            status.update(label=plain(f"{candidate_count(result)} in {result.seconds:.1f} s"),
                          state="complete", expanded=False)
    if failure is not None:
        # Outside the status box, where the Search button was pressed: never folded away.
        widgets.show_error(failure)
        st.session_state.pop(RESULT, None)
        st.stop()
    st.session_state[RESULT] = (inputs, result, workload)

stored = st.session_state.get(RESULT)
if stored is None:
    st.info("Set the workload, devices, microbatches and a memory cap, then Search.")
    st.stop()
if stored[0] != inputs:
    st.warning("These results are for other inputs: Search again to update them.")
result, searched = stored[1], stored[2]  # the candidates, and the workload they were searched on
tu, mu = searched.time_unit, searched.memory_unit  # numbers in its units

best = result.best
cols = st.columns(3)
cols[0].metric("Best makespan", fmt(best.makespan, tu))
cols[1].metric("vs fused", f"{result.fused.makespan / best.makespan:.3g}x")
cols[2].metric("vs balanced", f"{result.balanced.makespan / best.makespan:.3g}x")
# Two bounds, each named: the search's (the lowest any candidate has) and the best term's own (eval's).
cols = st.columns(3)
cols[0].metric("Efficiency vs the search's LB", pct(result.lower_bound / best.makespan),
               help=f"the search's lower bound {fmt(result.lower_bound, tu)} (the lowest of every candidate's "
                    f"own bound) / makespan: one denominator for every row")
cols[1].metric("Efficiency vs its own LB", pct(best.lower_bound / best.makespan),
               help=f"the term's own lower bound {fmt(best.lower_bound, tu)} / makespan: what `mpipe eval` and "
                    f"the Designer show")
cols[2].metric("The search's lower bound", fmt(result.lower_bound, tu),
               help="the lowest of every candidate's own lower bound")
step_cards(best.step or {}, searched.degrees, searched.dies_per_npu, searched.body())  # an analytic workload: the best's step time and MFU
memory = (f"memory cap {fmt(result.memory_cap, mu)}" if result.memory_cap is not None else "no memory cap") + (
    f" (device memory {fmt(result.capacity, mu)})" if result.capacity is not None else " (device memory unknown)")
count = candidate_count(result)
if result.over_cap:
    count += f"; those over the cap are drawn in red ({OVER_MARK}) and left out of the table"
st.caption(plain(f"{count}. Peak memory is static (parameters, gradients, optimizer state) + activations; "
                 f"{memory}. The search's lower bound: {fmt(result.lower_bound, tu)}."))

st.subheader("Baselines")
baselines = {name: c for name, c in result.baselines().items() if c is not None}
st.dataframe(pd.DataFrame([{
    "baseline": BASELINE_NAMES[name], "makespan": fmt(c.makespan, tu), "peak memory": fmt(c.peak_memory, mu),
    "fits": FITS_WORD[c.fits], "speedup over fused": f"{result.fused.makespan / c.makespan:.2f}x",
    "best vs it": f"{c.makespan / best.makespan:.2f}x", "term": c.term,
} for name, c in baselines.items()]).style.map(
    lambda v: f"color: {OVER_COLOUR}; font-weight: bold" if v == FITS_WORD[False] else "", subset=["fits"]),
    hide_index=True, key="tune.baselines", width="stretch")
st.caption("Each baseline is the fastest of its kind that fits the memory cap (else the fastest of its kind, "
           "said below), on the same devices in all, as `mpipe tune` prints them.")
for name, c in baselines.items():
    if result.over_cap_by(c) > 0:
        st.warning(plain(f"The {BASELINE_NAMES[name]} baseline {c.term} is over the memory cap (none of its kind "
                         f"fits it): it needs {fmt(c.peak_memory, mu)}, {fmt(result.over_cap_by(c), mu)} over."))
st.plotly_chart(pareto_figure(result, tu, mu), key="tune.pareto", config={"displaylogo": False})


def _times(baseline: float, makespan: float) -> str:
    return f"{baseline / makespan:.2f}x" if makespan else "–"


# The columns `mpipe tune` prints: each candidate against both baselines.
front = result.fitting_front
rows = [{"term": c.term, "makespan": fmt(c.makespan, tu), "peak memory": fmt(c.peak_memory, mu),
         **step_columns(c.step), "static": fmt(c.static_memory, mu), "fits": FITS_WORD[c.fits],
         "eff. vs the search's LB": pct(result.lower_bound / c.makespan if c.makespan else 1.0),
         "eff. vs its own LB": pct(c.lower_bound / c.makespan if c.makespan else 1.0),
         "vs fused": _times(result.fused.makespan, c.makespan),
         "vs balanced": _times(result.balanced.makespan, c.makespan),
         "on the front": "yes" if c.term in front else ""} for c in result.candidates]
st.dataframe(pd.DataFrame(rows).style.map(
    lambda v: f"color: {OVER_COLOUR}; font-weight: bold" if v == FITS_WORD[False] else "", subset=["fits"]),
    hide_index=True, key="tune.table", width="stretch")
st.caption(plain(f"fits: within the device's memory (unknown: the workload states none); static: the largest "
                 f"static memory of any device; eff. vs the search's LB: the search's lower bound "
                 f"{fmt(result.lower_bound, tu)} (the lowest of every candidate's own) / makespan, what `mpipe tune` "
                 f"prints; eff. vs its own LB: the term's own lower bound / makespan, what `mpipe eval` and the "
                 f"Designer show; on the front: no candidate that fits is both faster and lighter."))

terms = [c.term for c in result.candidates]
picked = st.selectbox("Candidate", terms, key="tune.picked",
                      format_func=lambda t: ("★ " if t in front else "") + t)
cols = st.columns(2)
if cols[0].button("Open in the Designer", key="tune.designer"):
    state.open_in_designer(picked, searched.body(), searched.label)  # the workload it was searched on
    st.switch_page("app_pages/designer.py")
if cols[1].button("Before / after against the fused baseline", key="tune.ba"):
    # Both were evaluated by the search, on the workload it searched: Before / after opens on that one.
    state.set_before_after(result.fused.term, picked)
    state.set_workload(searched.body(), searched.label)
    st.switch_page("app_pages/before_after.py")
