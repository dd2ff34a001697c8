"""`mpipe tune`: search the algebra for the schedule to run, on N devices in all.

Phases, cheapest first:

1. Every generator (and its `v`) on all N devices as is (the *fused*
   baseline), with split/deferred weight gradients, `balanced` (the
   *balanced* baseline), `colocated` (Megatron MIMO), and every prefix
   transpose (overflow x backward); `encoder_stage` on N - 1 LLM devices; and
   `disaggregate(t(p=N-k), encoder_devices=k)` for the encoder-device counts
   k worth trying (`encoder_device_counts`), over the LLM bodies fastest on
   their own.
2. Dynamic transposes (backward x shards, and the memory cap when one is
   given) over those bodies, best body first.
3. `encoder_batch` with k in 2, 4, 8 (where M allows) around the best term of
   each family (fused, colocated, transpose, disaggregate, encoder_stage).

4. Under a memory cap (peak memory: static + activations), the fastest
   candidates that miss it get recompute variants (`fit.py`), in the last
   quarter of the time limit.

Every candidate is an `evaluate` of its own canonical term, so `mpipe eval
TERM` reproduces its figures exactly.  The time limit stops phases 2 to 4
(saying how many terms it left out); phase 1 always runs.  An error in
phases 2 to 4 raises `SearchStopped`, which carries every candidate
evaluated until then (`mpipe tune` prints them before the error).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.ir.schedule import Pipeline
from mpipe_core.search.fit import NothingFitsError, family, family_reasons, recompute_to_fit
from mpipe_core.simulation.chunks import chunk_costs
from mpipe_core.simulation.metrics import within
from mpipe_core.workloads.units import quantity
from mpipe_core.workloads.workload import Workload, load_workload

# (generator, extra arguments) the search tries as LLM bodies.
BODIES = (
    ("1f1b", ""), ("gpipe", ""), ("interleaved", ", v=2"), ("interleaved", ", v=4"), ("looped_bfs", ", v=2"),
    ("zb_h1", ""), ("zb_h2", ""), ("zbv", ""), ("dualpipev", ""),
)
SHARDS_BY_PROMISE = (4, 1, 2)
DYNAMIC_BODIES = 3  # how many of the fastest LLM bodies get dynamic transposes (and disaggregate)
ENCODER_BATCHES = (2, 4, 8)  # encoder_batch's k beyond 1 (the plain term)
# The families phase 3 groups encoders around (besides fused): a term's outermost placement
# (`family`), under any encoder_batch.  Not balanced: it folds the encoders into the chain, and
# encoder_batch refuses a term without encoder ops.
FAMILIES = ("colocated", "disaggregate", "transpose", "encoder_stage")


@dataclass(frozen=True)
class Candidate:
    term: str
    makespan: float
    peak_memory: float  # the most loaded device's peak memory (static + activations)
    lower_bound: float  # this schedule's own bound
    static_memory: float = 0.0  # the largest static memory of any device
    fits: bool | None = None  # within the device's capacity (None: capacity unknown)
    # An analytic workload's step figures (step_time_s, mfu, ...; `StepFigures.as_dict`), else None.
    step: dict | None = field(default=None, compare=False)

    def as_dict(self, lower_bound: float, pareto: bool) -> dict:
        return {"term": self.term, "makespan": self.makespan, "peak_memory": self.peak_memory,
                "efficiency": lower_bound / self.makespan if self.makespan else 1.0, "pareto": pareto,
                "static_memory": self.static_memory, "fits": self.fits, **(self.step or {})}


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
    # The best of each layout practitioners deploy (None: not applicable, e.g. no encoders).
    colocated: Candidate | None = None
    disaggregated: Candidate | None = None
    transpose: Candidate | None = None
    not_tried: int = 0  # terms the time limit left out
    memory_cap: float | None = None  # the cap the candidates were kept under
    capacity: float | None = None  # the workload's device memory (None: unknown)
    over_cap: list[Candidate] = field(default_factory=list)  # evaluated but over the memory cap, by makespan

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    @property
    def fitting_front(self) -> set[str]:
        """The makespan / memory front of the candidates that fit the device
        (`pareto` when every candidate does, or its memory is unknown)."""
        fitting = [c for c in self.candidates if c.fits is not False]
        return self.pareto if len(fitting) == len(self.candidates) else pareto_front(fitting)

    def over_cap_by(self, c: Candidate) -> float:
        """How far `c`'s peak memory is over the memory cap (0: within it, or no cap)."""
        return 0.0 if _within(c, self.memory_cap) else c.peak_memory - self.memory_cap

    def baselines(self) -> dict[str, Candidate | None]:
        return {"fused": self.fused, "balanced": self.balanced, "colocated": self.colocated,
                "disaggregated": self.disaggregated, "transpose": self.transpose}

    def as_dict(self, top: int | None = None) -> dict:
        shown = [c for i, c in enumerate(self.candidates) if top is None or i < top or c.term in self.pareto]

        def base(c: Candidate | None) -> dict | None:
            return None if c is None else {"term": c.term, "makespan": c.makespan, "peak_memory": c.peak_memory,
                                           "static_memory": c.static_memory, "fits": c.fits}

        return {
            "lower_bound": self.lower_bound,
            "baselines": {name: base(c) for name, c in self.baselines().items()},
            "candidates": [c.as_dict(self.lower_bound, c.term in self.pareto) for c in shown],
            "best": self.best.as_dict(self.lower_bound, self.best.term in self.pareto),
            "optimal": self.optimal,
            "memory_cap": self.memory_cap,
            "capacity": self.capacity,
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


def check_encoder_devices(devices: int, counts) -> tuple[int, ...]:
    """The encoder-device counts a user asked for, each leaving the LLM a device."""
    counts = tuple(counts)
    for k in counts:
        if k < 1:
            raise MpipeError(f"--encoder-devices must be >= 1 (got {k})")
        if k >= devices:
            raise MpipeError(f"--encoder-devices {k} leaves no device for the LLM: it must be less than "
                             f"--devices ({devices})")
    return counts


def encoder_device_counts(wl: Workload, devices: int, microbatches: int) -> tuple[int, ...]:
    """k worth giving the encoders at N devices: 1, 2, and the counts next to
    (and twice) the encoders' share of the essential work, N x E / (E + L),
    where the encoder devices and the LLM's are equally loaded."""
    if devices < 2 or not wl.encoders:
        return ()
    M = microbatches
    encoder = sum(sum(e.costs("F", M)) + (sum(e.costs("BW", M)) if e.trainable else 0.0) for e in wl.encoders)
    llm = 0.0
    for chunks in (devices - 1, 1):  # a split the LLM allows (measured chunk_costs fix the count)
        try:
            costs = chunk_costs(Pipeline(0, chunks, M), wl).llm
        except MpipeError:
            continue
        llm = M * sum(costs["F"]) + M * sum(costs["BW"])
        break
    share = devices * encoder / (encoder + llm) if encoder + llm > 0 else 1.0
    wanted = {1, 2, math.floor(share), math.ceil(share), 2 * math.ceil(share)}
    return tuple(sorted(k for k in wanted if 1 <= k < devices))


def pipeline_devices(wl: Workload, devices_in_all: int) -> int:
    """The pipeline's devices when `devices_in_all` devices run `wl`: each pipeline
    device is tp x cp devices and the pipeline is replicated dp times (an analytic
    workload's parallel section; 1 each for explicit costs)."""
    step = wl.step
    per = 1 if step is None else step.tp * step.cp * step.dp
    if devices_in_all < 1:
        return devices_in_all  # `tune` refuses it, with --microbatches
    if devices_in_all % per:
        raise MpipeError(f"--devices {devices_in_all} is not a multiple of tp·cp·dp = {per} (tp={step.tp}, "
                         f"cp={step.cp}, dp={step.dp}): every pipeline device is {per} devices; give devices in "
                         f"all, e.g. --devices {per * max(1, devices_in_all // per)}")
    return devices_in_all // per


def tune(workload: Workload | dict | str | None, devices: int, microbatches: int, memory_cap: float | None = None,
         time_limit: float = 45.0, progress: Callable[[str], None] | None = None,
         encoder_devices: tuple[int, ...] | None = None, cap_is_capacity: bool = False,
         max_ops: int | None = None) -> TuneResult:
    """Search the algebra on `devices` devices in all; raise MpipeError if
    nothing fits under `memory_cap` (`cap_is_capacity`: the cap is the
    device's capacity, not one the user chose).  `encoder_devices`: the
    counts `disaggregate` tries (default: `encoder_device_counts`).  Candidates
    above `max_ops` ops (default: the core's limit) are skipped.

    Each baseline is the fastest of its family that fits under the cap, or,
    when none of that family fits, the fastest of it (its `fits` says so)."""
    wl = load_workload(workload)
    if devices < 1 or microbatches < 1:
        raise MpipeError(f"--devices and --microbatches must be >= 1 (got {devices}, {microbatches})")
    if encoder_devices is not None:
        encoder_devices = check_encoder_devices(devices, encoder_devices)
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
        if term in seen:
            return seen[term]
        try:
            ev = evaluate(term, wl, max_ops=max_ops)
        except MpipeError:
            return None  # a size this generator refuses (m not a multiple of p, ...)
        c = Candidate(ev.term, ev.timeline.makespan, max(ev.metrics.peak_memory, default=0.0),
                      ev.metrics.lower_bound, max(ev.metrics.static_memory, default=0.0), ev.metrics.fits,
                      ev.step.as_dict() if ev.step is not None else None)
        seen.setdefault(term, c)
        seen.setdefault(c.term, c)
        best = min(seen.values(), key=lambda x: x.makespan)
        say(f"[{len(set(x.term for x in seen.values()))}] {time.perf_counter() - t0:5.1f} s  makespan "
            f"{quantity(c.makespan, unit):<12} {c.term}   (best {quantity(best.makespan, unit)})")
        return c

    # Phase 1.  The baselines: the best plain generator (encoders fused on
    # the first stage) and the best balanced static split of one.
    plain: list[Candidate] = []
    bodies = []
    for name, extra in BODIES:
        body = f"{name}(p={P}, m={M}{extra})"
        c = run(body)
        # Even where the body alone is refused: balanced folds the encoders' layers into the
        # chain, which may give it the layers its chunks need (interleaved v=4 on an 8-layer LLM).
        run(f"balanced({body})")
        if c is None:
            continue
        bodies.append(body)
        plain.append(c)
        if name in ("1f1b", "interleaved"):
            run(f"defer_w(split_bw({body}))")
    if not plain:
        raise MpipeError(f"no generator fits P={P}, M={M} on this workload: "
                         f"{_why(f'1f1b(p={P}, m={M})', wl, max_ops)}")
    trainable = any(e.trainable for e in wl.encoders)
    later: list[str] = []  # phases 2 and 3, in the order the time limit cuts them
    if wl.encoders:
        fastest = sorted(bodies, key=lambda b: _llm_alone(b, wl))[:DYNAMIC_BODIES]
        for body in bodies:
            run(f"colocated({body})")
        if P > 1:
            run(f"encoder_stage(1f1b(p={P - 1}, m={M}))")
            run(f"encoder_stage(zbv(p={P - 1}, m={M}))")
        counts = encoder_device_counts(wl, P, M) if encoder_devices is None else encoder_devices
        for k in counts:
            for body in fastest:
                run(f"disaggregate({body.replace(f'(p={P},', f'(p={P - k},')}, encoder_devices={k})")
        prefix_best = {}  # backward option -> its best prefix transpose
        for body in bodies:
            for overflow in ("full", "min"):
                for backward in (", backward=recompute", ", backward=owner") if trainable else ("",):
                    c = run(f"transpose({body}, overflow={overflow}{backward})")
                    if c is not None:
                        prefix_best[backward] = min(prefix_best.get(backward, c.makespan), c.makespan)
        # Phase 2: the backward whose prefix transposes did better goes first,
        # then sharded, fastest body first, so the time limit cuts the rest.
        backwards = sorted(prefix_best, key=prefix_best.get) or [""]
        caps = ("",) if memory_cap is None else ("", f", memory_cap={float(memory_cap)!r}")
        later = [f"transpose({body}, mode=dynamic{backward}, shards={shards}{cap})"
                 for backward in backwards for shards in SHARDS_BY_PROMISE for body in fastest for cap in caps]
    try:
        not_tried = _later_phases(later, plain, run, seen, wl, M, memory_cap, t0, time_limit, say)
    except MpipeError as error:  # a failure after a long search keeps what it found
        raise SearchStopped(error.message, _ranked(seen), min(c.lower_bound for c in seen.values())) from None
    everything = _ranked(seen)
    fitting = [c for c in everything if _within(c, memory_cap)]
    if not fitting:
        reasons = family_reasons(everything, memory_cap, wl.memory_unit)
        for line in reasons:
            say(line)
        least = min(everything, key=lambda c: c.peak_memory)
        if cap_is_capacity:
            raise NothingFitsError(f"no schedule fits the device's {quantity(memory_cap, wl.memory_unit)} of "
                                   f"memory: the least any candidate needs is "
                                   f"{quantity(least.peak_memory, wl.memory_unit)} ({least.term}); --memory-cap "
                                   f"none searches without a cap", reasons)
        raise NothingFitsError(f"--memory-cap {quantity(memory_cap, wl.memory_unit)} is impossible: the least "
                               f"memory any candidate needs is {quantity(least.peak_memory, wl.memory_unit)} "
                               f"({least.term})", reasons)
    lower = min(c.lower_bound for c in everything)

    def baseline(candidates: list[Candidate]) -> Candidate | None:
        """The fastest that fits, else the fastest."""
        ranked = sorted(candidates, key=lambda c: (not _within(c, memory_cap), c.makespan, c.peak_memory, c.term))
        return ranked[0] if ranked else None

    by_family: dict[str, list[Candidate]] = {}
    for c in everything:
        by_family.setdefault(family(c.term), []).append(c)
    # fused: a plain generator, or its recompute variant (phase 4); grouped encoders are a strategy of their own.
    fused = baseline(plain + [c for c in by_family.get("fused", [])
                              if c.term.startswith("recompute(") and "encoder_batch(" not in c.term])
    balanced = baseline(by_family.get("balanced", [])) or fused
    return TuneResult(lower, fused, balanced, fitting, pareto_front(fitting), seconds=time.perf_counter() - t0,
                      colocated=baseline(by_family.get("colocated", [])),
                      disaggregated=baseline(by_family.get("disaggregate", [])),
                      transpose=baseline(by_family.get("transpose", [])), not_tried=not_tried,
                      memory_cap=memory_cap, capacity=wl.capacity,
                      over_cap=[c for c in everything if not _within(c, memory_cap)])


def _later_phases(later: list[str], plain: list[Candidate], run, seen: dict[str, Candidate], wl: Workload,
                  M: int, memory_cap: float | None, t0: float, time_limit: float, say) -> int:
    """Phases 2 to 4; how many terms the time limit left out."""
    # Phases 2 and 3 stop at the time limit; under a memory cap they leave its
    # last quarter to phase 4.
    search_limit = time_limit if memory_cap is None else 0.75 * time_limit
    not_tried = _run_until(later, run, t0, search_limit, say, "dynamic transposes")
    # Phase 3: encoder groups around each family's best (after phase 2: its best transpose).
    if wl.encoders:
        batches = [k for k in ENCODER_BATCHES if k <= M]
        best_of = _best_by_family(seen.values(), plain)
        grouped = [f"encoder_batch({c.term}, {k})" for c in best_of.values() for k in batches]
        not_tried += _run_until(grouped, run, t0, search_limit, say, "encoder_batch terms")
    # Phase 4: recompute variants of the fastest candidates that miss the cap.
    if memory_cap is not None:
        not_tried += recompute_to_fit(_ranked(seen), run, wl, memory_cap, t0 + time_limit, say)
    return not_tried


def _ranked(seen: dict[str, Candidate]) -> list[Candidate]:
    """Every candidate evaluated once, fastest first (ties: the least memory, then the term)."""
    return sorted({c.term: c for c in seen.values()}.values(), key=lambda c: (c.makespan, c.peak_memory, c.term))


class SearchStopped(MpipeError):
    """The search failed after phase 1; `found`: every candidate it had evaluated
    (fastest first, fitting or not), `lower_bound` the lowest of their bounds."""

    def __init__(self, message: str, found: list[Candidate], lower_bound: float):
        super().__init__(f"the search stopped after {len(found)} candidates: {message}")
        self.found = list(found)
        self.lower_bound = lower_bound


def _within(c: Candidate, memory_cap: float | None) -> bool:
    return memory_cap is None or within(c.peak_memory, memory_cap)


def _run_until(terms: list[str], run, t0: float, time_limit: float, say, what: str) -> int:
    """Run `terms` in order until the time limit; how many it left out."""
    for i, term in enumerate(terms):
        if time.perf_counter() - t0 > time_limit:
            say(f"time limit {time_limit:g}s reached: {len(terms) - i} {what} not tried")
            return len(terms) - i
        run(term)
    return 0


def _best_by_family(candidates, plain: list[Candidate]) -> dict[str, Candidate]:
    """The fastest candidate of each of FAMILIES (ties: the least memory, then
    the term); "fused": the fastest of `plain`, if given."""
    best: dict[str, Candidate] = {}
    for c in sorted(candidates, key=lambda c: (c.makespan, c.peak_memory, c.term)):
        if family(c.term) in FAMILIES:
            best.setdefault(family(c.term), c)
    if plain:
        best["fused"] = min(plain, key=lambda c: c.makespan)
    return best


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
