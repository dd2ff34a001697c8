"""Tune under a memory cap: recompute what misses it, and say why nothing fits.

`recompute_to_fit` takes the candidates that beat every fitting one but miss
the cap (fastest first, while the search has time), and tries recomputing the
chunks on their over-cap devices (selective first where it saves memory,
then full, then every chunk; a candidate whose over-cap devices hold no
LLM chunk, such as disaggregate's encoder devices, has nothing a recompute
frees and is left as it is); the first that fits drops recomputed chunks one
at a time while it still fits, so the fewest chunks pay the recompute, and
becomes a candidate.  The
recompute goes around the term's LLM body (inside `transpose`, whose dynamic
placement then sees the longer backwards; outside `balanced`/`partition`,
which set the layers it names).

`family_reasons` says, per family of terms, what rules it out: static memory
alone over the cap, or the least its candidates need.
"""
from __future__ import annotations

import time
from typing import Callable

from mpipe_core.algebra.combinators.partition import chunk_devices
from mpipe_core.algebra.terms import Call, parse
from mpipe_core.algebra.terms.ast import Sym
from mpipe_core.algebra.terms.signatures import signature_of
from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.simulation.metrics import within
from mpipe_core.workloads.workload import Workload

RECOMPUTE_CANDIDATES = 6  # how many over-cap candidates get recompute tries
SPLITS = ("balanced", "partition")  # a recompute goes outside these (they set the layers it names)


def recompute_to_fit(candidates, run: Callable[[str], object], wl: Workload, memory_cap: float,
                     deadline: float, say: Callable[[str], None]) -> int:
    """Run (as candidates) recompute variants of the most promising candidates
    that miss `memory_cap`: for each, the first variant that fits, trimmed to
    the fewest chunks (trials are evaluated without becoming candidates).
    Returns how many the time limit left untried."""
    saves = wl.llm.kept_activation("full") < wl.llm.activation or any(
        e.trainable and e.activations(1, "full")[0] < e.activations(1)[0] for e in wl.encoders)
    if not saves:
        return 0  # the workload says a recompute keeps all it had: it would only cost time
    fitting = [c for c in candidates if within(c.peak_memory, memory_cap)]
    best_fit = min((c.makespan for c in fitting), default=float("inf"))
    missing = sorted((c for c in candidates if not within(c.peak_memory, memory_cap) and c.makespan < best_fit
                      and c.static_memory <= memory_cap and "recompute(" not in c.term),
                     key=lambda c: c.makespan)[:RECOMPUTE_CANDIDATES]
    selective = wl.llm.kept_activation("selective") < wl.llm.activation
    for i, c in enumerate(missing):
        now = time.perf_counter()
        if now > deadline:
            say(f"time limit reached: {len(missing) - i} candidates over the memory cap not tried with recompute")
            return len(missing) - i
        share = now + (deadline - now) / (len(missing) - i)  # this candidate's part of the time left
        try:
            ev = evaluate(c.term, wl)
        except MpipeError:
            continue
        over = {d for d, p in enumerate(ev.metrics.peak_memory) if not within(p, memory_cap)}
        placed = chunk_devices(ev.schedule, "llm", ev.schedule.pipelines[0].chunks)
        chunks = [ch for ch, d in enumerate(placed) if d in over]
        if not chunks:
            # Only devices without an LLM chunk miss the cap (disaggregate's encoder devices):
            # recomputing LLM layers frees nothing there.
            continue
        tries = ([("selective", chunks)] if selective else []) + [("full", chunks)]
        if len(chunks) < len(placed):
            tries.append(("full", None))
        for mode, named in tries:
            if not _fits(with_recompute(ev.ast, mode, named), wl, memory_cap):
                continue
            if named is not None:
                named = _fewest_chunks(ev.ast, mode, named, wl, memory_cap, share)
            run(with_recompute(ev.ast, mode, named))
            break
    return 0


def _fits(term: str, wl: Workload, memory_cap: float) -> bool:
    try:
        return within(max(evaluate(term, wl).metrics.peak_memory), memory_cap)
    except MpipeError:
        return False


def _fewest_chunks(ast: Call, mode: str, chunks: list[int], wl: Workload, memory_cap: float,
                   deadline: float) -> list[int]:
    """Drop recomputed chunks one at a time, the last first (later stages hold
    fewer microbatches in flight), while the schedule still fits.  Fewer
    recomputed chunks never need less memory, so each chunk is tried once."""
    kept = list(chunks)
    for chunk in reversed(chunks):
        if len(kept) == 1 or time.perf_counter() > deadline:
            break
        trial = [c for c in kept if c != chunk]
        if _fits(with_recompute(ast, mode, trial), wl, memory_cap):
            kept = trial
    return kept


def with_recompute(ast: Call, mode: str, chunks: list[int] | None, encoders: str = "no") -> str:
    """The term with `recompute(..., mode, chunks, encoders)` around its LLM body
    (`encoders=only`: the encoders' own ops alone, no chunk)."""
    def wrap(node: Call) -> Call:
        options = ((("mode", Sym(mode)),) if mode != "full" else ()) + \
                  ((("chunks", tuple(chunks)),) if chunks is not None and encoders != "only" else ()) + \
                  ((("encoders", Sym(encoders)),) if encoders != "no" else ())
        return Call("recompute", (), (("term", node),) + options)

    def descend(node: Call) -> Call:
        sig = signature_of(node.name)
        if sig is None or sig.kind == "generator" or node.name in SPLITS:
            return wrap(node)
        kwargs = list(node.kwargs)
        for i, (key, value) in enumerate(kwargs):
            if isinstance(value, Call):
                kwargs[i] = (key, descend(value))
                return Call(node.name, node.args, tuple(kwargs))
        return wrap(node)

    return str(parse(str(descend(ast))))


WRAPPERS = ("encoder_batch", "recompute", "defer_w", "split_bw")  # what `family` sees through
PLACEMENTS = ("colocated", "disaggregate", "transpose", "encoder_stage", "balanced")


def family(term: str, detailed: bool = False) -> str:
    """The placement a term's encoders have, under any of WRAPPERS: colocated,
    disaggregate, transpose, encoder_stage, balanced (folded into the chain)
    or fused (anything else: a plain generator).  `detailed`: the label the
    reasons nothing fits use, transpose with its mode and fused as "fused
    (plain generators)" (another combinator: its own name)."""
    node = parse(term)
    while node.name in WRAPPERS:
        node = next(v for v in (*node.args, *(v for _, v in node.kwargs)) if isinstance(v, Call))
    if not detailed:
        return node.name if node.name in PLACEMENTS else "fused"
    if node.name == "transpose":
        return f"transpose mode={node.kw('mode', Sym('prefix'))}"
    sig = signature_of(node.name)
    return "fused (plain generators)" if sig is not None and sig.kind == "generator" else node.name


class NothingFitsError(MpipeError):
    """No candidate fits under the memory cap; `reasons`: one line per family
    saying what rules it out (`family_reasons`)."""

    def __init__(self, message: str, reasons: list[str]):
        super().__init__(message)
        self.reasons = list(reasons)


def family_reasons(candidates, memory_cap: float, unit: str = "") -> list[str]:
    """One line per family: static memory over the cap in every candidate of
    it, or else the least memory any of its candidates needs."""
    suffix = f" {unit}" if unit else ""
    families: dict[str, list] = {}
    for c in candidates:
        families.setdefault(family(c.term, detailed=True), []).append(c)
    lines = []
    for key, members in sorted(families.items(), key=lambda item: min(c.peak_memory for c in item[1])):
        lightest = min(members, key=lambda c: c.static_memory)
        least = min(members, key=lambda c: c.peak_memory)
        if lightest.static_memory > memory_cap:
            lines.append(f"{key}: static memory alone is at least {lightest.static_memory:.4g}{suffix} on a device "
                         f"in every candidate, over the {memory_cap:.4g}{suffix} cap ({lightest.term})")
        else:
            lines.append(f"{key}: the least any of its candidates needs is {least.peak_memory:.4g}{suffix} on a "
                         f"device (static memory up to {least.static_memory:.4g}{suffix}), over the "
                         f"{memory_cap:.4g}{suffix} cap ({least.term})")
    return lines
