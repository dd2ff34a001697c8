"""`mpipe tune`: search the algebra for the schedule to run.

Two phases.  The cheap one evaluates every generator (and its `v`) as is,
with split/deferred weight gradients, `balanced`, `encoder_stage` on one
fewer LLM device, and every prefix transpose (overflow x backward).  The
expensive one runs dynamic transposes (backward x shards, and the memory cap
when one is given) over the LLM bodies that were fastest on their own, best
body first, until the time limit.  Every candidate is an `evaluate` of its
own canonical term, so `mpipe eval TERM` reproduces its figures exactly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ..api import evaluate
from ..errors import MpipeError
from ..numbers import quantity
from ..workload import Workload, load_workload

# (generator, extra arguments) the search tries as LLM bodies.
BODIES = (
    ("1f1b", ""), ("gpipe", ""), ("interleaved", ", v=2"), ("interleaved", ", v=4"), ("looped_bfs", ", v=2"),
    ("zb_h1", ""), ("zb_h2", ""), ("zbv", ""), ("dualpipev", ""),
)
SHARDS_BY_PROMISE = (4, 1, 2)
DYNAMIC_BODIES = 3  # how many of the fastest LLM bodies get dynamic transposes


@dataclass(frozen=True)
class Candidate:
    term: str
    makespan: float
    peak_memory: float  # the most loaded device's peak activation memory
    lower_bound: float  # this schedule's own bound

    def as_dict(self, lower_bound: float, pareto: bool) -> dict:
        return {"term": self.term, "makespan": self.makespan, "peak_memory": self.peak_memory,
                "efficiency": lower_bound / self.makespan if self.makespan else 1.0, "pareto": pareto}


@dataclass
class TuneResult:
    lower_bound: float
    fused: Candidate
    balanced: Candidate
    candidates: list[Candidate]  # within the memory cap, sorted by makespan
    pareto: set[str] = field(default_factory=set)  # terms on the makespan / memory front
    optimal: dict | None = None
    seconds: float = 0.0
    exact: object | None = None  # the ExactResult behind `optimal`

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def as_dict(self, top: int | None = None) -> dict:
        shown = [c for i, c in enumerate(self.candidates) if top is None or i < top or c.term in self.pareto]

        def base(c: Candidate) -> dict:
            return {"term": c.term, "makespan": c.makespan, "peak_memory": c.peak_memory}

        return {
            "lower_bound": self.lower_bound,
            "baselines": {"fused": base(self.fused), "balanced": base(self.balanced)},
            "candidates": [c.as_dict(self.lower_bound, c.term in self.pareto) for c in shown],
            "best": self.best.as_dict(self.lower_bound, self.best.term in self.pareto),
            "optimal": self.optimal,
        }


def pareto_front(candidates: list[Candidate]) -> set[str]:
    """Terms no other candidate beats on both makespan and peak memory."""
    front: set[str] = set()
    lowest = float("inf")
    for c in sorted(candidates, key=lambda c: (c.makespan, c.peak_memory)):
        if c.peak_memory < lowest:
            front.add(c.term)
            lowest = c.peak_memory
    return front


def tune(workload: Workload | dict | str | None, devices: int, microbatches: int, memory_cap: float | None = None,
         time_limit: float = 45.0, progress: Callable[[str], None] | None = None,
         max_ops: int | None = None) -> TuneResult:
    """Search the algebra; raise MpipeError if nothing fits under `memory_cap`.
    Candidates above `max_ops` ops (default: the core's limit) are skipped."""
    wl = load_workload(workload)
    if devices < 1 or microbatches < 1:
        raise MpipeError(f"--devices and --microbatches must be >= 1 (got {devices}, {microbatches})")
    floor = wl.llm.activation  # every schedule holds one LLM layer's activations somewhere
    if memory_cap is not None and memory_cap < floor:
        raise MpipeError(f"--memory-cap {quantity(memory_cap, wl.memory_unit)} is impossible: every schedule "
                         f"holds at least one LLM layer's activations ({quantity(floor, wl.memory_unit)}) "
                         f"on a device")
    say = progress or (lambda _: None)
    unit = wl.time_unit or "units"  # the progress line's makespans
    t0 = time.perf_counter()
    P, M = devices, microbatches
    seen: dict[str, Candidate] = {}

    def run(term: str) -> Candidate | None:
        try:
            ev = evaluate(term, wl, max_ops=max_ops)
        except MpipeError:
            return None  # a size this generator refuses (m not a multiple of p, ...)
        c = Candidate(ev.term, ev.timeline.makespan, max(ev.metrics.peak_memory, default=0.0),
                      ev.metrics.lower_bound)
        seen.setdefault(c.term, c)
        best = min(seen.values(), key=lambda x: x.makespan)
        say(f"[{len(seen)}] {time.perf_counter() - t0:5.1f} s  makespan {quantity(c.makespan, unit):<12} "
            f"{c.term}   (best {quantity(best.makespan, unit)})")
        return c

    # The baselines: the best plain generator (encoders fused on the first
    # stage) and the best balanced static split of one, over every generator.
    plain: list[Candidate] = []
    splits: list[Candidate] = []
    bodies = []
    for name, extra in BODIES:
        body = f"{name}(p={P}, m={M}{extra})"
        c = run(body)
        if c is None:
            continue
        bodies.append(body)
        plain.append(c)
        split = run(f"balanced({body})")
        if split is not None:
            splits.append(split)
        if name in ("1f1b", "interleaved"):
            run(f"defer_w(split_bw({body}))")
    if not plain:
        raise MpipeError(f"no generator fits P={P}, M={M} on this workload: "
                         f"{_why(f'1f1b(p={P}, m={M})', wl, max_ops)}")
    fused = min(plain, key=lambda c: c.makespan)
    balanced = min(splits, key=lambda c: c.makespan) if splits else fused
    trainable = any(e.trainable for e in wl.encoders)
    if wl.encoders:
        if P > 1:
            run(f"encoder_stage(1f1b(p={P - 1}, m={M}))")
            run(f"encoder_stage(zbv(p={P - 1}, m={M}))")
        prefix_best = {}  # backward option -> its best prefix transpose
        for body in bodies:
            for overflow in ("full", "min"):
                for backward in (", backward=recompute", ", backward=owner") if trainable else ("",):
                    c = run(f"transpose({body}, overflow={overflow}{backward})")
                    if c is not None:
                        prefix_best[backward] = min(prefix_best.get(backward, c.makespan), c.makespan)
        fastest = sorted(bodies, key=lambda b: _llm_alone(b, wl))[:DYNAMIC_BODIES]
        # The backward whose prefix transposes did better goes first.
        backwards = sorted(prefix_best, key=prefix_best.get) or [""]
        caps = ("",) if memory_cap is None else ("", f", memory_cap={float(memory_cap)!r}")
        # Most promising first (better backward, sharded, fastest body), so the time limit cuts the rest.
        dynamic = [f"transpose({body}, mode=dynamic{backward}, shards={shards}{cap})"
                   for backward in backwards for shards in SHARDS_BY_PROMISE for body in fastest for cap in caps]
        for term in dynamic:
            if time.perf_counter() - t0 > time_limit:
                say(f"time limit {time_limit:g}s reached: {len(dynamic) - dynamic.index(term)} dynamic "
                    f"transposes not tried")
                break
            run(term)
    everything = sorted(seen.values(), key=lambda c: (c.makespan, c.peak_memory, c.term))
    fitting = [c for c in everything if memory_cap is None or c.peak_memory <= memory_cap + 1e-12]
    if not fitting:
        least = min(everything, key=lambda c: c.peak_memory)
        raise MpipeError(f"--memory-cap {quantity(memory_cap, wl.memory_unit)} is impossible: the least memory "
                         f"any candidate needs is {quantity(least.peak_memory, wl.memory_unit)} ({least.term})")
    lower = min(c.lower_bound for c in everything)
    return TuneResult(lower, fused, balanced, fitting, pareto_front(fitting),
                      seconds=time.perf_counter() - t0)


def _llm_alone(body: str, wl: Workload) -> float:
    """The body's makespan without its encoders: what a transpose can reach."""
    alone = replace(wl, encoders=())
    return evaluate(body, alone).timeline.makespan


def _why(term: str, wl: Workload, max_ops: int | None = None) -> str:
    try:
        evaluate(term, wl, max_ops=max_ops)
    except MpipeError as error:
        return error.message
    return "unknown"
