"""Designer: write (or build) a term, pick a workload, see its Gantt chart,
metrics, idle time and memory; export it; share it as a link; save it to
the library.  The term, workload and view live in the URL (`app.design_link`)."""
import streamlit as st

from app import auth, data_view, design_link, state, suggestions, widgets
from app.builder import guided_builder
from app.database import database_or_none
from app.evaluation import Stopped, evaluate, evaluation_bars, evaluation_comm
from app.figures import MEMORY_CURVES_MAX, OVER_MARK, gantt_figure, idle_figure, memory_figure, over_capacity
from app.formatting import axis_unit, fmt, plain
from app.step_headline import step_cards
from mpipe_core.errors import MpipeError
from storage.library import saved_workload_name

st.title("Schedule designer")
db = database_or_none("designing still works, saving does not")

state.kept(state.DESIGNER_TERM, state.DEFAULT_TERM)

LINK_SEEN = "_designer.link_seen"  # the query last applied or written: not applied again
_params = {k: st.query_params[k] for k in design_link.KEYS if k in st.query_params}
link = None
if _params and st.session_state.get(LINK_SEEN) != _params:
    st.session_state[LINK_SEEN] = _params
    try:
        link = design_link.read(_params)
    except MpipeError as error:
        widgets.show_error(error, what="The link")
    else:
        state.open_link(link)  # before the widgets are drawn, so they show it


NO_EXAMPLE = "(choose an example)"


def pick_example() -> None:
    name = st.session_state["designer.example"]
    if name in widgets.EXAMPLES:
        state.set_designer_term(widgets.EXAMPLES[name])


left, right = st.columns([3, 2], gap="large")
with right:
    workload = widgets.workload_picker(db)
with left:
    # Only the examples that evaluate on this workload (a transpose needs encoders, ...).
    examples = [] if workload is None else [
        name for name, term in widgets.EXAMPLES.items() if suggestions.valid(term, workload)]
    if st.session_state.get("designer.example", NO_EXAMPLE) not in examples:
        st.session_state["designer.example"] = NO_EXAMPLE
    st.selectbox("Examples", [NO_EXAMPLE, *examples], key="designer.example", on_change=pick_example)
    if workload is not None and len(examples) < len(widgets.EXAMPLES):
        st.caption(plain(f"{len(widgets.EXAMPLES) - len(examples)} of the {len(widgets.EXAMPLES)} examples do not "
                         f"evaluate on {workload.label} and are not offered."))
    st.text_area("Term", key=state.DESIGNER_TERM, height=110,
                 help="e.g. transpose(1f1b(p=4, m=8), mode=dynamic). Ctrl+Enter applies. "
                      "The guided builder below lists every generator and combinator.")
    state.remember(state.DESIGNER_TERM)
    # Drawn only when asked for: its dozens of widgets would slow every first paint.
    if st.toggle("Guided builder", key="designer.builder"):
        with st.container(border=True):
            guided_builder(state.set_designer_term)

text = state.designer_term()
if workload is None:
    st.stop()
if link is not None and link.source == "Saved" and not design_link.shows_link(link, workload.save_as):
    st.warning(plain(f"The link's workload saved:{link.value} is not in this library: showing "
                     f"{workload.label} instead."))


def write_link(memory_device: int | None = None) -> dict[str, str]:
    """The design into the URL (a reload, or the link copied, shows it again)."""
    params = design_link.query(text, design_link.workload_param(workload.save_as, workload.document),
                               memory_device)
    if {k: st.query_params.get(k) for k in design_link.KEYS if k in st.query_params} != params:
        st.query_params.from_dict(params)
    st.session_state[LINK_SEEN] = params
    return params


write_link(st.session_state.get(state.MEMORY_DEVICE))
if not text.strip():
    st.info("Write a term above, pick an example, or use the guided builder.")
    st.stop()
try:
    ev = evaluate(text, workload)
except Stopped as stopped:
    widgets.stopped_notice(str(stopped), workload, "designer")
    st.stop()
except MpipeError as error:
    widgets.show_error(error, text, "Term")
    st.stop()

summary = ev.summary()
time_unit, memory_unit = ev.units
# One click between the transposed schedule and its fused baseline.
# Each is offered only once it evaluates on this workload (`app.suggestions`).
actions = st.columns([2, 2, 1])
if ev.ast.name == "transpose":
    inner = str(ev.ast.kw("term"))
    if suggestions.valid(inner, workload):
        actions[0].button(f"Show the fused baseline: {inner}", on_click=state.set_designer_term, args=(inner,),
                          key="designer.baseline")
elif workload.has_encoders and not suggestions.is_transposed(ev.term):  # never "transpose it" twice
    wrapped = suggestions.transposed(ev.term)
    why_not = suggestions.refusal(wrapped, workload)
    if why_not is None:
        actions[0].button(f"Transpose it: {wrapped}", on_click=state.set_designer_term, args=(wrapped,),
                          key="designer.transpose")
    else:
        # balanced(...) folds the encoders into the chain (under recompute too): its body is what can be
        # transposed.
        body = suggestions.unfolded(ev.ast) if "balanced(" in ev.term else None
        instead = suggestions.transposed(str(body)) if body is not None else None
        if instead is not None and suggestions.valid(instead, workload):
            actions[0].button(f"Transpose its body instead: {instead}", on_click=state.set_designer_term,
                              args=(instead,), key="designer.transpose_body")
        actions[0].caption(plain(f"{wrapped} is not offered: {why_not}"))
if suggestions.before_after_pair(ev.term, workload, state.comparison_baseline(workload.document)) is not None:
    actions[1].page_link("app_pages/before_after.py", label="Before / after transpose side by side",
                         icon=":material/compare_arrows:")
if ev.term != text.strip():
    st.caption(plain(f"Canonical form: {ev.term}"))

step_cards(summary, workload.degrees, workload.dies_per_npu)  # step time and MFU first, when the workload has a step model
widgets.metric_cards(summary, time_unit, memory_unit, workload.degrees)

bars = evaluation_bars(ev)
over = over_capacity(summary["peak_memory"], summary["capacity"])  # device -> how far over its memory
fig, notice = gantt_figure(bars, title=f"{ev.term} on {workload.label}", over=over, memory_unit=memory_unit,
                           comm=evaluation_comm(ev))
if notice:
    st.warning(plain(notice))
st.plotly_chart(fig, key="designer.gantt", config={"displaylogo": False})
if evaluation_comm(ev):
    st.caption("Communication as priced: a strip along an op's lower edge is the collectives inside it (tp, "
               "cp, the pipeline exchange's all-gather), one along its upper edge a pipeline send that does "
               "not hold the device; after the pipeline, each device's exposed gradient sync and optimizer "
               "step, the last of which ends at the step time. Hover for bytes and link class.")

c1, c2 = st.columns(2)
with c1:
    st.plotly_chart(idle_figure(summary["busy"], summary["idle"], axis_unit(time_unit)), key="designer.idle")
with c2:
    memory_device = None
    if summary["devices"] > MEMORY_CURVES_MAX:
        # Too many curves make a band: the peaks as bars, and the curve of the device picked here.
        peaks = summary["peak_memory"]  # each device's peak (static + activations), as the cards show
        device_key = state.kept(state.MEMORY_DEVICE, max(range(len(peaks)), key=peaks.__getitem__))
        if not 0 <= int(st.session_state[device_key]) < len(peaks):
            state.set_kept(device_key, max(range(len(peaks)), key=peaks.__getitem__))
        memory_device = st.selectbox(
            "Memory curve of device", range(len(peaks)), key=device_key,
            format_func=lambda d: f"dev {d} (peak {fmt(peaks[d], memory_unit)}"
                                  + (f", {OVER_MARK} over by {fmt(over[d], memory_unit)})" if d in over else ")"))
        state.remember(device_key)
    st.plotly_chart(memory_figure(ev.memory_over_time, axis_unit(time_unit), memory_unit, device=memory_device,
                                  static=summary["static_memory"], capacity=summary["capacity"]),
                    key="designer.memory")
params = write_link(memory_device)
data_view.section(ev.term, workload, "designer")  # a workload with a data section: batch by batch

st.subheader("Share")
share_url = design_link.url(st.context.url or "", params) if st.context.url else None
widgets.copy_link_button("designer.copy_link")
st.caption("The link holds the term, the workload and the view: whoever opens it sees this chart"
           + (" (a saved workload must be in the library their app uses)."
              if saved_workload_name(workload.save_as) is not None else "."))
if share_url:
    with st.expander("The link"):
        st.code(share_url, language=None, wrap_lines=True)

st.subheader("Export")
widgets.schedule_downloads(ev, "schedule", "designer")

st.subheader("Save to the library")
if db is None:
    st.info("No database: saving is unavailable.")
elif not auth.may("save"):
    st.caption(plain(auth.needs("save", "Saving to the library")))
else:
    from storage import save_schedule

    # Plain widgets and a button, not a form: Enter in a field must not save.
    cols = st.columns([2, 1])
    name = cols[0].text_input("Name", key="designer.save_name", placeholder="e.g. vit-transpose-p4")
    update = cols[1].checkbox("New version of an existing schedule", key="designer.save_update")
    description = st.text_input("Description (of the schedule, shown in the library)",
                                key="designer.save_description")
    message = st.text_input("What this version is / changes", key="designer.save_message")
    if summary.get("fits") is False:  # said before the click: the library keeps it, marked "no" under fits
        from mpipe_core.simulation.metrics import memory_fit

        fit = memory_fit(summary["peak_memory"], summary["capacity"])
        st.warning(plain(f"{ev.term} {fit.text(memory_unit)}. You can still save it: the library shows it with "
                         f"fits “no”."))
    cols = st.columns(2)
    tags = cols[0].text_input("Tags (comma separated)", key="designer.save_tags")
    # A signed-in user is always the author of what they save; the local user may name another.
    author = "" if auth.actor().signed_in else cols[1].text_input("Author (default: your login)",
                                                                   key="designer.save_author")
    if widgets.write_button("Save", "save", type="primary", key="designer.save", target=name.strip() or "(no name)",
                            schedule=name.strip() or None):
        try:
            version = save_schedule(
                db, name.strip(), text, workload=workload.save_as, message=message,
                description=description.strip() or None, author=author.strip() or None,
                tags=[t.strip() for t in tags.split(",") if t.strip()], update=update)
        except MpipeError as error:
            widgets.show_error(error)
        else:
            st.success(plain(f"Saved {version.ref}: {version.term}"
                             + ("; it does not fit the device's memory" if summary.get("fits") is False else "")))
    st.page_link("app_pages/library.py", label="Open the library", icon=":material/menu_book:")
