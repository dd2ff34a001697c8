"""Evaluations the pages draw, cached across sessions by (canonical term,
workload digest), and interruptible when they are slow.

The key is the term's canonical text (so `1f1b(m=4, p=4)` and
`1f1b(p=4, m=4)` share an entry) and a digest of the workload document (so
a preset, the same document typed as JSON and a saved copy share one too).
The cache lives in this module, once per server process: a new session finds
what any other session evaluated.

A term estimated above `BACKGROUND_OPS` ops is evaluated in a child process
while the page shows how long it has run and a Stop button; stopping (or
changing the input, which reruns the page) ends the child at once, and both
go from the page when the evaluation ends.  A term above the app's op limit
is refused before anything starts, naming the app's setting.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import streamlit as st

from mpipe_core.errors import MpipeError

from . import state

# Requests from the browser are refused above this many ops (the core checks before
# building): lower than the CLI's limit, since anyone who reaches the app can send one.
APP_MAX_OPS_ENV = "MPIPE_APP_MAX_OPS"
DEFAULT_APP_MAX_OPS = 500_000
BACKGROUND_OPS = 60_000  # above this estimate, evaluate in a child process that can be stopped
CACHE_ENTRIES = 32


def app_max_ops() -> int:
    """$MPIPE_APP_MAX_OPS (set by `mpipe app --max-ops`), else 500,000."""
    from mpipe_core.algebra.evaluate import max_ops

    return max_ops(APP_MAX_OPS_ENV, DEFAULT_APP_MAX_OPS)


@dataclass(frozen=True)
class WorkloadChoice:
    """A workload as the pages pass it around: frozen, hashable, with its digest."""

    label: str
    document: str  # canonical JSON of the workload document
    save_as: Any  # what storage.save_schedule takes: preset name, "saved:NAME@N", or a dict
    has_encoders: bool
    time_unit: str = ""
    memory_unit: str = ""
    capacity: float | None = None  # the device's memory, in memory_unit (None: unknown)

    @property
    def digest(self) -> str:
        return workload_digest(json.loads(self.document))

    def body(self) -> dict:
        return json.loads(self.document)

    @property
    def degrees(self) -> dict[str, int]:
        """tp, cp and dp of an analytic workload's parallel section; each 1 for any
        other (an explicit workload's costs are per pipeline device, whatever made them)."""
        return parallel_degrees(self.body())

    @property
    def dies_per_npu(self) -> int:
        """Dies per NPU of its cluster (`dies_per_npu`): what a device count says beside it."""
        return dies_per_npu(self.body())


def dies_per_npu(doc: Any) -> int:
    """Dies per NPU of an analytic workload's cluster (its own, else its device's:
    2 on CloudMatrix384, where a device is one die of a 910C); 1 for any other."""
    from mpipe_core.search.plan import dies_per_npu as core_dies

    return core_dies(doc)


def evaluation_dies(ev) -> int:
    """Dies per NPU of the cluster an evaluation's workload runs on (1 without one)."""
    return dies_per_npu(ev.workload.source)


def parallel_degrees(doc: Any) -> dict[str, int]:
    """{"tp", "cp", "dp"} of a workload document: an analytic one's parallel section, else 1 each."""
    from mpipe_core.workloads.analytic import parallel_section

    ones = {"tp": 1, "cp": 1, "dp": 1}
    if not isinstance(doc, dict) or "model" not in doc:
        return ones
    try:
        section = parallel_section(doc)
    except MpipeError:
        return ones
    return {name: int(section[name]) for name in ones}


def canonical_json(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def workload_digest(doc: Any) -> str:
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()[:16]


def choice_for(label: str, doc: dict, save_as: Any) -> WorkloadChoice:
    """A WorkloadChoice of a (valid) workload document."""
    from mpipe_core.workloads.workload import parse_workload

    wl = parse_workload(doc)
    return WorkloadChoice(label, canonical_json(doc), save_as, bool(wl.encoders), wl.time_unit,
                          wl.memory_unit, wl.capacity)


# --- the cache --------------------------------------------------------------------------------

class SharedCache:
    """A small LRU shared by every session of this server process."""

    def __init__(self, entries: int):
        self.entries = entries
        self.items: OrderedDict[tuple, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple) -> Any:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        return None

    def put(self, key: tuple, value: Any) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.entries:
                self.items.popitem(last=False)


CACHE = SharedCache(CACHE_ENTRIES)


def cache_key(term: str, workload: WorkloadChoice) -> tuple[str, str]:
    """(canonical term, workload digest); raises the parser's TermError."""
    from mpipe_core.algebra.terms import parse

    return str(parse(term)), workload.digest


def _child(term: str, document: str, conn) -> None:
    from mpipe_core.api import evaluate

    try:
        conn.send(("ok", evaluate(term, json.loads(document), max_ops=app_max_ops())))
    except MpipeError as error:
        conn.send(("error", error))


def _in_child(term: str, document: str, on_wait: Callable[[float], None]):
    """Evaluate in a child process, calling `on_wait(seconds so far)` while it
    runs; the child is ended if the caller is interrupted (a rerun, Stop)."""
    from .child_process import start_child

    receive, send = multiprocessing.get_context("spawn").Pipe(duplex=False)
    started = time.monotonic()
    child = start_child(_child, (term, document, send))
    send.close()
    try:
        while not receive.poll(0.25):
            if not child.is_alive():
                raise MpipeError("the evaluation process ended without an answer")
            on_wait(time.monotonic() - started)
        status, value = receive.recv()
    finally:
        if child.is_alive():
            child.kill()
        child.join(timeout=5)
        receive.close()
    if status == "error":
        raise value
    return value


class Stopped(Exception):
    """The user stopped this evaluation; the page says so and waits for new input."""


class _Waiting:
    """A line that counts the seconds and a Stop button (drawn once), both
    taken off the page by `close()` when the evaluation ends, however it ends."""

    def __init__(self, label: str, key: tuple):
        self.label = label
        self.box = st.empty()
        self.stop_slot = st.empty()

        def stop() -> None:
            state.set_stopped_evaluation(key)

        self.stop_slot.button("Stop this evaluation", key=f"stop.{key[1]}.{abs(hash(key[0]))}", on_click=stop)

    def update(self, seconds: float) -> None:
        # Each update is a Streamlit call: a rerun (Stop, a new term) interrupts the page here.
        self.box.info(f"Evaluating {self.label}: {seconds:.0f} s so far (a big schedule).")

    def close(self) -> None:
        self.box.empty()
        self.stop_slot.empty()


def check_size(term: str, workload: "WorkloadChoice") -> int:
    """The op estimate of `term`, or SizeLimitError (naming the app's own setting)
    above `app_max_ops()`: refused before any process or banner is started."""
    from mpipe_core.algebra.evaluate import estimate_ops
    from mpipe_core.algebra.terms import parse
    from mpipe_core.errors import SizeLimitError
    from mpipe_core.workloads.workload import parse_workload

    ast = parse(term)
    estimate = estimate_ops(ast, parse_workload(workload.body()))
    limit = app_max_ops()
    if estimate > limit:
        raise SizeLimitError(f"{ast.name}(...) would build about {estimate:,} ops, over the app's limit of "
                             f"{limit:,} ({APP_LIMIT_SETTING})")
    return estimate


# What raises the app's op limit, where an op limit is mentioned in the app.
APP_LIMIT_SETTING = f"start the app with `mpipe app --max-ops N` or set {APP_MAX_OPS_ENV}"


def evaluate(term: str, workload: WorkloadChoice, *, allow_stopped: bool = False):
    """The core's evaluation of `term` on `workload` (cached across sessions)."""
    from mpipe_core.api import evaluate as core_evaluate

    key = cache_key(term, workload)
    hit = CACHE.get(key)
    if hit is not None:
        return hit
    if not allow_stopped and state.stopped_evaluation() == key:
        raise Stopped(key[0])
    if check_size(key[0], workload) > BACKGROUND_OPS:
        waiting = _Waiting(key[0], key)
        try:
            result = _in_child(key[0], workload.document, waiting.update)
        finally:
            waiting.close()
    else:
        result = core_evaluate(key[0], workload.body(), max_ops=app_max_ops())
    CACHE.put(key, result)
    return result


def compare(terms: list[str], workload: WorkloadChoice):
    """The core's comparison rows, built from cached evaluations."""
    from mpipe_core.compare import compare as core_compare

    return core_compare(terms, workload, evaluator=lambda term, _: evaluate(term, workload))


def version_label(version) -> str:
    """The full name of the workload a version was saved with (storage's
    `shown_workload_label`): a preset with its parallel settings ("internvl-26b
    tp=8,sp"), "NAME (edited)", a saved workload's reference, or the name stored."""
    from storage import shown_workload_label

    return shown_workload_label(version.workload_label, version.workload)


def version_workload(version) -> WorkloadChoice:
    """The workload a saved version was saved with, named in full."""
    from mpipe_core.workloads.presets import preset_document

    body = version.workload if version.workload is not None else preset_document("uniform")
    return choice_for(version_label(version), body, version.workload_label)


def version_units(version) -> tuple[str, str]:
    """(time unit, memory unit) of the workload a version was saved with."""
    try:
        choice = version_workload(version)
    except MpipeError:
        return "", ""
    return choice.time_unit, choice.memory_unit


def evaluate_version(version):
    """A saved version evaluated on the workload it was saved with."""
    return evaluate(version.term, version_workload(version))


def evaluation_bars(ev):
    """The evaluation's timeline as bars, in the workload's time unit."""
    from dataclasses import replace

    from .bars import from_timeline
    from .formatting import axis_unit

    return replace(from_timeline(ev.timeline), unit=axis_unit(ev.workload.time_unit))


def evaluation_comm(ev) -> list:
    """The evaluation's communication slices, on the same time axis as its bars
    (an analytic workload on a cluster; empty otherwise)."""
    return ev.comm
