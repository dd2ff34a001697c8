"""Before / after: two terms on one workload, one shared time axis, the deltas,
where the encoder ops moved, and the transpose verdict with its costs."""
import pandas as pd
import streamlit as st

from app import views
from app.bars import from_timeline
from app.figures import stacked_gantts
from mpipe_core.errors import MpipeError
from mpipe_core.terms import parse

BEFORE, AFTER = "ba.before", "ba.after"

st.title("Before / after")
st.caption("Two schedules of one workload on a shared time axis — by default the Designer's "
           "schedule with and without `transpose`.")


def _defaults() -> tuple[str, str]:
    """From the Designer's term: its fused baseline and itself (or itself transposed)."""
    term = st.session_state.get("_kept.designer.term", views.DEFAULT_TERM)
    try:
        ast = parse(term)
    except MpipeError:
        return "1f1b(p=4, m=4)", views.DEFAULT_TERM
    if ast.name == "transpose":
        return str(ast.kw("term")), str(ast)
    return str(ast), f"transpose({ast}, mode=dynamic)"


before_default, after_default = _defaults()
views.kept(BEFORE, before_default)
views.kept(AFTER, after_default)


def from_designer() -> None:
    b, a = _defaults()
    views.set_kept(BEFORE, b)
    views.set_kept(AFTER, a)


try:
    db = views.database()
except MpipeError:
    db = None

left, right = st.columns([3, 2], gap="large")
with right:
    workload = views.workload_picker(db)
with left:
    st.text_input("Before", key=BEFORE)
    st.text_input("After", key=AFTER)
    views.remember(BEFORE, AFTER)
    st.button("Take both from the Designer's term", on_click=from_designer)

if workload is None:
    st.stop()
texts = {"Before": st.session_state[BEFORE], "After": st.session_state[AFTER]}
for label, text in texts.items():
    try:
        views.evaluate(text, workload)
    except MpipeError as error:
        views.show_error(error, text, label)
        st.stop()
rows = views.compare([texts["Before"], texts["After"]], workload)
before, after = rows[0].evaluation, rows[1].evaluation
sb, sa = before.summary(), after.summary()

d_make = sa["makespan"] - sb["makespan"]
cols = st.columns(4)
cols[0].metric("Makespan after", views.fmt(sa["makespan"]),
               delta=f"{d_make:+.4g} ({d_make / sb['makespan']:+.1%})" if sb["makespan"] else None,
               delta_color="inverse")
cols[1].metric("Speedup", f"{sb['makespan'] / sa['makespan']:.2f}x" if sa["makespan"] else "–")
cols[2].metric("Bubble ratio after", views.fmt(sa["bubble_ratio"], ".1%"),
               delta=f"{(sa['bubble_ratio'] - sb['bubble_ratio']) * 100:+.1f} pp", delta_color="inverse")
cols[3].metric("Efficiency after", views.fmt(sa["efficiency"], ".1%"),
               delta=f"{(sa['efficiency'] - sb['efficiency']) * 100:+.1f} pp")

bars_b, bars_a = from_timeline(before.timeline), from_timeline(after.timeline)
fig, notices = stacked_gantts([(f"before: {before.term}", bars_b), (f"after: {after.term}", bars_a)])
for notice in notices:
    st.warning(notice)
st.plotly_chart(fig, key="ba.gantt", config={"displaylogo": False})

table = pd.DataFrame({
    "": ["makespan", "bubble ratio", "efficiency", "lower bound", "devices", "ops", "peak memory (max)"],
    "before": [views.fmt(sb["makespan"]), views.fmt(sb["bubble_ratio"], ".1%"),
               views.fmt(sb["efficiency"], ".1%"), views.fmt(sb["lower_bound"]), sb["devices"], sb["ops"],
               views.fmt(max(sb["peak_memory"]))],
    "after": [views.fmt(sa["makespan"]), views.fmt(sa["bubble_ratio"], ".1%"),
              views.fmt(sa["efficiency"], ".1%"), views.fmt(sa["lower_bound"]), sa["devices"], sa["ops"],
              views.fmt(max(sa["peak_memory"]))],
})
left, right = st.columns(2, gap="large")
with left:
    st.subheader("Metrics")
    st.dataframe(table.astype(str), hide_index=True, key="ba.metrics")

with right:
    st.subheader("Where the encoder ops moved")
    st.caption("Encoder ops and their busy time per device.")
    enc_b, enc_a = ~bars_b.is_llm(), ~bars_a.is_llm()
    if not enc_b.any() and not enc_a.any():
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
            "time before": [views.fmt(x) for x in col(tb, bars_b.devices)],
            "time after": [views.fmt(x) for x in col(ta, bars_a.devices)],
        })
        st.dataframe(moved, hide_index=True, key="ba.moved")

st.subheader("Transpose verdict")
verdicts = [(r.evaluation.term, r.transpose) for r in rows if r.transpose is not None]
if not verdicts:
    st.info("Neither term is `transpose(...)` on a workload with an encoder, so there is no verdict.")
for term, costs in verdicts:
    verdict = costs.verdict()
    (st.success if costs.saved > 1e-9 else st.warning if costs.saved < -1e-9 else st.info)(verdict)
    inner = str(parse(term).kw("term"))
    if inner != before.term:
        st.caption(f"The verdict compares `{term}` with its own fused baseline `{inner}`.")
    st.dataframe(pd.DataFrame({
        "cost": ["baseline makespan", "encoder work moved into idle time", "parameter broadcast",
                 "recompute", "gradient all-reduce", "feature/input transfers", "total overhead",
                 "saved (baseline − transposed)"],
        "time": [views.fmt(x) for x in (costs.baseline_makespan, costs.moved_encoder_work, costs.broadcast,
                                        costs.recompute, costs.allreduce, costs.transfers, costs.overhead,
                                        costs.saved)],
    }), hide_index=True, key=f"ba.costs.{term}")
