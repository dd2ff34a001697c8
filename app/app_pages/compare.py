"""Compare: several schedules (typed terms or saved versions) and several runs,
each group on one aligned time axis, with a metrics table."""
import pandas as pd
import streamlit as st

from app import data_view, state, widgets
from app.bars import from_records
from app.database import database_or_stop
from app.evaluation import (Stopped, evaluate, evaluate_version, evaluation_bars, evaluation_dies, parallel_degrees,
                            version_label)
from app.figures import OVER_COLOUR, OVER_MARK, stacked_gantts
from app.formatting import FITS_WORD, device_count, devices_total, fmt, over_text, pct, plain
from app.step_headline import device_text, step_columns
from mpipe_core.errors import MpipeError
from mpipe_core.simulation.metrics import memory_fit
from storage import history, list_runs, list_schedules

TERMS = "cmp.terms"
MAX_VERSIONS = 400

st.title("Compare")
st.caption("Simulated schedules share one time axis (in their workload's time unit); measured runs "
           "share another (milliseconds).")
db = database_or_stop()
state.kept(TERMS, "1f1b(p=4, m=4)\ntranspose(1f1b(p=4, m=4))\ntranspose(1f1b(p=4, m=4), mode=dynamic, shards=4)")

left, right = st.columns([3, 2], gap="large")
with right:
    workload = widgets.workload_picker(db)
with left:
    st.text_area("Terms (one per line), on the workload at the right", key=TERMS, height=120)
    state.remember(TERMS)
    refs = []
    for s in list_schedules(db):
        refs += [v.ref for v in reversed(history(db, s.name))]
        if len(refs) >= MAX_VERSIONS:
            break
    picked = st.multiselect("Saved versions (each on the workload it was saved with)", refs, key="cmp.versions")
    runs = [r for r in list_runs(db, limit=200) if r.status in ("succeeded", "failed", "cancelled", "lost")]
    by_id = {r.id: r for r in runs}
    picked_runs = st.multiselect("Runs (measured)", list(by_id), key="cmp.runs",
                                 format_func=lambda i: f"#{i} {by_id[i].ref} ({by_id[i].status})")

# --- schedules -----------------------------------------------------------------------------
items = []  # (label, evaluation, workload label, the workload's tp, cp and dp)
errors = False
if workload is not None:
    for i, line in enumerate(st.session_state[TERMS].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append((line.strip(), evaluate(line, workload), workload.label, workload.degrees))
        except Stopped as stopped:
            widgets.stopped_notice(str(stopped), workload, f"cmp.{i}")
            errors = True
        except MpipeError as error:
            widgets.show_error(error, line, f"Term on line {i}")
            errors = True
if picked:
    from storage import get_version

    for ref in picked:
        try:
            version = get_version(db, ref)
            items.append((ref, evaluate_version(version), version_label(version),
                          parallel_degrees(version.workload)))
        except Stopped as stopped:
            st.warning(plain(f"{ref}: you stopped evaluating {stopped}."))
        except MpipeError as error:
            widgets.show_error(error, what=ref)


def _styled(table: pd.DataFrame):
    """"no" in the fits column in red."""
    if "fits" not in table:
        return table
    return table.style.map(lambda v: f"color: {OVER_COLOUR}; font-weight: bold" if v == FITS_WORD[False] else "",
                           subset=["fits"])


if items:
    st.subheader(f"Schedules ({len(items)})")
    first = items[0][1].summary()["makespan"]
    units = {ev.units[0] for _, ev, _, _ in items}
    if len(units) > 1:
        st.warning("These schedules' workloads use different time units ("
                   + ", ".join(sorted(u or "unitless" for u in units)) + "): their bars share an axis "
                   "but not a scale.")
    workloads = list(dict.fromkeys(wl_label for _, _, wl_label, _ in items))
    # One workload: every row against one bound, the lowest of the rows' own, as `mpipe compare`
    # does (a row's own bound would make a slower layout look more efficient); several: their own.
    shared = min(((ev.summary()["lower_bound"], label) for label, ev, _, _ in items), key=lambda b: b[0]) \
        if len(workloads) == 1 else None
    times, memories, totals = [], [], []
    overs = []  # per schedule: device -> how far over the device's memory
    for label, ev, wl_label, degrees in items:
        s = ev.summary()
        tu, mu = ev.units
        fit = memory_fit(s["peak_memory"], s["capacity"])
        overs.append(dict(fit.over) if fit is not None else {})
        totals.append(devices_total(s["devices"], degrees))
        # Two tables that each fit the page's width: time, then memory.
        step = step_columns(s) or ({"step time": "–", "MFU": "–"} if any(
            step_columns(e.summary()) for _, e, _, _ in items) else {})
        times.append({"schedule": label, **step, "makespan": fmt(s["makespan"], tu),
                      "speedup vs first": f"{first / s['makespan']:.3g}x" if s["makespan"] else "–",
                      "bubble": pct(s["bubble_ratio"]),
                      "efficiency": pct(s["efficiency"] if shared is None else
                                        (shared[0] / s["makespan"] if s["makespan"] else 1.0)),
                      "lower bound": fmt(s["lower_bound"], tu), "devices": device_count(s["devices"], degrees, evaluation_dies(ev)),
                      "ops": s["ops"], **({"workload": wl_label} if len(workloads) > 1 else {})})
        memories.append({"schedule": label, "peak memory": fmt(max(s["peak_memory"]), mu),
                         "fits": FITS_WORD[fit.fits if fit is not None else None],
                         "headroom": fmt(fit.least_headroom, mu) if fit is not None else "–",
                         "static memory": fmt(max(s["static_memory"], default=0.0), mu),
                         "device memory": fmt(s["capacity"], mu) if s["capacity"] is not None else "unknown",
                         "over the device's memory": over_text(overs[-1], len(s["peak_memory"]), mu, listed=1)})
    st.dataframe(pd.DataFrame(times), hide_index=True, key="cmp.table", width="stretch")
    canonical = [f"{label} is {ev.term}" for label, ev, _, _ in items if ev.term != label]
    bound_text = ("each schedule's own lower bound / its makespan (their workloads differ)" if shared is None else
                  f"the lowest of the schedules' own lower bounds ({fmt(shared[0], items[0][1].units[0])}, "
                  f"{shared[1]}'s) / each makespan, one bound for every row, as `mpipe compare`")
    st.caption(plain(f"Efficiency: {bound_text}; devices: in all (tp × pp × dp where the workload states them)."
                     + (f" On {workloads[0]}." if len(workloads) == 1 else "")
                     + (f" Canonical forms: {'; '.join(canonical)}." if canonical else "")))
    # What the step times rest on: each distinct device source once.
    for text in dict.fromkeys(t for t in (device_text(ev.summary()) for _, ev, _, _ in items) if t is not None):
        st.caption(plain(f"Device: {text}"))
    st.dataframe(_styled(pd.DataFrame(memories)), hide_index=True, key="cmp.memory", width="stretch")
    st.caption("Peak memory: static (parameters, gradients, optimizer state) + activations, on the device whose "
               "sum is highest; static memory likewise; headroom: the device's memory − that peak. Devices over "
               f"their memory are marked {OVER_MARK} in red on the charts below.")
    counts = sorted(set(totals))
    if len(counts) > 1:
        st.info(plain(f"These schedules run on different device counts ({', '.join(f'{n:,}' for n in counts)}): "
                      f"“speedup vs first” compares makespans only, so a schedule with more devices may look "
                      f"faster for using more hardware; compare at equal device counts for a fair speedup."))
    fig, notices = stacked_gantts([(label, evaluation_bars(ev)) for label, ev, _, _ in items], over=overs,
                                  memory_units=[ev.units[1] for _, ev, _, _ in items])
    for notice in notices:
        st.warning(plain(notice))
    st.plotly_chart(fig, key="cmp.gantt", config={"displaylogo": False})
    typed = [label for label, _, wl_label, _ in items if workload is not None and wl_label == workload.label]
    if typed and data_view.has_data(workload):  # the data view of one typed term, on the workload at the right
        data_term = st.selectbox("Term of the data view", typed, key="cmp.data_term")
        data_view.section(data_term, workload, "cmp")
elif not errors:
    st.info("Add terms or pick saved versions to compare.")

# --- runs ----------------------------------------------------------------------------------
if picked_runs:
    from executor.analysis.compare_run import LAUNCHED, compare_run

    st.subheader(f"Runs ({len(picked_runs)})")
    panels, rows = [], []
    for run_id in picked_runs:
        run = by_id[run_id]
        try:
            cmp = compare_run(db, run_id, workload=LAUNCHED)
        except MpipeError as error:
            widgets.show_error(error, what=f"run #{run_id}")
            continue
        idle = sum(d.measured_idle_ms for d in cmp.devices)
        steps = ", ".join(map(str, cmp.steps))
        drawn = cmp.measured_timeline[0].step if cmp.measured_timeline else None
        drawn_span = max((r.end for r in cmp.measured_timeline), default=0.0)
        rows.append({"run": f"#{run_id}", "schedule": run.ref, "term": cmp.term,
                     "backend": f"{run.backend} × {run.nproc}",
                     "measured makespan (mean of steps)": f"{fmt(cmp.measured_ms, 'ms')} (steps {steps})",
                     "the chart's step": f"step {drawn}: {fmt(drawn_span, 'ms')}" if drawn is not None else "–",
                     "bubble": pct(idle / (len(cmp.devices) * cmp.measured_ms))
                     if cmp.measured_ms and cmp.devices else "–",
                     "predicted": fmt(cmp.other_ms, "ms"), "prediction error": f"{cmp.error:+.1%}",
                     "predicted on": cmp.workload})
        panels.append((f"run #{run_id} {run.ref} (measured, step {drawn if drawn is not None else '–'})",
                       from_records(cmp.measured_timeline, run.nproc)))
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, key="cmp.runs_table", width="stretch")
        st.caption("Predicted: the run's own term simulated on the workload it was launched with (a "
                   "prediction, not a fit). The makespan and bubble are means over the steps after the "
                   "warm-up; the chart draws the one step whose makespan is closest to that mean, named in "
                   "“the chart's step”.")
        fig, notices = stacked_gantts(panels)
        for notice in notices:
            st.warning(plain(notice))
        st.plotly_chart(fig, key="cmp.runs_gantt", config={"displaylogo": False})
