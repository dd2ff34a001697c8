"""Runs: launch a saved schedule version on real devices, follow its measured
timeline while it runs, then compare it with the simulator's prediction."""
import numpy as np
import pandas as pd
import streamlit as st

from app import views
from app.bars import from_records, from_timings
from app.figures import gantt_figure, overlay_figure
from mpipe_core.backends import BACKENDS
from mpipe_core.errors import MpipeError
from storage import (
    cancel_run,
    enqueue,
    get_run,
    get_version,
    history,
    list_runs,
    list_schedules,
    run_events,
    timing_count,
    timings_for,
)
from storage.runs import is_finished

SELECTED = "runs.selected"
LIVE_REFRESH_S = 1.0
# While a run goes, draw only its latest steps up to this many ops: the chart
# is redrawn every second and must finish rendering well within that.
LIVE_MAX_OPS = 1_500
LIVE_MAX_STEPS = 8

st.title("Runs")
db = views.database_or_stop()

# --- launch --------------------------------------------------------------------------------
with st.expander("Launch a run", expanded=True):
    schedules = list_schedules(db)
    if not schedules:
        st.info("No saved schedules yet: save one from the Designer first.")
    else:
        cols = st.columns([2, 1])
        name = cols[0].selectbox("Schedule", [s.name for s in schedules], key="runs.schedule")
        versions = list(reversed(history(db, name)))
        ref = cols[1].selectbox("Version", [v.ref for v in versions], key="runs.version")
        version = versions[[v.ref for v in versions].index(ref)]
        st.caption(f"`{version.term}` on {version.workload_label} — "
                   f"{version.metric('devices')} devices, predicted makespan "
                   f"{views.fmt(version.metric('makespan'))}")
        with st.form("runs.launch"):
            cols = st.columns(3)
            backend = cols[0].selectbox("Backend", BACKENDS, key="runs.backend",
                                        help="gloo: CPU processes; nccl: CUDA; hccl: Ascend NPU")
            nproc = cols[1].number_input("Devices (ranks)", min_value=1, step=1,
                                         value=int(version.metric("devices") or 1), key=f"runs.nproc.{ref}",
                                         help="must equal the schedule's device count")
            steps = cols[2].number_input("Training steps", min_value=1, max_value=1000, value=3, step=1,
                                         key="runs.steps")
            if st.form_submit_button("Launch", type="primary"):
                try:
                    run = enqueue(db, ref, backend=backend, nproc=int(nproc), steps=int(steps))
                except MpipeError as error:
                    st.error(error.message)
                else:
                    st.session_state[SELECTED] = run.id
                    st.success(f"Queued run #{run.id} of {run.ref}")
        st.caption("Queued runs wait until a worker claims them: `mpipe app` starts one beside the app "
                   "(unless `--no-worker`); more can join with `mpipe worker --db URL`.")

# --- list ----------------------------------------------------------------------------------
runs = list_runs(db, limit=200)
if not runs:
    st.info("No runs yet.")
    st.stop()
st.subheader("All runs")
st.dataframe(pd.DataFrame([{
    "run": r.id, "schedule": r.ref, "status": r.status, "backend": r.backend, "devices": r.nproc,
    "steps": r.steps, "launched by": r.launched_by, "worker": r.worker_id or "",
    "created": views.when(r.created_at), "finished": views.when(r.finished_at),
} for r in runs]), hide_index=True, key="runs.table")

ids = [r.id for r in runs]
query = st.query_params.get("run")
if query and query.isdigit() and int(query) in ids and SELECTED not in st.session_state:
    st.session_state[SELECTED] = int(query)
if st.session_state.get(SELECTED) not in ids:
    st.session_state[SELECTED] = ids[0]
by_id = {r.id: r for r in runs}
run_id = st.selectbox("Run", ids, key=SELECTED,
                      format_func=lambda i: f"#{i} {by_id[i].ref} ({by_id[i].launched_by}, {views.when(by_id[i].created_at)})")
st.query_params["run"] = str(run_id)


# --- one run -------------------------------------------------------------------------------
def _header(run) -> None:
    st.subheader(f"Run #{run.id}: {run.ref}")
    cols = st.columns(5)
    cols[0].metric("Status", run.status)
    cols[1].metric("Backend × devices", f"{run.backend} × {run.nproc}")
    cols[2].metric("Steps", run.steps)
    cols[3].metric("Started", views.when(run.started_at)[11:] if run.started_at else "–")
    cols[4].metric("Finished", views.when(run.finished_at)[11:] if run.finished_at else "–")


def _expected_ops(run) -> int | None:
    try:
        return views.evaluate_version(get_version(db, run.ref)).schedule.num_ops * run.steps
    except MpipeError:
        return None


def _live(run, live_limit: int | None = LIVE_MAX_OPS) -> None:
    """The measured timeline as it fills in (all of it with `live_limit=None`)."""
    count = timing_count(db, run.id)
    expected = _expected_ops(run)
    if run.status == "queued":
        st.info("Queued: waiting for a worker to claim it.")
    elif run.cancel_requested:
        st.warning("Cancel requested: the worker stops it at its next heartbeat.")
    if expected:
        st.progress(min(1.0, count / expected), text=f"{count:,} of {expected:,} op timings recorded")
    if count:
        bars = from_timings(timings_for(db, run.id), run.nproc)
        title = "Measured, all steps" if is_finished(run.status) else "Measured so far, all steps"
        steps = np.unique(bars.step)
        if live_limit and (len(bars) > live_limit or len(steps) > LIVE_MAX_STEPS):
            per_step = max(1, len(bars) // len(steps))
            keep = steps[-max(1, min(LIVE_MAX_STEPS, live_limit // per_step)):]
            bars = bars.select(np.isin(bars.step, keep))
            title = (f"Measured so far: latest steps {keep[0]}–{keep[-1]} of {run.steps} "
                     f"(every step in a tab once the run ends)")
            bars = bars.shifted(float(bars.start.min()))
        fig, notice = gantt_figure(bars, title=title, show_idle=False)
        if notice:
            st.warning(notice)
        st.plotly_chart(fig, key=f"runs.live.{run.id}", config={"displaylogo": False})


def _comparison(run) -> None:
    """Measured vs predicted (or vs another run), from the executor's compare_run."""
    from executor.analysis.compare_run import compare_run

    against = st.text_input(
        "Compare against", key=f"runs.against.{run.id}", placeholder="(empty: its own term, simulated "
        "on the workload calibrated from this run) — or a term, or another run's id")
    try:
        with st.spinner("Comparing..."):
            cmp = compare_run(db, run.id, against.strip() or None, explain=not against.strip())
    except MpipeError as error:
        st.error(error.message)
        return
    side = "predicted" if cmp.kind == "prediction" else "other run"
    cols = st.columns(3)
    cols[0].metric("Measured makespan (ms)", views.fmt(cmp.measured_ms))
    cols[1].metric(f"{side.capitalize()} makespan (ms)", views.fmt(cmp.other_ms))
    cols[2].metric(f"{side.capitalize()} / measured − 1", views.fmt(cmp.error, "+.1%"))
    st.caption(f"Against {cmp.against}" + (f" on workload {cmp.workload}" if cmp.workload else "")
               + f"; measured = mean over steps {', '.join(map(str, cmp.steps))}; each measured op "
               f"includes the mean dispatch gap ({cmp.overhead_ms:.3f} ms). "
               f"{cmp.matched_ops} ops matched, {cmp.unmatched_ops} on one side only.")
    measured = from_records(cmp.measured_timeline, run.nproc)
    other = from_records(cmp.other_timeline, run.nproc)
    st.plotly_chart(overlay_figure(measured, other, title=f"Measured (lower half of each row) vs {side} "
                                                          f"(upper half, faded)"),
                    key=f"runs.overlay.{run.id}", config={"displaylogo": False})
    left, right = st.columns(2, gap="large")
    with left:
        st.markdown("**Per device (ms)**")
        st.dataframe(pd.DataFrame([{
            "device": d.device, "measured busy": views.fmt(d.measured_busy_ms),
            "measured idle": views.fmt(d.measured_idle_ms), f"{side} busy": views.fmt(d.other_busy_ms),
            f"{side} idle": views.fmt(d.other_idle_ms),
        } for d in cmp.devices]), hide_index=True, key=f"runs.devices.{run.id}")
    with right:
        st.markdown("**Ops whose measured time differs most (ms)**")
        st.dataframe(pd.DataFrame([{
            "op": o.op, "device": o.device, "measured": views.fmt(o.measured_ms), side: views.fmt(o.other_ms),
            "difference": views.fmt(o.difference_ms, "+.3g"), "ends at": views.fmt(o.measured_end_ms),
        } for o in cmp.top_ops]), hide_index=True, key=f"runs.ops.{run.id}")
    if cmp.explanation is not None:
        st.markdown("**Where the gap goes (ms): measured − predicted by cause, along the measured critical "
                    "path, mean over the steps**")
        st.dataframe(pd.DataFrame([{
            "cause": e["cause"], "path ops": views.fmt(e["ops"]), "measured": views.fmt(e["measured_ms"]),
            "predicted": views.fmt(e["predicted_ms"]), "difference": views.fmt(e["gap_ms"], "+.3g"),
            "of which contention": views.fmt(e["contention_ms"]),
        } for e in cmp.explanation]), hide_index=True, key=f"runs.explain.{run.id}")


def _details(run) -> None:
    if run.error:
        st.error(run.error)
    with st.expander("Log tail", expanded=run.status == "failed"):
        st.code(run.log_tail or "(no log yet)", language=None)
    with st.expander("Status history"):
        st.dataframe(pd.DataFrame([{
            "at": views.when(e.at), "from": e.from_status or "", "to": e.to_status, "worker": e.worker_id or "",
            "note": e.note,
        } for e in run_events(db, run.id)]), hide_index=True, key=f"runs.events.{run.id}")


run = get_run(db, run_id)
started_live = not is_finished(run.status)


@st.fragment(run_every=LIVE_REFRESH_S if started_live else None)
def run_view() -> None:
    current = get_run(db, run_id)
    if started_live and is_finished(current.status):
        st.rerun()  # the whole page: it draws the finished view, without the timer
    _header(current)
    if not is_finished(current.status):
        if st.button("Cancel this run", key=f"runs.cancel.{current.id}"):
            try:
                cancel_run(db, current.id)
            except MpipeError as error:
                st.error(error.message)
            else:
                st.rerun()
        _live(current)
    elif timing_count(db, current.id):
        tab_cmp, tab_all = st.tabs(["Measured vs predicted", "Measured, all steps"])
        with tab_cmp:
            _comparison(current)
        with tab_all:
            _live(current, live_limit=None)
    else:
        st.info(f"The run ended {current.status} without recording timings.")
    _details(current)


run_view()
