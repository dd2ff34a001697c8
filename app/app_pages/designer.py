"""Designer: write (or build) a term, pick a workload, see its Gantt chart,
metrics, idle time and memory; save it to the library."""
import streamlit as st

from app import views
from app.bars import from_timeline
from app.builder import guided_builder
from app.figures import gantt_figure, idle_figure, memory_figure
from mpipe_core.errors import MpipeError
from mpipe_core.metrics import memory_over_time

TERM = "designer.term"

st.title("Schedule designer")
try:
    db = views.database()
except MpipeError as error:
    db = None
    st.warning(f"The library is not available ({error.message}); designing still works.")

views.kept(TERM, views.DEFAULT_TERM)


def use_term(text: str) -> None:
    views.set_kept(TERM, text)


def pick_example() -> None:
    name = st.session_state["designer.example"]
    if name in views.EXAMPLES:
        use_term(views.EXAMPLES[name])


left, right = st.columns([3, 2], gap="large")
with right:
    workload = views.workload_picker(db)
with left:
    st.selectbox("Examples", ["(choose an example)", *views.EXAMPLES], key="designer.example",
                 on_change=pick_example)
    st.text_area("Term", key=TERM, height=110,
                 help="e.g. transpose(1f1b(p=4, m=8), mode=dynamic). Ctrl+Enter applies. "
                      "`mpipe terms` (or the builder below) lists every generator and combinator.")
    views.remember(TERM)
    with st.expander("Guided builder"):
        guided_builder(use_term)

text = st.session_state[TERM]
if workload is None:
    st.stop()
if not text.strip():
    st.info("Write a term above, pick an example, or use the guided builder.")
    st.stop()
try:
    with st.spinner("Evaluating..."):
        ev = views.evaluate(text, workload)
except MpipeError as error:
    views.show_error(error, text, "Term")
    st.stop()

summary = ev.summary()
# One click between the transposed schedule and its fused baseline.
actions = st.columns([2, 2, 1])
if ev.ast.name == "transpose":
    inner = str(ev.ast.kw("term"))
    actions[0].button(f"Show the fused baseline: {inner}", on_click=use_term, args=(inner,),
                      key="designer.baseline")
elif workload.has_encoders:
    wrapped = f"transpose({ev.term}, mode=dynamic)"
    actions[0].button(f"Transpose it: {wrapped}", on_click=use_term, args=(wrapped,),
                      key="designer.transpose")
actions[1].page_link("app_pages/before_after.py", label="Before / after transpose side by side")
if ev.term != text.strip():
    st.caption(f"Canonical form: `{ev.term}`")

views.metric_cards(summary)

bars = from_timeline(ev.timeline)
fig, notice = gantt_figure(bars, title=f"{ev.term} on {workload.label}")
if notice:
    st.warning(notice)
st.plotly_chart(fig, key="designer.gantt", config={"displaylogo": False})

c1, c2 = st.columns(2)
with c1:
    st.plotly_chart(idle_figure(summary["busy"], summary["idle"]), key="designer.idle")
with c2:
    series = memory_over_time(ev.schedule, ev.workload, ev.timeline)
    st.plotly_chart(memory_figure(series), key="designer.memory")

st.subheader("Save to the library")
if db is None:
    st.info("No database: saving is unavailable.")
else:
    from storage import save_schedule

    with st.form("designer.save"):
        cols = st.columns([2, 1])
        name = cols[0].text_input("Name", key="designer.save_name", placeholder="e.g. vit-transpose-p4")
        update = cols[1].checkbox("New version of an existing schedule", key="designer.save_update")
        message = st.text_input("What this version is / changes", key="designer.save_message")
        cols = st.columns(2)
        tags = cols[0].text_input("Tags (comma separated)", key="designer.save_tags")
        author = cols[1].text_input("Author (default: your login)", key="designer.save_author")
        if st.form_submit_button("Save", type="primary"):
            try:
                version = save_schedule(
                    db, name.strip(), text, workload=workload.save_as, message=message,
                    author=author.strip() or None,
                    tags=[t.strip() for t in tags.split(",") if t.strip()], update=update)
            except MpipeError as error:
                st.error(error.message)
            else:
                st.success(f"Saved {version.ref}: {version.term}")
    st.page_link("app_pages/library.py", label="Open the library")
