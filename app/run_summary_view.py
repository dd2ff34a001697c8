"""The Runs page's parts for an imported Ascend run: its step summary (the slow
card among the job's ranks: `executor.analysis.stragglers`, drawn by
`straggler_figure.straggler_heatmap`) and its communication rows (the HCCL
lanes' `hcom_` events over one step's ops).  The page calls `section(db, run)`
for a finished run; nothing is drawn for a run that has neither."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from executor.analysis.stragglers import THRESHOLD, find_stragglers
from mpipe_core.formats.step_summary import stage_max
from storage.step_figures import comm_for, has_step_figures, step_figures_for

from .bars import from_records
from .figures import gantt_figure
from .formatting import plain
from .straggler_figure import comm_traces, straggler_heatmap


def has_parts(db, run) -> bool:
    """Whether the run has a step summary or communication rows to show."""
    return has_step_figures(db, run.id) or bool(comm_for(db, run.id))


def section(db, run) -> None:
    if has_step_figures(db, run.id):
        stragglers(db, run)
        against_prediction(db, run)
    comm = comm_for(db, run.id)
    if comm:
        communication(db, run, comm)


def stragglers(db, run) -> None:
    st.subheader("Step summary: the slow card")
    rows = step_figures_for(db, run.id)
    threshold = st.number_input(
        "Flag ranks this far from their stage's median (%)", min_value=0.1, max_value=100.0,
        value=THRESHOLD * 100, step=0.5, key=f"runs.stragglers.threshold.{run.id}",
        help="msprof-analyze's guidance calls a rank more than 5% off the others a slow card") / 100.0
    report = find_stragglers(rows, threshold)
    st.caption(plain(
        f"{len(report.ranks)} ranks, steps {', '.join(map(str, report.steps[:12]))}"
        f"{' ...' if len(report.steps) > 12 else ''}. Busy time = computing + communication other than receives "
        f"(step_trace_time's Computing + Communication(Not Overlapped and Exclude Receive)): the work a card did "
        f"itself; a fast card waits for a slow one in its bubble. Each rank is compared with the median of its "
        f"pipeline stage (PP Index), since stages do different work."))
    st.plotly_chart(straggler_heatmap(report), key=f"runs.stragglers.heatmap.{run.id}",
                    config={"displaylogo": False})
    flagged = report.flagged
    if flagged:
        st.dataframe(pd.DataFrame([{
            "rank": r.rank, "dp": r.dp, "pp": r.pp, "tp": r.tp, "flag": r.flag, "busy (ms)": round(r.busy_ms, 3),
            "stage median (ms)": round(r.stage_median_ms, 3), "vs stage": f"{r.vs_stage:+.1%}",
            "vs job": f"{r.vs_job:+.1%}"} for r in flagged]), hide_index=True,
            key=f"runs.stragglers.table.{run.id}", width="stretch")
    else:
        st.success(plain(f"No rank is more than {threshold:.1%} from its stage's median busy time."))
    stages = stage_max(rows)
    if len({pp for pp, _ in stages}) > 1:
        st.caption("Per pipeline stage and step, the maximum over its ranks (msprof-analyze's stage rows, "
                   "recomputed from the rank rows), ms")
        st.dataframe(pd.DataFrame([{
            "pp": pp, "step": step, "computing": round(m.computing * 1e3, 3),
            "communication not overlapped": round(m.comm_not_overlapped * 1e3, 3), "free": round(m.free * 1e3, 3),
            "bubble": round(m.bubble * 1e3, 3)} for (pp, step), m in stages.items()]), hide_index=True,
            key=f"runs.stragglers.stages.{run.id}", width="stretch", height=250 if len(stages) > 6 else "auto")


def against_prediction(db, run) -> None:
    """Each rank's measured busy and idle time beside its stage's prediction (the run's own term and
    workload), with the verdict `mpipe compare-run` prints."""
    from executor.analysis.summary_compare import compare_summary
    from mpipe_core.errors import MpipeError

    st.subheader("Step summary against the prediction")
    try:
        cmp = compare_summary(db, run.id)
    except MpipeError as error:
        st.error(plain(error.message))
        return
    st.caption(plain(
        f"Against {cmp.term} on {cmp.workload}"
        + ("" if cmp.prediction_unit else " (no time unit: its costs read as ms)")
        + f". Verdict: the rank's idle share (bubble + free) / step against its stage's predicted idle share, "
          f"within {cmp.tolerance:.0%} points. mpipe compare-run {run.id} --against TERM -w WORKLOAD sets it "
          f"against another term or workload."))
    st.dataframe(pd.DataFrame([{
        "rank": r.rank, "dp/pp/tp": f"{'–' if r.dp is None else r.dp}/{r.stage}/{'–' if r.tp is None else r.tp}",
        "step (ms)": round(r.step_ms, 3), "busy (ms)": round(r.busy_ms, 3), "bubble (ms)": round(r.bubble_ms, 3),
        "free (ms)": round(r.free_ms, 3), "idle": f"{r.idle_share:.1%}", "predicted busy": round(r.predicted_busy_ms, 3),
        "predicted idle": round(r.predicted_idle_ms, 3), "predicted idle share": f"{r.predicted_idle_share:.1%}",
        "verdict": r.verdict} for r in cmp.ranks]), hide_index=True, key=f"runs.summary.verdicts.{run.id}",
        width="stretch", height=320 if len(cmp.ranks) > 8 else "auto")


def communication(db, run, comm) -> None:
    from storage import timings_for

    st.subheader("Communication (HCCL lanes)")
    steps = sorted({c.step for c in comm})
    step = st.selectbox("Step", steps, key=f"runs.comm.step.{run.id}") if len(steps) > 1 else steps[0]
    mine = [c for c in comm if c.step == step]
    ops = [r for r in timings_for(db, run.id) if r.step == step]
    origin = min([c.start for c in mine] + [r.start for r in ops])
    bars = from_records(ops, run.nproc, scale=1000.0, origin=origin)
    fig, notice = gantt_figure(bars, title=f"Step {step}: ops and their ranks' communication (ms)")
    fig.add_traces(comm_traces(mine, origin))
    counts: dict[str, int] = {}
    for c in mine:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    st.caption(plain("Each hcom_ event of a rank's HCCL lane is a strip along the rank's lower edge: "
                     + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + " in this step."))
    if notice:
        st.caption(plain(notice))
    st.plotly_chart(fig, key=f"runs.comm.chart.{run.id}", config={"displaylogo": False})
