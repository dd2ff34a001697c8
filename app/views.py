"""Widgets and small helpers several pages share: the database handle, kept
session state, the workload picker, inline errors, metric cards, cached
evaluation."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import streamlit as st

from mpipe_core.errors import MpipeError, TermError

# Refuse terms whose schedule would exceed this many ops (the core checks before building).
APP_MAX_OPS = 500_000
DEFAULT_TERM = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
DEFAULT_PRESET = "vit-heavy-small"
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


# --- database ------------------------------------------------------------------------------

@st.cache_resource(show_spinner=False)
def _open_database(url: str):
    from storage import open_database

    return open_database(url)


def database():
    """The shared database ($MPIPE_DB_URL, else the per-user SQLite file): one
    engine per server process."""
    from storage import resolve_db_url

    return _open_database(resolve_db_url())


def database_or_stop():
    """The database, or an inline error and the end of this page's run."""
    try:
        return database()
    except MpipeError as error:
        st.error(f"Cannot open the database: {error.message}")
        st.stop()


# --- state that survives switching pages ---------------------------------------------------

def kept(key: str, default: Any) -> str:
    """Give widget `key` its last value even after another page was shown
    (Streamlit drops the state of widgets a page did not draw).  Call before
    drawing the widget, and `remember(key)` after."""
    store = f"_kept.{key}"
    if store not in st.session_state:
        st.session_state[store] = default
    # Re-assigning turns a value left by another page's widget (which the new
    # widget would ignore) into one the widget drawn now starts from.
    value = st.session_state[key] if key in st.session_state else st.session_state[store]
    st.session_state[key] = value
    return key


def remember(*keys: str) -> None:
    for key in keys:
        if key in st.session_state:
            st.session_state[f"_kept.{key}"] = st.session_state[key]


def set_kept(key: str, value: Any) -> None:
    """Set a kept widget's value (from a callback, or before it is drawn)."""
    st.session_state[key] = value
    st.session_state[f"_kept.{key}"] = value


# --- errors --------------------------------------------------------------------------------

def show_error(error: MpipeError, text: str | None = None, what: str = "") -> None:
    """An error inline: for a term, its line and column and a caret under the spot."""
    prefix = f"{what}: " if what else ""
    if isinstance(error, TermError) and error.line is not None:
        st.error(f"{prefix}line {error.line}, column {error.column}: {error.detail}")
        if text is not None:
            lines = text.splitlines() or [""]
            if 1 <= error.line <= len(lines):
                line = lines[error.line - 1]
                st.code(f"{line}\n{' ' * max(0, (error.column or 1) - 1)}^", language=None)
    else:
        st.error(f"{prefix}{error.message}")


# --- evaluation ----------------------------------------------------------------------------

def _workload_arg(workload_key: str):
    return json.loads(workload_key[5:]) if workload_key.startswith("json:") else workload_key


@st.cache_resource(show_spinner=False, max_entries=32)
def _evaluate(term: str, workload_key: str):
    from mpipe_core.api import evaluate

    return evaluate(term, _workload_arg(workload_key), max_ops=APP_MAX_OPS)


@st.cache_resource(show_spinner=False, max_entries=16)
def _compare(terms: tuple[str, ...], workload_key: str):
    from mpipe_core.compare import compare

    return compare(list(terms), _workload_arg(workload_key))


def evaluate(term: str, workload: "WorkloadChoice"):
    """The core's evaluation of `term` (cached per term and workload)."""
    return _evaluate(term.strip(), workload.key)


def compare(terms: list[str], workload: "WorkloadChoice"):
    return _compare(tuple(t.strip() for t in terms), workload.key)


def evaluate_version(version):
    """A saved version evaluated on the workload it was saved with."""
    body = version.workload
    key = "json:" + json.dumps(body, sort_keys=True) if body is not None else "uniform"
    return _evaluate(version.term, key)


# --- workload picker -----------------------------------------------------------------------

@dataclass(frozen=True)
class WorkloadChoice:
    label: str
    key: str  # preset name, or "json:" + the document (cache key and evaluation argument)
    save_as: Any  # what storage.save_schedule takes: preset name, "saved:NAME@N", or a dict
    has_encoders: bool


def _json_error(error: json.JSONDecodeError) -> str:
    return f"line {error.lineno}, column {error.colno}: {error.msg}"


def workload_picker(db=None, *, key: str = "wl") -> WorkloadChoice | None:
    """Preset, saved workload, or an explicit JSON document; None (with the error
    shown inline) when the JSON is not a valid workload."""
    from mpipe_core.presets import PRESETS, preset_document
    from mpipe_core.workload import parse_workload

    source = st.radio("Workload", ["Preset", "Saved", "JSON"], horizontal=True,
                      key=kept(f"{key}.source", "Preset"),
                      help="A preset, a workload saved in the library, or your own JSON document")
    choice: WorkloadChoice | None = None
    if source == "Preset":
        name = st.selectbox("Preset", PRESETS, key=kept(f"{key}.preset", DEFAULT_PRESET))
        encoders = bool(preset_document(name).get("encoders"))
        choice = WorkloadChoice(name, name, name, encoders)
        with st.expander("Its document"):
            st.json(preset_document(name), expanded=False)
    elif source == "Saved":
        infos = []
        if db is not None:
            from storage import list_workloads, saved_workload_ref

            infos = list_workloads(db)
        if not infos:
            st.info("No saved workloads yet: write one under JSON and save it.")
        else:
            refs = [info.ref for info in infos]
            saved_key = kept(f"{key}.saved", refs[0])
            if st.session_state[saved_key] not in refs:
                set_kept(saved_key, refs[0])
            ref = st.selectbox("Saved workload", refs, key=saved_key)
            info = infos[refs.index(ref)]
            body = info.body
            choice = WorkloadChoice(saved_workload_ref(ref), "json:" + json.dumps(body, sort_keys=True),
                                    saved_workload_ref(ref), bool(body.get("encoders")))
            with st.expander("Its document"):
                st.json(body, expanded=False)
    else:
        text_key = kept(f"{key}.json", json.dumps(preset_document(DEFAULT_PRESET), indent=2))

        def load_preset() -> None:
            set_kept(text_key, json.dumps(preset_document(st.session_state[f"{key}.load"]), indent=2))

        cols = st.columns([3, 1])
        cols[0].selectbox("Start from preset", PRESETS, key=f"{key}.load",
                          index=PRESETS.index(DEFAULT_PRESET), label_visibility="collapsed")
        cols[1].button("Load", key=f"{key}.load_btn", on_click=load_preset,
                       help="Replace the editor's text with this preset's document")
        text = st.text_area("Workload JSON", key=text_key, height=260,
                            help="Explicit (llm/encoders/link) or analytic (model/device) form")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as error:
            st.error(f"Workload JSON, {_json_error(error)}")
            doc = None
        if doc is not None:
            try:
                wl = parse_workload(doc)
            except MpipeError as error:
                show_error(error, what="Workload")
            else:
                label = str(doc.get("name") or "inline") if isinstance(doc, dict) else "inline"
                choice = WorkloadChoice(label, "json:" + json.dumps(doc, sort_keys=True), doc,
                                        bool(wl.encoders))
                if db is not None:
                    _save_workload_form(db, doc, key)
    remember(f"{key}.source", f"{key}.preset", f"{key}.saved", f"{key}.json")
    return choice


def _save_workload_form(db, doc: dict, key: str) -> None:
    from storage import save_workload

    with st.popover("Save this workload to the library"):
        with st.form(f"{key}.save_form", clear_on_submit=False, border=False):
            name = st.text_input("Name", key=f"{key}.save_name")
            update = st.checkbox("Add a version to an existing workload", key=f"{key}.save_update")
            message = st.text_input("Message", key=f"{key}.save_message")
            if st.form_submit_button("Save workload"):
                try:
                    info = save_workload(db, name.strip(), doc, message=message, update=update)
                except MpipeError as error:
                    st.error(error.message)
                else:
                    st.success(f"Saved workload {info.ref}")


# --- metrics -------------------------------------------------------------------------------

def fmt(value: Any, spec: str = ".4g") -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return "–"


def metric_cards(summary: dict, unit: str = "units") -> None:
    cols = st.columns(5)
    cols[0].metric("Makespan", fmt(summary["makespan"]), help=f"end of the last op ({unit})")
    cols[1].metric("Bubble ratio", fmt(summary["bubble_ratio"], ".1%"),
                   help="sum of idle time / (devices × makespan)")
    cols[2].metric("Efficiency vs LB", fmt(summary["efficiency"], ".1%"),
                   help=f"lower bound {fmt(summary['lower_bound'])} / makespan")
    peaks = summary["peak_memory"]
    cols[3].metric("Peak memory (max)", fmt(max(peaks) if peaks else None),
                   help="per device: " + ", ".join(f"dev {d}: {fmt(p)}" for d, p in enumerate(peaks)))
    cols[4].metric("Devices · ops", f"{summary['devices']} · {summary['ops']:,}")
    st.caption("Peak activation memory per device: "
               + " · ".join(f"dev {d} **{fmt(p)}**" for d, p in enumerate(peaks))
               + f" — lower bound **{fmt(summary['lower_bound'])}**")


def when(value) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "–"
