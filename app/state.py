"""Session state the pages share, behind named accessors.

A page never reads another page's widget keys: it asks here ("the Designer's
term", "open this version in the Designer").  Widget keys stay private to the
page that draws the widget; `kept`/`remember` only make a widget's value
survive switching pages (Streamlit drops the state of widgets a page did not draw).
"""
from __future__ import annotations

import json
import time
from typing import Any

import streamlit as st

DEFAULT_TERM = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
DEFAULT_PRESET = "vit-heavy-small"

DESIGNER_TERM = "designer.term"  # the Designer's term text area
WORKLOAD = "wl"  # key prefix of the Designer's workload picker
MEMORY_DEVICE = "designer.memdev"  # the device whose memory curve the Designer draws (many devices)
SELECTED_RUN = "runs.selected"
BEFORE, AFTER = "ba.before", "ba.after"  # the Before / after page's two terms
_STOPPED = "_evaluation.stopped"  # (canonical term, workload digest) the user stopped
_LAUNCHES = "_runs.launches"  # (ref, backend, nproc, steps) -> monotonic time of the launch
_BASELINE = "_designer.baseline"  # (the plan's winner, canonical JSON of its workload) or None
_PAGE = "_page"  # the url path of the page this run draws


# --- widget values that survive switching pages ---------------------------------------------

def set_page(url_path: str) -> None:
    """Name the page this run draws (the entry script does, before the page runs)."""
    st.session_state[_PAGE] = url_path


def kept(key: str, default: Any) -> str:
    """Give widget `key` its last value even after another page was shown.
    Call before drawing the widget, and `remember(key)` after."""
    store = f"_kept.{key}"
    if store not in st.session_state:
        st.session_state[store] = default
    if key in st.session_state and st.session_state.get(_drawn_on(key)) == st.session_state.get(_PAGE):
        # This page drew the widget in its last run: the browser holds its value.  Assigning it
        # again would make Streamlit send it back as a value to set, undoing whatever the user
        # changed in the browser while this run was under way (a click lost under load).
        return key
    # Re-assigning turns a value left by another page's widget (which the new
    # widget would ignore) into one the widget drawn now starts from.
    value = st.session_state[key] if key in st.session_state else st.session_state[store]
    st.session_state[key] = value
    return key


def remember(*keys: str) -> None:
    for key in keys:
        if key in st.session_state:
            st.session_state[f"_kept.{key}"] = st.session_state[key]
            st.session_state[_drawn_on(key)] = st.session_state.get(_PAGE)


def _drawn_on(key: str) -> str:
    return f"_kept_on.{key}"


def set_kept(key: str, value: Any) -> None:
    """Set a kept widget's value (from a callback, or before it is drawn)."""
    st.session_state[key] = value
    st.session_state[f"_kept.{key}"] = value


def _value(key: str, default: Any) -> Any:
    return st.session_state.get(key, st.session_state.get(f"_kept.{key}", default))


# --- the Designer's term and workload, as other pages see them ------------------------------

def designer_term() -> str:
    """The term last written in the Designer (the default before that)."""
    return _value(DESIGNER_TERM, DEFAULT_TERM)


def set_designer_term(text: str) -> None:
    set_kept(DESIGNER_TERM, text)


def open_in_designer(term: str, workload_body: dict | None, workload_label: str,
                     baseline: str | None = None) -> None:
    """Put a term and the workload it goes with into the Designer's widgets.
    `baseline`: what the user would run on that workload (the plan's winner), the
    term Before / after compares a transpose with there."""
    set_designer_term(term)
    set_workload(workload_body, workload_label)
    st.session_state[_BASELINE] = (baseline, _canonical(workload_body)) if baseline else None


def comparison_baseline(workload_document: str) -> str | None:
    """The term to compare a transpose with on this workload (canonical JSON): the
    plan's winner when the Designer was opened from a plan on it; None otherwise."""
    stored = st.session_state.get(_BASELINE)
    return stored[0] if stored and stored[1] == workload_document else None


def _canonical(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def set_workload(workload_body: dict | None, workload_label: str) -> None:
    """Put a workload into the picker the Designer and Before / after share."""
    from mpipe_core.workloads.presets import PRESETS, preset_document
    from storage import saved_workload_name

    if workload_body is None:
        set_kept(f"{WORKLOAD}.source", "Preset")
        set_kept(f"{WORKLOAD}.preset", "uniform")
    elif saved_workload_name(workload_label) is not None:
        set_kept(f"{WORKLOAD}.source", "Saved")
        set_kept(f"{WORKLOAD}.saved", saved_workload_name(workload_label))
    elif workload_label in PRESETS and workload_body == preset_document(workload_label):
        set_kept(f"{WORKLOAD}.source", "Preset")
        set_kept(f"{WORKLOAD}.preset", workload_label)
    else:
        set_kept(f"{WORKLOAD}.source", "JSON")
        set_kept(f"{WORKLOAD}.json", json.dumps(workload_body, indent=2))
        # Its name as the caller had it ("internvl-26b at tp=2 ..."), while the text is unedited, and
        # the loader on the preset it came from, not a stale default.
        st.session_state[json_label_key(WORKLOAD)] = (_canonical(workload_body), workload_label)
        origin = workload_body.get("name") if isinstance(workload_body, dict) else None
        if isinstance(origin, str) and origin in PRESETS:
            set_kept(f"{WORKLOAD}.load", origin)


def json_label_key(key: str) -> str:
    """Where `set_workload` keeps (canonical document, label) for the JSON picker of `key`."""
    return f"_{key}.json_label"


def json_label(key: str, doc: Any) -> str | None:
    """The label a page gave the JSON picker's document, while the text still holds it unedited."""
    stored = st.session_state.get(json_label_key(key))
    return stored[1] if stored and stored[0] == _canonical(doc) else None


_PICKER_FIELD = {"Preset": "preset", "Saved": "saved", "JSON": "json"}  # the picker's widget per source


def open_link(link) -> None:
    """Put a shared link's design (`design_link.DesignLink`) into the Designer's widgets."""
    if link.term is not None:
        set_designer_term(link.term)
    if link.source is not None:
        set_kept(f"{WORKLOAD}.source", link.source)
        set_kept(f"{WORKLOAD}.{_PICKER_FIELD[link.source]}", link.value)
    if link.memory_device is not None:
        set_kept(MEMORY_DEVICE, link.memory_device)


def set_before_after(before: str, after: str) -> None:
    """The two terms the Before / after page shows next."""
    set_kept(BEFORE, before)
    set_kept(AFTER, after)


# --- the run the Runs page shows ------------------------------------------------------------

def selected_run() -> int | None:
    return st.session_state.get(SELECTED_RUN)


def select_run(run_id: int) -> None:
    st.session_state[SELECTED_RUN] = run_id


# --- launches, to ask before queueing an identical run twice ---------------------------------

def last_launch(key: tuple) -> float | None:
    """Seconds since this session launched a run with these options (None: never)."""
    at = st.session_state.get(_LAUNCHES, {}).get(key)
    return None if at is None else time.monotonic() - at


def note_launch(key: tuple) -> None:
    st.session_state.setdefault(_LAUNCHES, {})[key] = time.monotonic()


# --- evaluations the user stopped -----------------------------------------------------------

def stopped_evaluation() -> tuple | None:
    return st.session_state.get(_STOPPED)


def set_stopped_evaluation(key: tuple | None) -> None:
    st.session_state[_STOPPED] = key
