"""Plan: the whole layout for N devices and a global batch (what `mpipe plan`
does): the candidates against peak memory, the chosen layout's device map and
step-time breakdown, each stack's launch arguments (or the fastest candidate
the stack can run, and how much slower it is), and any candidate
opened in the Designer on its own workload document."""
import time

import pandas as pd
import streamlit as st

from app import launch_view, plan_view, state, widgets
from app.database import database_or_none
from app.evaluation import canonical_json
from app.formatting import plain
from app.step_headline import device_text
from mpipe_core.errors import MpipeError
from mpipe_core.search.plan import device_map
from mpipe_core.workloads.cluster import CLUSTERS

RESULT = "plan.result"  # (PlanInputs, PlanResult, workload label) of the last search
RUNNABLE = "plan.runnable"  # (result, {stack: its fastest runnable candidate, or why none})
DEVICE_MEMORY, OWN_CAP, NO_CAP = "the device's memory", "a cap of my own (GB)", "no cap"
WORKLOADS_OWN = "(the workload's, else its device's)"
MAX_DEVICES = 65_536
DEFAULT_WORKLOAD = "internvl-26b"

st.title("Plan")
st.caption("The whole layout for N devices (tp × cp × pp × dp, microbatch size, virtual stages, recompute and "
           "the encoder strategy) for a global batch: what `mpipe plan` searches.")
db = database_or_none("saved workloads are not offered")

left, right = st.columns([3, 2], gap="large")
with right:
    state.kept("plan.wl.preset", DEFAULT_WORKLOAD)  # an analytic preset: plan needs a model and a device
    workload = widgets.workload_picker(db, key="plan.wl")
with left:
    cols = st.columns(2)
    devices = cols[0].number_input("Devices", min_value=1, max_value=MAX_DEVICES, value=512, step=1,
                                   key="plan.devices")
    batch = cols[1].number_input("Global batch", min_value=1, max_value=1 << 24, value=512, step=1,
                                 key="plan.batch", help="samples per optimizer step")
    cols = st.columns(2)
    cluster = cols[0].selectbox("Cluster", [WORKLOADS_OWN, *sorted(CLUSTERS)], key="plan.cluster")
    top = cols[1].number_input("Top K", min_value=1, max_value=50, value=5, step=1, key="plan.top",
                               help="the search keeps the K fastest layouts exact (it prunes against the K-th)")
    cols = st.columns(2)
    cap_mode = cols[0].radio("Memory cap per device", (DEVICE_MEMORY, OWN_CAP, NO_CAP), key="plan.cap_mode")
    own_cap = None
    if cap_mode == OWN_CAP:
        own_cap = cols[0].number_input("Cap (GB)", min_value=0.0, value=64.0, key="plan.cap")
    limit = cols[1].number_input("Time limit (s)", min_value=1, max_value=600, value=30, step=1, key="plan.limit",
                                 help="seconds of search (what `mpipe plan --time-limit` sets); the first layout "
                                      "always completes")
    go = st.button("Plan", type="primary", key="plan.search")

if workload is None:
    st.stop()
cap = {DEVICE_MEMORY: "capacity", OWN_CAP: own_cap, NO_CAP: None}[cap_mode]
inputs = plan_view.PlanInputs(canonical_json(workload.body()), int(devices), int(batch),
                              None if cluster == WORKLOADS_OWN else cluster, cap, int(top), float(limit))

if go:
    failure: MpipeError | None = None
    started = time.monotonic()
    with st.status("Planning...", expanded=True) as status:
        bar = st.progress(0.0, text="reading the layouts")

        def progress(done: int, total: int, what: str) -> None:
            seconds = time.monotonic() - started
            share = min(1.0, done / total) if total > 0 else 0.0
            terms = f"{done:,}/{total:,} terms · " if total > 0 else ""
            bar.progress(share, text=f"{terms}{what} · {seconds:.0f} s")

        try:
            result = plan_view.run_plan(inputs, progress)
        except MpipeError as error:
            failure = error
            status.update(label="No layout (the reason is below)", state="error", expanded=False)
        else:
            status.update(label=f"{result.searched['evaluated']:,} evaluations of {result.searched['terms']:,} "
                                f"terms in {result.searched['layouts']:,} layouts, {result.seconds:.1f} s",
                          state="complete", expanded=False)
    if failure is not None:
        widgets.show_error(failure)  # outside the status box: never folded away
        st.session_state.pop(RESULT, None)
        st.stop()
    st.session_state[RESULT] = (inputs, result, workload.label)

stored = st.session_state.get(RESULT)
if stored is None:
    st.info("Set the workload, devices, global batch, cluster and memory cap, then Plan.")
    st.stop()
if stored[0] != inputs:
    st.warning("These results are for other inputs: Plan again to update them.")
searched_inputs, result, label = stored
best = result.best

cols = st.columns(4)
cols[0].metric("Best step time", f"{best.step_time_s:.4g} s")
cols[1].metric("MFU", f"{best.mfu:.1%}")
cols[2].metric("Peak memory", f"{best.peak_memory:.4g} GB")
cols[3].metric("Devices", f"{best.devices_total:,}")
device = device_text({}, best.document)  # what every step time here rests on
if device is not None:
    st.caption(plain(f"Device: {device}"))
s = result.searched
cap_text = f"memory cap {result.memory_cap:.4g} GB" if result.memory_cap is not None else "no memory cap"
st.caption(plain(f"{result.devices:,} devices on {result.cluster.name}, global batch {result.global_batch:,}, "
                 f"{cap_text}. Searched {s['layouts']:,} layouts, {s['terms']:,} terms: {s['evaluated']:,} "
                 f"evaluations ({s['recompute_tries']:,} recompute tries), {s['pruned_by_bound']:,} pruned by the "
                 f"step-time bound, {s['pruned_by_memory']:,} by static memory, {s['not_tried']:,} left by the time "
                 f"limit, in {result.seconds:.1f} s. Best: {best.layout.label()} {best.term}"))

order = list(range(len(result.candidates)))
picked = st.selectbox("Candidate", order, key="plan.picked",
                      format_func=lambda i: plan_view.candidate_label(i, result.candidates[i]))
if picked is None or picked >= len(result.candidates):
    picked = 0
chosen = result.candidates[picked]

measure = st.radio("Plot", (plan_view.STEP_TIME, plan_view.MFU), horizontal=True, key="plan.measure")
st.plotly_chart(plan_view.candidates_figure(result, measure, chosen), key="plan.scatter",
                config={"displaylogo": False})

cols = st.columns([1, 3])
if cols[0].button("Open in Designer", type="primary", key="plan.designer"):
    # The candidate's whole workload document (its parallel section, microbatch size, cluster):
    # the Designer evaluates exactly what the plan did.
    state.open_in_designer(chosen.term, chosen.document, f"{label} at {chosen.layout.label()}")
    st.switch_page("app_pages/designer.py")
cols[1].caption(plain(f"{chosen.layout.label()} · {chosen.microbatches} microbatches · {chosen.family} · "
                      f"{chosen.term}"))
st.plotly_chart(plan_view.breakdown_figure(chosen), key="plan.breakdown", config={"displaylogo": False})

st.subheader("Device map")
dmap = device_map(chosen, result.cluster)
world = len(dmap["ranks"])
rank = st.number_input("Groups of rank", min_value=0, max_value=world - 1, value=0, step=1, key="plan.rank")
st.plotly_chart(plan_view.device_map_figure(dmap, int(rank)), key="plan.map", config={"displaylogo": False})
st.dataframe(pd.DataFrame(plan_view.groups_rows(dmap, int(rank))), hide_index=True, key="plan.groups",
             width="stretch")

st.subheader("Launch arguments")
if st.session_state.get(RUNNABLE, (None,))[0] is not result:
    st.session_state[RUNNABLE] = (result, {})
for section in launch_view.launch_sections(result, picked, st.session_state[RUNNABLE][1]):
    st.markdown(f"**{section.label}**")
    if section.note is not None:
        st.info(plain(section.note))
    for file_name, text in section.files.items():
        st.caption(file_name)
        st.code(text, language=section.language(file_name))

with st.expander(f"Ruled out ({len(result.ruled_out)})"):
    for line in result.ruled_out:
        st.text(line)
