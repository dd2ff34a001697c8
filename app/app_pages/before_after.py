"""Before / after: two terms on one workload, one shared time axis, the deltas,
where the encoder ops moved, and the transpose verdict with its costs."""
import pandas as pd
import streamlit as st

from app import state, suggestions, widgets
from app.database import database_or_none
from app.evaluation import Stopped, compare, evaluate, evaluation_bars
from app.figures import stacked_gantts
from app.formatting import (FITS_WORD, device_count, device_parts, devices_total, fit_verdict, fmt, npus_text, pct,
                            percent, plain, signed)
from app.step_headline import device_text, step_text
from mpipe_core.algebra.combinators.partition import folded_encoder_layers
from mpipe_core.algebra.terms import parse
from mpipe_core.errors import MpipeError
from mpipe_core.workloads.units import seconds

BEFORE, AFTER = state.BEFORE, state.AFTER

st.title("Before / after")
st.caption("Two schedules of one workload on a shared time axis — by default the Designer's "
           "schedule with and without `transpose`.")


def _defaults(workload) -> tuple[str, str]:
    """From the Designer's term: its fused baseline and itself (or itself transposed),
    where that pair evaluates on `workload`; else the Designer's term on both sides."""
    term = state.designer_term()
    pair = suggestions.before_after_pair(term, workload, state.comparison_baseline(workload.document)) \
        if workload is not None else None
    return pair or (term, term)


def saving_rows(costs, unit: str) -> dict[str, list[str]]:
    """The verdict's arithmetic as rows whose signed values add up to the saving:
    the words say what a row is, the sign alone whether it adds or takes away."""
    names, values = ["idle time filled"], [signed(costs.idle_filled, unit)]
    for name, value in costs.work_added.items():
        names.append(f"work added: {name}" if value >= 0 else f"work removed: {name}")
        values.append(signed(-value, unit))
    names.append("= saved (baseline − transposed makespan)")
    values.append(signed(costs.saved, unit))
    return {"term": names, "per device": values}


db = database_or_none("saved workloads are not offered")

left, right = st.columns([3, 2], gap="large")
with right:
    workload = widgets.workload_picker(db)
# The defaults, and the button, only where the pair evaluates (`app.suggestions`).
before_default, after_default = _defaults(workload)
state.kept(BEFORE, before_default)
state.kept(AFTER, after_default)
with left:
    st.text_input("Before", key=BEFORE)
    st.text_input("After", key=AFTER)
    state.remember(BEFORE, AFTER)
    designer = state.designer_term()
    baseline = state.comparison_baseline(workload.document) if workload is not None else None
    pair = suggestions.before_after_pair(designer, workload, baseline) if workload is not None else None
    if pair is not None:
        st.button("Take both from the Designer's term", on_click=state.set_before_after, args=pair)
        if baseline is not None and pair[0] == baseline:
            st.caption(plain(f"Before is the plan's winner on this layout, {baseline}: what you would run."))
    elif workload is not None:
        st.caption(plain(f"The Designer's term {designer} has no transpose pair on {workload.label}: "
                         f"{suggestions.pair_refusal(designer, workload, baseline)}"))

if workload is None:
    st.stop()
texts = {"Before": st.session_state[BEFORE], "After": st.session_state[AFTER]}
try:
    for label, text in texts.items():
        try:
            evaluate(text, workload)
        except MpipeError as error:
            widgets.show_error(error, text, label)
            st.stop()
    rows = compare([texts["Before"], texts["After"]], workload)
except Stopped as stopped:
    widgets.stopped_notice(str(stopped), workload, "ba")
    st.stop()
before, after = rows[0].evaluation, rows[1].evaluation
sb, sa = before.summary(), after.summary()
tu, mu = after.units

d_make = sa["makespan"] - sb["makespan"]
fit_b, fit_a = (fit_verdict(ev.term, s["peak_memory"], s["capacity"], mu) for ev, s in ((before, sb), (after, sa)))
after_step, before_step = step_text(sa), step_text(sb)
if after_step and before_step:  # an analytic workload's step: its time and MFU first, against before
    cols = st.columns(4)
    d_step = sa["step_time_s"] - sb["step_time_s"]
    cols[0].metric("Step time after", after_step[0],
                   delta=f"{seconds(d_step, signed=True)} ({'+' if d_step > 0 else ''}"
                         f"{percent(d_step / sb['step_time_s'])})"
                   if sb["step_time_s"] else None, delta_color="inverse")
    cols[1].metric("MFU after", after_step[1], delta=f"{(sa['mfu'] - sb['mfu']) * 100:+.1f} pp")
    cols[2].metric("Step speedup", f"{sb['step_time_s'] / sa['step_time_s']:.3g}x" if sa["step_time_s"] else "–")
    npus = npus_text(devices_total(sa["devices"], workload.degrees), workload.dies_per_npu)
    cols[3].metric(f"Devices in all ({device_parts(sa['devices'], workload.degrees)}{'; ' + npus if npus else ''})",
                   f"{devices_total(sa['devices'], workload.degrees):,}")
    device = device_text(sa)  # what both step times rest on (one workload)
    if device is not None:
        st.caption(plain(f"Device: {device}"))
cols = st.columns(5)
cols[0].metric("Makespan after", fmt(sa["makespan"], tu),
               delta=f"{signed(d_make, tu)} ({'+' if d_make > 0 else ''}{percent(d_make / sb['makespan'])})"
               if sb["makespan"] else None, delta_color="inverse")
cols[1].metric("Speedup", f"{sb['makespan'] / sa['makespan']:.3g}x" if sa["makespan"] else "–")
cols[2].metric("Bubble ratio after", pct(sa["bubble_ratio"]),
               delta=f"{(sa['bubble_ratio'] - sb['bubble_ratio']) * 100:+.1f} pp", delta_color="inverse")
cols[3].metric("Efficiency after", pct(sa["efficiency"]),
               delta=f"{(sa['efficiency'] - sb['efficiency']) * 100:+.1f} pp")
cols[4].metric("Fits after", FITS_WORD[fit_a[0]], help="within the device's memory, on every device")
# A faster schedule that does not fit is no saving: say so next to the figures.
for side, (fits, text) in (("After", fit_a), ("Before", fit_b)):
    (st.error if fits is False else st.caption)(plain(f"{side}: {text}."))


def make_it_fit(side: str, term: str, document: dict, label: str) -> None:
    """The button's action: the suggestion's workload into the shared picker, its term on its side."""
    state.set_workload(document, label)
    terms = {BEFORE: st.session_state[BEFORE], AFTER: st.session_state[AFTER]}
    terms[side] = term
    state.set_before_after(terms[BEFORE], terms[AFTER])


# The transpose (else After) does not fit: the fastest way to make it fit, as one click.
over_side = next(((key, ev) for key, ev, (fits, _) in ((AFTER, after, fit_a), (BEFORE, before, fit_b))
                  if suggestions.is_transposed(ev.term) and fits is False), None)
if over_side is None and fit_a[0] is False and fit_b[0] is False:
    over_side = (AFTER, after)
if over_side is not None:
    side_key, side_ev = over_side
    try:
        fix = suggestions.fit_suggestion(side_ev.term, workload)
        too_big = False
    except suggestions.TooBig:
        fix, too_big = None, True
    if too_big:
        st.caption(plain(f"{side_ev.term} is too big to search here for a way to make it fit; mpipe plan searches "
                         f"recompute and the encoders' sharding at every layout."))
    elif fix is None:
        st.info(plain(f"No recompute of the encoders' ops or sharding of their state makes {side_ev.term} fit "
                      f"on {workload.label}."))
    else:
        changes = " and ".join(fix.changes) or "nothing"
        when = f"step time {seconds(fix.step_time_s)}" if fix.step_time_s is not None else \
            f"makespan {fmt(fix.makespan, tu)}"
        st.info(plain(f"To make {side_ev.term} fit: {changes}. {fix.term} needs {fmt(fix.peak_memory, mu)} of "
                      f"the device's {fmt(fix.capacity, mu)}, {when}."))
        with_doc = f" with {', '.join(fix.workload_changes)}" if fix.workload_changes else ""
        st.button(f"Make it fit: {fix.term}{with_doc} ({when})", key="ba.make_fit", on_click=make_it_fit,
                  args=(side_key, fix.term, fix.document, f"{workload.label}{with_doc}"))

bars_b, bars_a = evaluation_bars(before), evaluation_bars(after)
fig, notices = stacked_gantts([(f"before: {before.term}", bars_b), (f"after: {after.term}", bars_a)])
for notice in notices:
    st.warning(plain(notice))
st.plotly_chart(fig, key="ba.gantt", config={"displaylogo": False})

step_rows = bool(after_step and before_step)
table = pd.DataFrame({
    "": (["step time", "MFU"] if step_rows else []) + ["makespan", "bubble ratio", "efficiency", "lower bound",
                                                      "devices", "ops", "peak memory (max)"],
    **{side: (list(step_text(s)) if step_rows else [])
       + [fmt(s["makespan"], tu), pct(s["bubble_ratio"]), pct(s["efficiency"]), fmt(s["lower_bound"], tu),
          device_count(s["devices"], workload.degrees, workload.dies_per_npu), s["ops"], fmt(max(s["peak_memory"]), mu)]
       for side, s in (("before", sb), ("after", sa))},
})
left, right = st.columns(2, gap="large")
with left:
    st.subheader("Metrics")
    st.dataframe(table.astype(str), hide_index=True, key="ba.metrics", width="stretch")

with right:
    st.subheader("Where the encoder ops moved")
    st.caption("Encoder ops and their busy time per device.")
    enc_b, enc_a = ~bars_b.is_llm(), ~bars_a.is_llm()
    folded_b, folded_a = folded_encoder_layers(before.schedule), folded_encoder_layers(after.schedule)
    if not enc_b.any() and not enc_a.any() and folded_b is None and folded_a is None:
        st.info("Neither schedule has encoder ops (the workload has no encoder).")
    else:
        nb, tb = bars_b.per_device_summary(enc_b)
        na, ta = bars_a.per_device_summary(enc_a)
        devices = max(bars_b.devices, bars_a.devices)

        def col(values, n):
            return [values[d] if d < n else 0 for d in range(devices)]

        moved = pd.DataFrame({
            "device": [f"dev {d}" for d in range(devices)],
            "ops before": col(nb, bars_b.devices), "ops after": col(na, bars_a.devices),
            "time before": [fmt(x, tu) for x in col(tb, bars_b.devices)],
            "time after": [fmt(x, tu) for x in col(ta, bars_a.devices)],
        })
        if folded_b is not None or folded_a is not None:
            # balanced(...) folds the encoders' layers into the LLM chunks: no encoder op, but their work is there.
            moved.insert(1, "layers folded in before", col(folded_b or [0] * bars_b.devices, bars_b.devices))
            moved.insert(2, "layers folded in after", col(folded_a or [0] * bars_a.devices, bars_a.devices))
            st.caption("balanced(...) folds the encoders' layers into the first LLM chunks: they run inside "
                       "those chunks' ops, not as encoder ops.")
        st.dataframe(moved, hide_index=True, key="ba.moved", width="stretch")

st.subheader("Transpose verdict")
if all(r.transpose is None for r in rows):
    st.info("Neither term is `transpose(...)` on a workload with an encoder, so there is no verdict.")
for row in rows:
    if row.transpose is None:
        continue
    term, costs, s = row.evaluation.term, row.transpose, row.evaluation.summary()
    fits, fit_text = fit_verdict(term, s["peak_memory"], s["capacity"], row.evaluation.units[1])
    verdict = costs.verdict()
    if fits is False:
        # Over the device's memory: that comes first, and the saving is one it cannot have as it is.
        st.error(plain(fit_text) + "  \n" + plain(f"Were memory no limit: {verdict}"))
    else:
        (st.success if costs.saved > 1e-9 else st.warning if costs.saved < -1e-9 else st.info)(
            plain(fit_text) + "  \n" + plain(verdict))
    inner = str(parse(term).kw("term"))
    if inner != before.term:
        st.caption(plain(f"The verdict compares {term} with its own fused baseline {inner}."))
    st.markdown("**How the saving adds up** (per device: P × makespan = busy + idle)")
    st.dataframe(pd.DataFrame(saving_rows(costs, tu)), hide_index=True, key=f"ba.arithmetic.{term}",
                 width="stretch")
    st.caption(f"For context: baseline makespan {fmt(costs.baseline_makespan, tu)}; encoder work moved off "
               f"the first stage's device {fmt(costs.moved_encoder_work, tu)}; longest broadcast "
               f"{fmt(costs.broadcast, tu)}; longest all-reduce {fmt(costs.allreduce, tu)}; cross-device "
               f"transfers {fmt(costs.transfers, tu)} (waiting on them is part of the idle time).")
