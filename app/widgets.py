"""Widgets several pages draw: inline errors, write buttons a role may not use,
the workload picker, metric cards, downloads of a schedule, and the audit trail."""
from __future__ import annotations

import json

import streamlit as st

from mpipe_core.errors import MpipeError, TermError
from mpipe_core.workloads.inputs import MAX_NESTING, check_depth
from mpipe_core.workloads.labels import parallel_spec_text, workload_label
from mpipe_core.workloads.memory_model import (
    DISTRIBUTED_SHARDED_BYTES,
    DISTRIBUTED_SHARED_BYTES,
    MIXED_PRECISION_BYTES,
)

from . import auth, design_link, state
from .evaluation import APP_LIMIT_SETTING, WorkloadChoice, choice_for
from .formatting import device_parts, devices_total, fmt, pct, plain, when

EXAMPLES = {
    "transpose, dynamic (ViT in the bubbles)": "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)",
    "fused baseline (ViT on stage 0)": "1f1b(p=4, m=4)",
    "transpose, reference prefix mode": "transpose(1f1b(p=4, m=4))",
    "encoder on its own device": "encoder_stage(1f1b(p=4, m=4))",
    "ZB-H1 derived: defer_w(split_bw(1f1b))": "defer_w(split_bw(1f1b(p=4, m=8)))",
    "interleaved 1F1B, v=2": "interleaved(p=4, m=8, v=2)",
    "ZB-V": "zbv(p=4, m=8)",
    "Chimera-like: overlay(a, mirror(a))": "overlay(1f1b(p=4, m=4), mirror(1f1b(p=4, m=4)))",
    "two steps": "repeat(transpose(1f1b(p=4, m=4), mode=dynamic), n=2)",
}


# --- errors --------------------------------------------------------------------------------

def show_error(error: MpipeError, text: str | None = None, what: str = "") -> None:
    """An error inline: for a term, its line and column and a caret under the spot;
    an error with `reasons` (tune's "nothing fits": what rules out each family)
    lists them under its message, one line each, in view."""
    prefix = f"{what}: " if what else ""
    reasons = getattr(error, "reasons", None)
    if reasons:
        st.error(plain(f"{prefix}{ui_message(error.message)}") + "  \n"
                 + "  \n".join(f"• {plain(ui_message(r))}" for r in reasons))
    elif isinstance(error, TermError) and error.line is not None:
        st.error(plain(f"{prefix}line {error.line}, column {error.column}: {ui_message(error.detail)}"))
        if text is not None:
            lines = text.splitlines() or [""]
            if 1 <= error.line <= len(lines):
                line = lines[error.line - 1]
                st.code(f"{line}\n{' ' * max(0, (error.column or 1) - 1)}^", language=None)
    else:
        st.error(plain(f"{prefix}{ui_message(error.message)}"))


def show_problems(problems: list[str], what: str) -> None:
    """Several refusals at once, one line each (every bad input, not only the first)."""
    if len(problems) == 1:
        st.error(plain(ui_message(problems[0])))
        return
    st.error(f"{len(problems)} bad {what}s:  \n" + "  \n".join(f"• {plain(ui_message(p))}" for p in problems))


def stopped_notice(term: str, workload: WorkloadChoice, page_key: str) -> None:
    """What a page shows instead of a chart once the user stopped its evaluation."""
    st.warning(plain(f"You stopped evaluating {term}. Change the term or the workload, or evaluate it anyway."))
    st.button("Evaluate it anyway", key=f"{page_key}.resume", on_click=state.set_stopped_evaluation,
              args=(None,))


# --- writes --------------------------------------------------------------------------------

# Clicks refused while their button is hidden: (action, target, schedule, run_id).
_REFUSED_CLICKS = "_widgets.refused_clicks"


def _check_click(action: str, target: str, schedule: str | None, run_id: int | None) -> None:
    """A write button's callback: it runs when the click arrives, before the page is
    drawn again, with the role the user has then.  A click the role no longer allows
    (it changed since the button was drawn) is refused and recorded by the storage
    layer's authorization, and shown at the top of the page.

    One click can call this twice: on a loaded machine, with the Runs page's live
    fragment rerunning every second, one click after a demotion recorded two refusals
    0.87 s apart (Streamlit 1.67's rerun code replays a click's trigger when a fragment
    rerun preempts the run the click started).  A refused click's button is no longer drawn, so a
    second call for it before it is drawn again is such a replay: it is neither
    recorded nor shown again."""
    from storage import authorize

    from .database import database

    click = (action, target, schedule, run_id)
    refused = st.session_state.setdefault(_REFUSED_CLICKS, set())
    if click in refused:
        return
    try:
        authorize(database(), action, target, schedule=schedule, run_id=run_id)
    except MpipeError as error:  # refused (recorded), or the database is unavailable
        refused.add(click)
        auth.note_refusal(error.message)


def write_button(label: str, action: str, *, key: str, target: str, schedule: str | None = None,
                 run_id: int | None = None, where=None, **kwargs) -> bool:
    """A button (in `where`, a column or container; default the page) that writes
    (`action`, e.g. "launch", on `target`, of `schedule` or run `run_id` for the audit
    trail): not drawn for a role that may not do it; a click on it is checked again
    when it arrives."""
    if not auth.may(action):
        if auth.refusal_pending():
            st.rerun()  # a click refused in a fragment: the whole page shows the refusal
        return False
    # Drawn again: the next click on it is a new one.
    st.session_state.get(_REFUSED_CLICKS, set()).discard((action, target, schedule, run_id))
    return (where or st).button(label, key=key, on_click=_check_click, args=(action, target, schedule, run_id),
                                **kwargs)


def audit_table(entries, key: str, empty: str = "Nothing recorded yet.") -> None:
    """Audit entries (newest first) as a table of plain text."""
    if not entries:
        st.caption(empty)
        return
    import pandas as pd

    st.dataframe(pd.DataFrame([{
        "when": when(e.at), "who": e.actor, "role": e.role, "via": e.via,
        "action": e.action, "target": e.target, "outcome": e.outcome,
        "details": json.dumps(e.details, sort_keys=True),
    } for e in entries]), hide_index=True, key=key, width="stretch")


# --- workload picker -----------------------------------------------------------------------

def _json_error(error: json.JSONDecodeError) -> str:
    return f"line {error.lineno}, column {error.colno}: {error.msg}"


def workload_picker(db=None, *, key: str = state.WORKLOAD, parallel_open: bool = False) -> WorkloadChoice | None:
    """Preset, saved workload, or an explicit JSON document, with an analytic
    workload's parallel settings (`parallel_settings`, open when `parallel_open`);
    None (with the error shown inline) when the JSON is not a valid workload or
    the settings break a rule."""
    from mpipe_core.workloads.presets import PRESETS, preset_document

    source = st.radio("Workload", ["Preset", "Saved", "JSON"], horizontal=True,
                      key=state.kept(f"{key}.source", "Preset"),
                      help="A preset, a workload saved in the library, or your own JSON document")
    choice: WorkloadChoice | None = None
    if source == "Preset":
        name = st.selectbox("Preset", PRESETS, key=state.kept(f"{key}.preset", state.DEFAULT_PRESET))
        choice = choice_for(name, preset_document(name), name)
        with st.expander("Its document"):
            st.json(preset_document(name), expanded=True)
    elif source == "Saved":
        infos = []
        if db is not None:
            from storage import list_workloads, saved_workload_ref

            infos = list_workloads(db)
        if not infos:
            st.info("No saved workloads yet: write one under JSON and save it.")
        else:
            refs = [info.ref for info in infos]
            saved_key = state.kept(f"{key}.saved", refs[0])
            if st.session_state[saved_key] not in refs:
                # "NAME" alone (a link's saved:NAME) is NAME's latest version, as storage reads it.
                state.set_kept(saved_key, design_link.saved_ref(st.session_state[saved_key], refs) or refs[0])
            ref = st.selectbox("Saved workload", refs, key=saved_key)
            body = infos[refs.index(ref)].body
            choice = choice_for(saved_workload_ref(ref), body, saved_workload_ref(ref))
            with st.expander("Its document"):
                st.json(body, expanded=True)
    else:
        choice = _json_workload(db, key)
    if choice is not None:
        choice = parallel_settings(choice, key, expanded=parallel_open)
    if choice is not None:
        units = ", ".join(f"{what} in {unit}" for what, unit in (("time", choice.time_unit),
                                                                   ("memory", choice.memory_unit)) if unit)
        st.caption(f"Units: {units}" if units else
                   'Units: none declared (abstract units; add "units": {"time": "ms", "memory": "GB"})')
    state.remember(f"{key}.source", f"{key}.preset", f"{key}.saved", f"{key}.json")
    return choice


# An analytic document's `parallel` section: (key, label, help), in the order drawn.
PARALLEL_FIELDS = (
    ("tp", "Tensor parallel (tp)", "devices per stage splitting every layer (must divide the attention heads)"),
    ("cp", "Context parallel (cp)", "devices per stage splitting the sequence (must divide the sequence length)"),
    ("dp", "Data parallel (dp)", "replicas of the pipeline (the distributed optimizer shards over them)"),
    ("encoder_shard", "Encoder state sharded (encoder_shard)",
     "a trained encoder's state sharded over its copies: none; optimizer (ZeRO-1); gradients (ZeRO-2)"),
    ("sp", "Sequence parallel", "with tp: the activations outside attention and the MLP split tp ways too"),
    ("flash_attention", "Flash attention", "the attention scores are never stored"),
    ("distributed_optimizer", "Distributed optimizer",
     f"optimizer state sharded over dp: {DISTRIBUTED_SHARED_BYTES:g} + {DISTRIBUTED_SHARDED_BYTES:g}/dp bytes per "
     f"parameter instead of {MIXED_PRECISION_BYTES:g}"),
)


def parallel_settings(choice: WorkloadChoice, key: str, *, expanded: bool = False) -> WorkloadChoice | None:
    """An analytic workload's parallel section as widgets, starting from the
    document's own; the settings changed are applied by the core's
    `with_parallel` (the rule of the CLI's `--parallel`), and the choice is then
    the changed document, labelled with them.  None, with the error shown, when
    they break a rule (a tp that does not divide the heads).  Any other workload
    comes back as it is."""
    from mpipe_core.workloads.analytic import MAX_DEGREE, parallel_section
    from mpipe_core.workloads.memory_model import ENCODER_SHARDING
    from mpipe_core.workloads.workload import parse_workload, with_parallel

    doc = choice.body()
    if not isinstance(doc, dict) or "model" not in doc:
        return choice
    current = parallel_section(doc)  # checked when the choice was made
    keys = {name: f"{key}.parallel.{name}" for name, _, _ in PARALLEL_FIELDS}
    base = f"_{key}.parallel.of"  # the document the widgets started from
    if st.session_state.get(base) != choice.digest:  # another workload: its own settings
        for name, widget in keys.items():
            state.set_kept(widget, current[name])
        st.session_state[base] = choice.digest
    with st.expander("Parallel settings (tp, cp, dp, encoder sharding, sp, flash attention, distributed optimizer)",
                     expanded=expanded):
        cols = st.columns(3)
        for col, (name, label, tip) in zip(cols, PARALLEL_FIELDS[:3]):
            col.number_input(label, min_value=1, max_value=MAX_DEGREE, step=1, help=tip,
                             key=state.kept(keys[name], current[name]))
        name, label, tip = PARALLEL_FIELDS[3]
        st.selectbox(label, ENCODER_SHARDING, help=tip, key=state.kept(keys[name], current[name]))
        for name, label, tip in PARALLEL_FIELDS[4:]:  # one a line: a narrow column cuts labels side by side
            st.checkbox(label, help=tip, key=state.kept(keys[name], current[name]))
        state.remember(*keys.values())

    def value(name: str, widget: str):
        if isinstance(current[name], bool):
            return bool(st.session_state[widget])
        return int(st.session_state[widget]) if isinstance(current[name], int) else str(st.session_state[widget])

    values = {name: value(name, widget) for name, widget in keys.items()}
    changed = {name: value for name, value in values.items() if value != current[name]}
    if not changed:
        return choice
    try:
        changed_doc = with_parallel(parse_workload(doc, name=choice.label), changed).source
    except MpipeError as error:
        show_error(error, what="Parallel settings")
        return None
    # Named as the library and the CLI name it: the preset and the settings that differ ("internvl-26b tp=8,sp").
    label = workload_label(dict(changed_doc), fallback=f"{choice.label} with {parallel_spec_text(changed)}")
    return choice_for(label, dict(changed_doc), dict(changed_doc))


def _json_workload(db, key: str) -> WorkloadChoice | None:
    from mpipe_core.workloads.presets import PRESETS, preset_document

    text_key = state.kept(f"{key}.json", json.dumps(preset_document(state.DEFAULT_PRESET), indent=2))

    def load_preset() -> None:
        state.set_kept(text_key, json.dumps(preset_document(st.session_state[f"{key}.load"]), indent=2))

    cols = st.columns([3, 1])
    cols[0].selectbox("Start from preset", PRESETS, key=state.kept(f"{key}.load", state.DEFAULT_PRESET),
                      label_visibility="collapsed")
    state.remember(f"{key}.load")
    cols[1].button("Load", key=f"{key}.load_btn", on_click=load_preset,
                   help="Replace the editor's text with this preset's document")
    text = st.text_area("Workload JSON", key=text_key, height=260,
                        help="Explicit (llm/encoders/link/units) or analytic (model/device) form")
    try:
        doc = json.loads(text)
        check_depth(doc, "Workload JSON")
    except json.JSONDecodeError as error:
        st.error(plain(f"Workload JSON, {_json_error(error)}"))
        return None
    except RecursionError:
        st.error(plain(f"Workload JSON: nested deeper than Python's parser allows; the limit is {MAX_NESTING}"))
        return None
    except MpipeError as error:
        show_error(error)
        return None
    try:
        label = str(doc.get("name") or "inline") if isinstance(doc, dict) else "inline"
        # A preset's document changed here is "NAME (edited)" (or NAME with its parallel settings), not NAME;
        # one another page put here unedited keeps the name that page gave it.
        choice = choice_for(state.json_label(key, doc) or workload_label(doc, fallback=label), doc, doc)
    except MpipeError as error:
        show_error(error, what="Workload")
        return None
    if db is not None and auth.may("save-workload"):
        _save_workload_form(db, doc, key)
    return choice


def _save_workload_form(db, doc: dict, key: str) -> None:
    from storage import save_workload

    with st.popover("Save this workload to the library"):
        name = st.text_input("Name", key=f"{key}.save_name")
        update = st.checkbox("Add a version to an existing workload", key=f"{key}.save_update")
        message = st.text_input("Message", key=f"{key}.save_message")
        if write_button("Save workload", "save-workload", key=f"{key}.save_btn", target=f"workload {name}"):
            try:
                info = save_workload(db, name.strip(), doc, message=message, update=update)
            except MpipeError as error:
                show_error(error)
            else:
                st.success(plain(f"Saved workload {info.ref}"))


# --- messages ------------------------------------------------------------------------------

# Storage's refusals say what to do in words any front end can use; the app names its own control.
_UI_HINTS = {
    "--memory-cap none searches without a cap": "“no cap” searches without one",
    "update it to add a version": "tick “new version” to add a version to it",
    "--memory-cap": "the memory cap",
    "--devices and --microbatches": "devices and microbatches",
    # The CLI's op limit is not the one a browser request meets.
    "set MPIPE_MAX_OPS or pass a larger limit": APP_LIMIT_SETTING,
}


def ui_message(message: str) -> str:
    """A storage message with the page's own control named where it says what to do."""
    for words, ui in _UI_HINTS.items():
        message = message.replace(words, ui)
    return message


# --- metrics -------------------------------------------------------------------------------

PEAKS_LISTED = 8  # devices whose peak memory the caption names one by one


DEVICES_HELP = ("devices in all (tp × cp × pp × dp: each pipeline device is tp × cp devices, the pipeline is "
                "replicated dp times)")


def metric_cards(summary: dict, time_unit: str = "", memory_unit: str = "",
                 degrees: dict[str, int] | None = None) -> None:
    """The evaluation's figures as cards; the devices in all (`degrees`: the
    workload's tp, cp and dp: each pipeline device is tp x cp devices); peak memory per
    device as static + activations; against the device's capacity the least
    headroom, and in one line whether the schedule fits (in red when it does not)."""
    from mpipe_core.simulation.metrics import memory_fit

    from .figures import OVER_MARK

    peaks, static = summary["peak_memory"], summary.get("static_memory") or [0.0] * len(summary["peak_memory"])
    fit = memory_fit(peaks, summary.get("capacity"))
    from .step_headline import step_text

    step = step_text(summary) is not None  # the step's cards (`step_headline`) name the devices in all
    cols = st.columns(6 if fit is not None else 5)
    cols[0].metric("Makespan", fmt(summary["makespan"], time_unit), help="end of the last op")
    cols[1].metric("Bubble ratio", pct(summary["bubble_ratio"]),
                   help="sum of idle time / (devices × makespan)")
    cols[2].metric("Efficiency vs LB", pct(summary["efficiency"]),
                   help=f"lower bound {fmt(summary['lower_bound'], time_unit)} / makespan")
    cols[3].metric("Peak memory (max)", fmt(max(peaks) if peaks else None, memory_unit),
                   help="static (parameters, gradients, optimizer state) + peak activations, on the device "
                        "whose sum is highest")
    pipeline = summary["devices"]
    total = devices_total(pipeline, degrees)
    parts = "" if total == pipeline else f" ({device_parts(pipeline, degrees)})"
    if step:
        cols[4].metric("Ops", f"{summary['ops']:,}", help="the schedule's ops")
    else:
        cols[4].metric(f"Devices{parts} · ops", f"{total:,} · {summary['ops']:,}",
                       help=f"{DEVICES_HELP} · the schedule's ops" if parts else "devices · the schedule's ops")
    if fit is not None:
        cols[5].metric("Headroom (least)", fmt(fit.least_headroom, memory_unit),
                       help=f"the device's memory {fmt(fit.capacity, memory_unit)} − the highest peak "
                            f"(dev {fit.worst}); negative: over")

    def one(d: int) -> str:
        parts = f" ({fmt(static[d], memory_unit)} + {fmt(peaks[d] - static[d], memory_unit)})" if static[d] else ""
        mark = f" {OVER_MARK}" if fit is not None and d in fit.over else ""
        return f"dev {d} **{fmt(peaks[d], memory_unit)}**{parts}{mark}"

    shown = " · ".join(one(d) for d in range(min(len(peaks), PEAKS_LISTED)))
    if len(peaks) > PEAKS_LISTED:
        shown += f" · … ({len(peaks)} devices: lowest **{fmt(min(peaks), memory_unit)}**, the chart has each)"
    what = "static + activations" if any(static) else "activations"
    st.caption(f"Peak memory per device ({what}): {shown} — lower bound "
               f"**{fmt(summary['lower_bound'], time_unit)}**")
    if fit is None:
        st.caption("Device memory unknown: the workload states no capacity (`device.memory`), so whether it "
                   "fits is not checked.")
    else:
        verdict = fit.text(memory_unit)
        verdict = f"{verdict[0].upper()}{verdict[1:]}."
        if fit.fits:
            st.caption(plain(verdict))
        else:
            st.error(plain(verdict))


# --- sharing -------------------------------------------------------------------------------

_COPY_LINK = """<div>
<button id="{id}" type="button" style="border:1px solid #d0d7de;border-radius:8px;padding:0.35rem 0.9rem;
 background:#fff;cursor:pointer;font-size:0.95rem">Copy link</button>
<span id="{id}-done" style="margin-left:0.6rem;color:#1a7f37"></span>
<script>
(() => {{
  const button = document.getElementById("{id}"), done = document.getElementById("{id}-done");
  if (!button || button.dataset.ready) return;
  button.dataset.ready = "1";
  button.addEventListener("click", async () => {{
    const link = window.location.href;  // the page keeps the design in its query
    try {{ await navigator.clipboard.writeText(link); }}
    catch (error) {{  // no clipboard permission: the old way
      const area = document.createElement("textarea");
      area.value = link; document.body.appendChild(area); area.select();
      document.execCommand("copy"); area.remove();
    }}
    done.textContent = "Link copied";
  }});
}})();
</script></div>"""


def copy_link_button(key: str) -> None:
    """A "Copy link" button: puts the page's address (its query holds what is shown) on the clipboard."""
    element_id = "copy-" + "".join(c if c.isalnum() else "-" for c in key)
    st.html(_COPY_LINK.format(id=element_id), unsafe_allow_javascript=True)


# --- downloads -----------------------------------------------------------------------------

def schedule_downloads(ev, stem: str, key: str) -> None:
    """The schedule as torch's CSV, a Perfetto (Chrome trace) file, and JSON:
    the same text `mpipe export` writes.  A format that cannot express the
    schedule has its button disabled, with the CLI's own reason under it."""
    from mpipe_core.formats.export import FORMATS, refusal

    cols = st.columns(len(FORMATS))
    for col, (name, (label, suffix, mime)) in zip(cols, FORMATS.items()):
        reason = refusal(ev, name)
        # Built on click only: a page with a big schedule should not pay for three exports per rerun.
        col.download_button(f"Download {label}", lambda name=name: _export_or_error(ev, name),
                            file_name=f"{stem}.{suffix}", mime=mime, key=f"{key}.download.{name}",
                            disabled=reason is not None, help=reason and plain(reason),
                            on_click="ignore")  # a download needs no rerun of the page
        if reason is not None:
            col.caption(plain(f"{label}: {reason}"))


def _export_or_error(ev, name: str) -> str:
    """The export's text; should it fail anyway, a file that says why, as the CLI would
    (a download that raises gives the browser nothing at all)."""
    from mpipe_core.formats.export import export_text

    try:
        return export_text(ev, name)[0]
    except Exception as error:  # noqa: BLE001 - whatever it is, the user must see it
        return f"error: {getattr(error, 'message', None) or error}\n"
