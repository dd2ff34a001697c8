"""How to make a term fit the device's memory: the fastest variant that does, among
recomputing the encoders' own ops (`recompute(..., encoders=only|yes)`) and, for an
analytic workload with a trained encoder, sharding that encoder's state over its copies
(`parallel.encoder_shard`: optimizer, gradients), each alone and together.

What the Before / after page offers when neither of its two schedules fits: the
schedule changes (the term) and the workload's parallel section may change too
(`encoder_shard`), so a suggestion is a (term, workload document) pair that
`mpipe eval TERM -w DOCUMENT` reproduces.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from mpipe_core.api import evaluate
from mpipe_core.algebra.terms import Call, parse
from mpipe_core.algebra.terms.ast import Sym
from mpipe_core.errors import MpipeError
from mpipe_core.search.fit import with_recompute
from mpipe_core.simulation.metrics import within

SHARDINGS = ("optimizer", "gradients")  # `parallel.encoder_shard` beyond none, least change first


@dataclass(frozen=True)
class FitSuggestion:
    term: str  # canonical
    document: dict  # the workload document it fits on (the input's, or with encoder_shard set)
    workload_changes: tuple[str, ...]  # what differs in the document, in words ("encoder_shard gradients")
    term_changes: tuple[str, ...]  # what differs in the term ("recompute(…, encoders=only)")
    makespan: float
    peak_memory: float
    capacity: float
    step_time_s: float | None  # an analytic workload's step time

    @property
    def changes(self) -> tuple[str, ...]:
        return self.workload_changes + self.term_changes

    def as_dict(self) -> dict[str, Any]:
        return {"term": self.term, "document": self.document, "changes": list(self.changes),
                "makespan": self.makespan, "peak_memory": self.peak_memory, "capacity": self.capacity,
                "step_time_s": self.step_time_s}


def _documents(document: dict) -> list[tuple[dict, tuple[str, ...]]]:
    """The document as is, then with a trained encoder's state sharded (analytic workloads)."""
    out: list[tuple[dict, tuple[str, ...]]] = [(document, ())]
    if not isinstance(document, dict) or "model" not in document or not document.get("encoders"):
        return out
    section = document.get("parallel") if isinstance(document.get("parallel"), dict) else {}
    current = section.get("encoder_shard", "none")
    for shard in SHARDINGS[SHARDINGS.index(current) + 1 if current in SHARDINGS else 0:]:
        doc = copy.deepcopy(document)
        doc["parallel"] = {**section, "encoder_shard": shard}
        out.append((doc, (f"encoder_shard {shard}",)))
    return out


def _terms(term: str) -> list[tuple[str, tuple[str, ...]]]:
    """The term as is, then with the encoders' own ops recomputed (alone, then with every
    chunk); a term that already recomputes has its recompute extended to the encoders."""
    ast = parse(term)
    out = [(str(ast), ())]
    if "recompute(" in str(ast):
        extended = _encoders_recomputed(ast)
        if extended is not None:
            out.append((str(parse(str(extended))), ("recompute(…, encoders=yes)",)))
        return out
    for mode in ("only", "yes"):
        try:
            out.append((with_recompute(ast, "full", None, mode), (f"recompute(…, encoders={mode})",)))
        except MpipeError:
            continue
    return out


def _encoders_recomputed(node: Any) -> Call | None:
    """The term with its (first) recompute extended to the encoders' own ops
    (`encoders=yes`); None when it has none or that one already does."""
    if not isinstance(node, Call):
        return None
    if node.name == "recompute":
        if node.kw("encoders") is not None:
            return None
        return Call(node.name, node.args, node.kwargs + (("encoders", Sym("yes")),))
    for i, (key, value) in enumerate(node.kwargs):
        found = _encoders_recomputed(value)
        if found is not None:
            kwargs = list(node.kwargs)
            kwargs[i] = (key, found)
            return Call(node.name, node.args, tuple(kwargs))
    return None


def way_to_fit(term: str, document: dict, max_ops: int | None = None) -> FitSuggestion | None:
    """The fastest variant of `term` (by step time where the workload has one, else makespan;
    ties: the fewest changes) that fits every device's memory on `document`, or None when
    none does or the capacity is unknown."""
    best: tuple[tuple, FitSuggestion] | None = None
    for doc, doc_changes in _documents(document):
        for text, term_changes in _terms(term):
            try:
                ev = evaluate(text, doc, max_ops=max_ops)
                metrics = ev.metrics
            except MpipeError:
                continue
            capacity = ev.workload.capacity
            peak = max(metrics.peak_memory, default=0.0)
            if capacity is None or not within(peak, capacity):
                continue
            step = ev.step.step_time_s if ev.step is not None else None
            changes = doc_changes + term_changes
            key = (step if step is not None else ev.timeline.makespan, len(changes))
            if best is None or key < best[0]:
                best = (key, FitSuggestion(ev.term, doc, doc_changes, term_changes, ev.timeline.makespan, peak,
                                           capacity, step))
    return None if best is None else best[1]
