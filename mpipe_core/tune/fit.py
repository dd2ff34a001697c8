"""Tune under a memory cap: recompute what misses it, and say why nothing fits.

`recompute_to_fit` takes the candidates that beat every fitting one but miss
the cap (fastest first, while the search has time), and tries recomputing the
chunks on their over-cap devices (selective first where it saves memory,
then full, then every chunk), then drops recomputed chunks one at a time
while the schedule still fits, so the fewest chunks pay the recompute.  The
recompute goes around the term's LLM body (inside `transpose`, whose dynamic
placement then sees the longer backwards; outside `balanced`/`partition`,
which set the layers it names).

`family_reasons` says, per family of terms, what rules it out: static memory
alone over the cap, or the least its candidates need.
"""
from __future__ import annotations

import time
from typing import Callable

from ..api import evaluate
from ..combinators.partition import chunk_devices
from ..errors import MpipeError
from ..terms import Call, parse
from ..terms.ast import Sym
from ..terms.signatures import signature_of
from ..workload import Workload

RECOMPUTE_CANDIDATES = 6  # how many over-cap candidates get recompute tries
SPLITS = ("balanced", "partition")  # a recompute goes outside these (they set the layers it names)
SLACK = 1e-12


def recompute_to_fit(candidates, run: Callable[[str], object], wl: Workload, memory_cap: float,
                     deadline: float, say: Callable[[str], None]) -> None:
    """Run recompute variants of the most promising candidates that miss `memory_cap`."""
    fitting = [c for c in candidates if c.peak_memory <= memory_cap + SLACK]
    best_fit = min((c.makespan for c in fitting), default=float("inf"))
    missing = sorted((c for c in candidates if c.peak_memory > memory_cap + SLACK and c.makespan < best_fit
                      and c.static_memory <= memory_cap and "recompute(" not in c.term),
                     key=lambda c: c.makespan)[:RECOMPUTE_CANDIDATES]
    selective = wl.llm.kept_activation("selective") < wl.llm.activation
    for c in missing:
        if time.perf_counter() > deadline:
            say("time limit reached: no more recompute tries")
            return
        try:
            ev = evaluate(c.term, wl)
        except MpipeError:
            continue
        peaks = ev.metrics.peak_memory
        over = {d for d, p in enumerate(peaks) if p > memory_cap + SLACK}
        placed = chunk_devices(ev.schedule, "llm", ev.schedule.pipelines[0].chunks)
        chunks = [ch for ch, d in enumerate(placed) if d in over]
        every = list(range(len(placed)))
        ast = ev.ast
        tries = ([("selective", chunks)] if selective else []) + [("full", chunks)]
        if chunks != every:
            tries.append(("full", None))
        for mode, named in tries:
            found = run(with_recompute(ast, mode, named))
            if found is None or found.peak_memory > memory_cap + SLACK:
                continue
            if named is not None:
                _fewest_chunks(ast, mode, named, run, memory_cap, deadline)
            break


def _fewest_chunks(ast: Call, mode: str, chunks: list[int], run, memory_cap: float, deadline: float) -> None:
    """Drop recomputed chunks one at a time (last first) while the schedule still fits."""
    kept = list(chunks)
    for chunk in reversed(chunks):
        if len(kept) == 1 or time.perf_counter() > deadline:
            return
        trial = [c for c in kept if c != chunk]
        found = run(with_recompute(ast, mode, trial))
        if found is not None and found.peak_memory <= memory_cap + SLACK:
            kept = trial


def with_recompute(ast: Call, mode: str, chunks: list[int] | None) -> str:
    """The term with `recompute(..., mode, chunks)` around its LLM body."""
    def wrap(node: Call) -> Call:
        options = ((("mode", Sym(mode)),) if mode != "full" else ()) + \
                  ((("chunks", tuple(chunks)),) if chunks is not None else ())
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


def family(term: str) -> str:
    """The family a candidate belongs to, for saying what rules it out."""
    node = parse(term)
    while node.name in ("recompute", "defer_w", "split_bw"):
        node = next(v for _, v in node.kwargs if isinstance(v, Call))
    if node.name == "transpose":
        mode = node.kw("mode", Sym("prefix"))
        return f"transpose mode={mode}"
    sig = signature_of(node.name)
    return "fused (plain generators)" if sig is not None and sig.kind == "generator" else node.name


def family_reasons(candidates, memory_cap: float, unit: str = "") -> list[str]:
    """One line per family: what keeps its best candidate over the cap."""
    suffix = f" {unit}" if unit else ""
    least: dict[str, object] = {}
    for c in candidates:
        key = family(c.term)
        if key not in least or c.peak_memory < least[key].peak_memory:
            least[key] = c
    lines = []
    for key, c in sorted(least.items(), key=lambda item: item[1].peak_memory):
        if c.static_memory > memory_cap:
            lines.append(f"{key}: static memory alone is {c.static_memory:.4g}{suffix} on a device, over the "
                         f"{memory_cap:.4g}{suffix} cap ({c.term})")
        else:
            lines.append(f"{key}: the least any of its candidates needs is {c.peak_memory:.4g}{suffix} on a device "
                         f"(static memory up to {c.static_memory:.4g}{suffix}), over the {memory_cap:.4g}{suffix} "
                         f"cap ({c.term})")
    return lines
