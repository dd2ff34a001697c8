"""Plan: the whole layout for N devices and a global batch (what `mpipe plan`
does): the candidates against peak memory, the chosen layout's device map and
step-time breakdown, each stack's launch arguments (or the fastest candidate
the stack can run, and how much slower it is), and any candidate
opened in the Designer on its own workload document."""
import time

import pandas as pd
import streamlit as st

from app import auth, launch_view, plan_launch, plan_view, state, widgets
from app.database import database_or_none
from app.evaluation import canonical_json
from app.formatting import npus_text, plain
from app.step_headline import device_text
from mpipe_core.errors import MpipeError
from mpipe_core.search.budget import DEFAULT_EVALUATIONS
from mpipe_core.search.plan import device_map
from mpipe_core.workloads.cluster import CLUSTERS
from mpipe_core.workloads.units import seconds
from storage import enqueue_spec

RESULT = "plan.result"  # (PlanInputs, PlanResult, workload label) of the last search
RUNNABLE = "plan.runnable"  # (result, {stack: its fastest runnable candidate, or why none})
DEVICE_MEMORY, OWN_CAP, NO_CAP = "the device's memory", "a cap of my own (GB)", "no cap"
WORKLOADS_OWN = "(the workload's, else its device's)"
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
    # No min/max on the widget: it would put back the last valid value without a word; an
    # invalid count is said below and disables the Plan button instead.
    devices = cols[0].number_input("Devices (in all)", value=512, step=1, key="plan.devices",
                                   help="every device of the job: tp × cp × pp × dp.  On cloudmatrix384 a "
                                        "device is one die of a 910C NPU (two dies to an NPU).")
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
    budget = cols[1].number_input("Search budget (terms)", min_value=1, max_value=1_000_000,
                                  value=DEFAULT_EVALUATIONS, step=100, key="plan.budget",
                                  help="terms evaluated, recompute tries on top (what `mpipe plan --evaluations` "
                                       "sets): a count, not seconds, so the same question gets the same answer "
                                       "however busy the machine is")
    problem = plan_view.devices_problem(int(devices))
    if problem is not None:
        st.error(problem)
    elif workload is not None:
        st.caption(plain(plan_view.devices_words(workload.body(), None if cluster == WORKLOADS_OWN else cluster,
                                                 int(devices))))
    go = st.button("Plan", type="primary", key="plan.search", disabled=problem is not None)

if workload is None or problem is not None:
    st.stop()
cap = {DEVICE_MEMORY: "capacity", OWN_CAP: own_cap, NO_CAP: None}[cap_mode]
inputs = plan_view.PlanInputs(canonical_json(workload.body()), int(devices), int(batch),
                              None if cluster == WORKLOADS_OWN else cluster, cap, int(top), int(budget))

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
cols[0].metric("Best step time", seconds(best.step_time_s))
cols[1].metric("MFU", f"{best.mfu:.1%}")
cols[2].metric("Peak memory", f"{best.peak_memory:.4g} GB")
npus = npus_text(best.devices_total, result.cluster.dies_per_npu)
cols[3].metric("Devices" + (f" ({npus})" if npus else ""), f"{best.devices_total:,}")
device = device_text({}, best.document)  # what every step time here rests on
if device is not None:
    st.caption(plain(f"Device: {device}"))
s = result.searched
cap_text = f"memory cap {result.memory_cap:.4g} GB" if result.memory_cap is not None else "no memory cap"
st.caption(plain(f"{result.cluster.count_text(result.devices)} on {result.cluster.name}, global batch "
                 f"{result.global_batch:,}, {cap_text}. Searched {s['layouts']:,} layouts, {s['terms']:,} terms: "
                 f"{s['evaluated']:,} evaluations ({s['recompute_tries']:,} recompute tries), "
                 f"{s['pruned_by_bound']:,} pruned by the step-time bound, {s['pruned_by_memory']:,} by static "
                 f"memory, in {result.seconds:.1f} s; {result.coverage()}. Best: {best.layout.label()} {best.term}"))

order = list(range(len(result.candidates)))
picked = st.selectbox("Candidate", order, key="plan.picked",
                      format_func=lambda i: plan_view.candidate_label(i, result.candidates[i]))
if picked is None or picked >= len(result.candidates):
    picked = 0
chosen = result.candidates[picked]

cols = st.columns(2)
measure = cols[0].radio("Plot", (plan_view.STEP_TIME, plan_view.MFU), horizontal=True, key="plan.measure")
over = sum(not c.within_cap for c in result.candidates)
show_over = cols[1].toggle(f"Show the {over:,} candidates over the memory cap", key="plan.show_over",
                           disabled=not over, help="off: the axes fit the candidates that fit")
st.plotly_chart(plan_view.candidates_figure(result, measure, chosen, show_over), key="plan.scatter",
                config={"displaylogo": False})

cols = st.columns([1, 3])
if cols[0].button("Open in Designer", type="primary", key="plan.designer"):
    # The candidate's whole workload document (its parallel section, microbatch size, cluster):
    # the Designer evaluates exactly what the plan did.
    # And the plan's winner on that layout: what Before / after compares a transpose with there.
    winner = next((c.term for c in result.candidates if c.within_cap and c.document == chosen.document), None)
    state.open_in_designer(chosen.term, chosen.document, f"{label} at {chosen.layout.label()}", winner)
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
st.markdown("**Mpipe's runtime** (queued for a worker: `mpipe plan --emit mpipe`, then `mpipe runs enqueue --spec`)")
spec = plan_launch.row_spec(result, picked)
if db is None:
    st.caption("Launching needs the database (see above).")
elif not auth.may("launch"):
    st.caption(plain(auth.needs("launch", "Launching a plan's row")))
else:
    cols = st.columns([3, 1, 1])
    name = cols[0].text_input("Save it as schedule", value=plan_launch.default_name(label, spec),
                              key=f"plan.launch_name.{picked}",
                              help="its next version if the schedule exists (the latest again if it is the same)")
    dp = cols[1].number_input("dp replicas", min_value=1, max_value=spec.layout.dp, value=spec.layout.dp, step=1,
                              key=f"plan.launch_dp.{picked}",
                              help="fewer replicas try the row on fewer devices first (tp, cp, pp and the "
                                   "schedule stay: `--scale dp=K`)")
    check = cols[2].checkbox("Check gradients", value=True, key="plan.launch_check",
                             help="the worker compares the run's gradients with a single-process reference")
    spec = spec.scaled(int(dp))
    st.caption(plain(plan_launch.what_runs(spec)))
    if widgets.write_button("Launch", "launch", key="plan.launch", target=name.strip(), schedule=name.strip()):
        try:
            run = enqueue_spec(db, spec, name.strip(), options={"check_grads": True} if check else {})
        except MpipeError as error:
            widgets.show_error(error)
        else:
            state.select_run(run.id)
            st.success(plain(f"Queued run #{run.id} of {run.ref} on {run.nproc} ranks: follow it on the Runs page"))
if st.session_state.get(RUNNABLE, (None,))[0] is not result:
    st.session_state[RUNNABLE] = (result, {})
for section in launch_view.launch_sections(result, picked, st.session_state[RUNNABLE][1]):
    st.markdown(f"**{section.label}**")
    if section.note is not None:
        st.info(plain(section.note))
    for file_name, text in section.files.items():
        st.caption(file_name)
        st.code(text, language=section.language(file_name))

st.subheader("Why each axis lost")
st.caption("Each tp, cp, pp, dp and microbatch size not in the top K, and each encoder strategy but the best's: "
           "it does not fit, its bound is above the K-th best, or its best layout and how much slower it is.")
for line in result.ruled_out:
    st.text(line)
