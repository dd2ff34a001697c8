"""The planner behind per_batch(t): a plan for one drawn batch, within a time budget.

The static plan S is `t` evaluated once on the workload's mean microbatch
(`api.costed`).  For each batch the planner tries, cheapest first, and keeps
the shortest makespan on that batch's own costs:

1. S as it is (always: the static plan is a candidate, so a plan is never
   slower than S on its batch);
2. given the batch's packs (`plan(..., packs=...)`), the step's samples
   re-composed into as many microbatches within the packing limits
   (`data.regroup`: the same samples, so the same gradient), tiles and
   tokens evened out: where S has encoder shares (each microbatch's encoder
   work on one device, as `colocated` splits it) the tiles of each device's
   share, else each microbatch's, in the first of the orders below;
   then the drawn microbatches in another order, S's op orders unchanged:
   dealt to S's encoder shares (heaviest first, each to the share with the
   least encoder work that has a slot left), heaviest encoder work first,
   lightest first;
3. `encoder_batch`'s other group sizes (k/2 and 2k, built once on the mean
   batch), on the best order so far;
4. with a `transpose` in t (either mode: the encoder is on every device),
   the encoder ops placed again around S's LLM order for this batch's costs: the front-loaded
   least-loaded placement, then the earliest-arrival placement with as many
   rounds (each a simulation) as the budget leaves, at most as many as
   mode=dynamic itself runs, and if time is left the same with twice S's
   shards (a heavy microbatch's encoder work split over two devices).

What is not re-planned: the layer split (`balanced`, `partition`).  Moving
layers between ranks from one step to the next moves their parameters,
gradients and optimizer state; per_batch refuses to price that and keeps the
split S has.

Memory: with a device capacity the plan kept is the fastest candidate whose
peak memory on the batch's own costs fits it (`metrics.peak_fits`; a
re-composed microbatch of long packs holds more than the static plan's), or,
where the static plan is over it already, needs no more than the static plan;
the search leaves the time of that check in the budget.  The static plan is
the user's and is kept when nothing faster fits.

Budget: CPU time of this process (one core), `BUDGET_MS` by default.  A
step is started only if the time it is predicted to take (its simulations at
the cost of this batch's first one; a re-placement round at the cost measured
once when the planner is built; each at the most it was seen to take in its
last RECENT runs) fits in what is left; a candidate that ends past the budget is thrown away (the step has
begun with what was ready).  A batch whose costs are the mean batch's gets
S without search.
"""
from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable

from mpipe_core.algebra.combinators.transpose import replace_encoders
from mpipe_core.algebra.terms.ast import Call
from mpipe_core.api import costed, evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.chunks import folds_encoders
from mpipe_core.simulation.metrics import peak_fits, within
from mpipe_core.simulation.simulator import Timeline, simulate
from mpipe_core.data.regroup import regroup
from mpipe_core.workloads.batch_costs import microbatch_workload, permuted
from mpipe_core.workloads.workload import Workload

BUDGET_MS = 50.0
CALIBRATION_ROUNDS = 4
# Predictions are padded by this much: a step that ends past the budget is wasted time.
MARGIN = 1.25
MAX_REPLACE_SIMULATIONS = 48  # what mode=dynamic itself runs at most
RECENT = 8  # predictions use the most of the last RECENT observations of a step


@dataclass(frozen=True)
class Plan:
    schedule: Schedule
    workload: Workload  # the batch's costs, microbatches in the plan's order
    order: tuple[int, ...]  # slot s runs microbatch order[s] (of `packs` when regrouped, else as drawn)
    makespan: float
    static_makespan: float
    plan_ms: float
    how: str
    fallback: bool  # the budget left a step untried (or threw one away)
    packs: tuple | None = None  # the step's samples re-composed (`data.regroup`); None: the drawn packs
    # The plan simulated on the batch, and its worst device's peak memory where the planner
    # checked it against the device's (None: not checked here).
    timeline: Timeline | None = field(default=None, compare=False, repr=False)
    peak_memory: float | None = None


def _calls(term: Call):
    stack = [term]
    while stack:
        call = stack.pop()
        yield call
        stack.extend(v for _, v in call.kwargs if isinstance(v, Call))


def _with_k(term: Call, k: int) -> Call:
    """`term` with its encoder_batch group size set to k."""
    if term.name == "encoder_batch":
        return replace(term, kwargs=tuple((key, k if key == "k" else v) for key, v in term.kwargs))
    return replace(term, kwargs=tuple((key, _with_k(v, k) if isinstance(v, Call) else v) for key, v in term.kwargs))


def inner_term(term: Call) -> tuple[Call, bool]:
    """(the term to plan, whether it is per_batch's); per_batch only outermost."""
    wrapped = term.name == "per_batch"
    inner = term.kw("term") if wrapped else term
    if any(c.name == "per_batch" for c in _calls(inner)):
        raise MpipeError("per_batch(...) goes around the whole term (it plans the whole step per batch)")
    return inner, wrapped


class Planner:
    """Plans one pipeline's step per batch (see the module's docstring)."""

    def __init__(self, term: Call, workload: Workload, max_ops: int | None = None):
        started = time.process_time()
        self.term, _ = inner_term(term)
        self.source = workload
        self.mean = costed(self.term, workload)
        self.static = evaluate(self.term, self.mean, max_ops=max_ops).schedule
        self.microbatches = self.static.pipelines[0].microbatches
        single = len(self.static.pipelines) == 1 and bool(self.static.encoders) and \
            not folds_encoders(self.static.pipelines)
        # Any transpose replicates the encoder on every device, so its ops may
        # move between them from one batch to the next (prefix's rule included).
        self.replaceable = single and any(c.name == "transpose" for c in _calls(self.term))
        self.shares = encoder_shares(self.static)
        self.alternatives: list[tuple[str, Schedule]] = []
        groups = [c.kw("k") for c in _calls(self.term) if c.name == "encoder_batch"]
        if len(groups) == 1:
            k = groups[0]
            for other in sorted({max(1, k // 2), min(self.microbatches, 2 * k)} - {k}):
                alt = evaluate(_with_k(self.term, other), self.mean, max_ops=max_ops).schedule
                self.alternatives.append((f"encoder_batch k={other}", alt))
        # What steps were seen to take lately (the last RECENT of each): a round of re-placement by shard
        # count, in ms; a step kind, in simulations of its batch.  Predictions use the most of those, so
        # one slow step on a loaded machine does not shut a step out for the rest of the run.
        self._round_ms: dict[int, deque] = {}
        self._checks_seen: deque = deque(maxlen=RECENT)  # a memory check's CPU ms (`_fitting`)
        self._sims_seen: dict[str, deque] = {}
        # What the balanced re-placement and one round of the earliest-arrival one cost (its simulation
        # and the search of the gaps), measured once on the mean batch.
        self._shards = 1 + max((op.chunk for order in self.static.orders for op in order
                                if op.module in self.static.encoders and op.kind == "F"), default=0)
        if self.replaceable:
            fresh = replace(self.mean)  # (another object: the simulator's memory of recent ones misses)
            probe = time.process_time()
            simulate(self.static, fresh, check=False, remember=False)
            one = max(time.process_time() - probe, 1e-6)
            probe = time.process_time()
            placed = replace_encoders(self.static, fresh, 0, balanced=True)
            simulate(placed, fresh, check=False, remember=False)
            _seen(self._sims_seen, "balanced", (time.process_time() - probe) / one)
            probe = time.process_time()
            replace_encoders(self.static, self.mean, CALIBRATION_ROUNDS)
            _seen(self._round_ms, self._shards, (time.process_time() - probe) * 1e3 / CALIBRATION_ROUNDS)
        self.setup_ms = (time.process_time() - started) * 1e3

    @property
    def note(self) -> str | None:
        """One line when only the microbatches' order and composition can change."""
        if self.replaceable or self.alternatives:
            return None
        return (f"per_batch({self.term}): no transpose or encoder_batch to re-plan; only the "
                f"microbatches' order and composition change per batch")

    def plan(self, batch: Workload, budget_ms: float = BUDGET_MS, packs: tuple | None = None) -> Plan:
        """The plan for one batch's costs (`batch`: its microbatches as drawn); given
        `packs` (what those microbatches hold), re-composing them is a candidate too."""
        # A full collection of a big heap (a process that also ran tune) took 200 ms here:
        # no collection while planning, as `api.evaluate` does.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._plan(batch, budget_ms, packs)
        finally:
            if was_enabled:
                gc.enable()

    def _plan(self, batch: Workload, budget_ms: float, packs: tuple | None) -> Plan:
        started = time.process_time()

        def elapsed() -> float:
            return (time.process_time() - started) * 1e3

        M = self.microbatches
        identity = tuple(range(M))
        static_timeline = simulate(self.static, batch, check=False, remember=False)
        static = static_timeline.makespan
        sim_ms = max(elapsed(), 1e-3)
        if batch == self.mean:
            return Plan(self.static, batch, identity, static, static, elapsed(), "static (the mean batch)", False,
                        timeline=static_timeline)
        # the best so far: makespan, schedule, costs in slot order, order, how, regrouped packs
        best = [static, self.static, batch, identity, "static", None]
        tried: list[list] = []  # every plan simulated: best's fields and its timeline
        fallback = False
        # With a device capacity the plan kept must fit it (`_fitting`): the search leaves time for that.
        first_check_ms = 0.5 * sim_ms  # (before any check was seen: what `_fitting` guesses too)
        check_ms = MARGIN * max(self._checks_seen or (first_check_ms,)) if batch.capacity is not None else 0.0
        search_ms = budget_ms - check_ms

        def attempt(label: str, predicted_ms: float, build: Callable[[], tuple], kind: str = "simulation"):
            """Run a step if it fits; `kind`'s cost (in simulations of this batch) is
            predicted at the most it was seen to take, and at least `predicted_ms`.
            `build` gives (schedule, costs, order, regrouped packs or None), or None."""
            nonlocal fallback
            predicted_ms = max(predicted_ms, max(self._sims_seen.get(kind, (0.0,))) * sim_ms)
            if elapsed() + MARGIN * predicted_ms > search_ms:
                fallback = True
                return
            before = elapsed()
            built = build()
            if built is None:
                return
            schedule, wl, order, regrouped_packs = built
            timeline = simulate(schedule, wl, check=False, remember=False)
            makespan = timeline.makespan
            if kind != "re-placement":  # (rounds vary: those learn per round, below)
                _seen(self._sims_seen, kind, (elapsed() - before) / sim_ms)
            if elapsed() > search_ms:
                fallback = True  # too late for this step
                return
            tried.append([makespan, schedule, wl, order, label, regrouped_packs, timeline])
            if makespan < best[0] * (1 - 1e-12):
                best[:] = tried[-1][:6]

        if packs is not None and self.source.data is not None:  # the most promising first
            data = self.source.data
            regrouped: list = []

            def recompose():
                again = regroup(packs, data.tokens, data.packing, self.shares)
                if again is None:
                    return None
                costs = microbatch_workload(self.source, again)
                if self.shares is not None:  # (dealt to the shares already)
                    label, order = "over the encoder shares", identity
                else:
                    label, order = (self._orders(costs) or [("as regrouped", identity)])[0]
                regrouped.append(f"regrouped, {label}")
                return self.static, permuted(costs, order), order, again

            # (the deal costs a quarter of a simulation at P16 M64)
            attempt("regrouped", 1.25 * sim_ms, recompose, "regroup")
            if regrouped and tried and tried[-1][5] is not None:
                tried[-1][4] = regrouped[0]
                if best[5] is not None:
                    best[4] = regrouped[0]
        orders = self._orders(batch)
        if orders:  # the order most likely to help first
            label, order = orders.pop(0)
            attempt(label, sim_ms, lambda o=order: (self.static, permuted(batch, o), o, None))
        if self.replaceable:
            base_wl, base_order, base_how, base_packs = best[2], best[3], best[4], best[5]
            tag = _composition(base_how)
            attempt(f"re-placed (balanced){tag}", 1.5 * sim_ms,
                    lambda: (replace_encoders(self.static, base_wl, 0, balanced=True), base_wl, base_order,
                             base_packs), "balanced")
        for label, order in orders:
            attempt(label, sim_ms, lambda o=order: (self.static, permuted(batch, o), o, None))
        for label, alt in self.alternatives:
            tag = _composition(best[4])
            attempt(label + tag, sim_ms, lambda a=alt: (a, best[2], best[3], best[5]))
        if self.replaceable:
            base_wl, base_order, base_how, base_packs = best[2], best[3], best[4], best[5]
            tag = _composition(base_how)

            round_ms = [0.0]

            def late() -> bool:  # one more round would leave no time for the simulation that closes the step
                return elapsed() + MARGIN * (round_ms[0] + sim_ms) > search_ms

            for shards in (self._shards, 2 * self._shards):  # then a heavy microbatch over two devices
                per_round = max(self._round_ms[shards]) if shards in self._round_ms else \
                    2.0 * max(self._round_ms[self._shards])  # (not seen yet)
                round_ms[0] = per_round
                # as many rounds as the time left allows (one simulation closes the step)
                rounds = min(MAX_REPLACE_SIMULATIONS,
                             int(((search_ms - elapsed()) / MARGIN - 1.5 * sim_ms) / max(per_round, 1e-3)))
                if rounds < 2:
                    fallback = True
                    break
                label = "" if shards == self._shards else f", {shards} shards"
                before = elapsed()
                attempt(f"re-placed (earliest arrival{label}){tag}", rounds * per_round + sim_ms,
                        lambda r=rounds, k=shards: (replace_encoders(self.static, base_wl, r, shards=k, stop=late),
                                                    base_wl, base_order, base_packs), "re-placement")
                spent = elapsed() - before
                if spent > sim_ms:  # it ran: what a round really cost
                    _seen(self._round_ms, shards, (spent - sim_ms) / rounds)
        chosen, peak, cut = self._fitting(tried, (static, batch, static_timeline), batch.capacity, budget_ms,
                                          elapsed, first_check_ms)
        makespan, schedule, wl, order, how, regrouped_packs, timeline = \
            chosen or (static, self.static, batch, identity, "static", None, static_timeline)
        return Plan(schedule, wl, order, makespan, static, elapsed(), how, fallback or cut, regrouped_packs,
                    timeline, peak)

    def _fitting(self, tried: list[list], static: tuple, capacity: float | None, budget_ms: float,
                 elapsed: Callable[[], float], first_guess_ms: float) -> tuple[list | None, float | None, bool]:
        """(the fastest plan faster than static that fits, None for static; its peak where
        checked; whether the budget stopped the checks).  A re-composed or re-placed batch
        can hold more than the static plan on it (a long pack's activations on one
        device), so each is checked on its own costs, fastest first.  It fits if it is
        within the device's memory, or, where the static plan (the user's) is over it
        already, if it needs no more than that plan."""
        makespan, costs, timeline = static
        faster = sorted((e for e in tried if e[0] < makespan * (1 - 1e-12)), key=lambda e: e[0])
        if capacity is None or not faster:
            return (faster[0] if faster else None), None, False
        limit = None  # the static plan's peak, once a candidate over the device's memory asks for it

        def peak_of(schedule, wl, tl) -> float | None:  # None: no time left for the check
            if elapsed() + MARGIN * max(self._checks_seen or (first_guess_ms,)) > budget_ms:
                return None
            before = elapsed()
            worst = peak_fits(schedule, wl, tl, capacity)[0]
            self._checks_seen.append(elapsed() - before)
            return worst

        over = 0
        for entry in faster:
            worst = peak_of(entry[1], entry[2], entry[6])
            if worst is None:
                return None, None, True
            fits = within(worst, capacity)
            if not fits:
                if limit is None:
                    limit = peak_of(self.static, costs, timeline)
                    if limit is None:
                        return None, None, True
                fits = limit > capacity and within(worst, limit)
            if fits:
                if over:
                    entry = entry[:4] + [f"{entry[4]} ({over} faster over memory)"] + entry[5:]
                return entry, worst, False
            over += 1
        return None, None, False

    def _orders(self, batch: Workload) -> list[tuple[str, tuple[int, ...]]]:
        """Other microbatch orders for `batch`, the most promising first: dealt to S's
        encoder shares (where it has them), heaviest first, lightest first."""
        weight = _heaviness(batch)
        identity = tuple(range(len(weight)))
        heavy = tuple(sorted(identity, key=lambda m: (-weight[m], m)))
        out = [("heavy first", heavy), ("light first", heavy[::-1])]
        if self.shares is not None:
            out.insert(0, ("dealt to the encoder shares", deal_to_shares(self.shares, weight)))
        seen = {identity}
        kept = []
        for label, order in out:
            if order not in seen:
                seen.add(order)
                kept.append((label, order))
        return kept


def _composition(how: str) -> str:
    """What a plan's label says of its microbatches (", regrouped, ...", ", heavy first"),
    without its placement or group size (a plan built from it starts from S's)."""
    if how == "static":
        return ""
    if how.startswith("re-placed"):
        rest = how.split("), ", 1)
        return f", {rest[1]}" if len(rest) == 2 else ""
    if how.startswith("encoder_batch k="):
        rest = how.split(", ", 1)
        return f", {rest[1]}" if len(rest) == 2 else ""
    return f", {how}"


def _seen(table: dict, key, value: float) -> None:
    table.setdefault(key, deque(maxlen=RECENT)).append(value)


def encoder_shares(schedule: Schedule) -> tuple[tuple[int, ...], ...] | None:
    """The slots whose encoder work each device runs, where every microbatch's
    encoder forward runs on one device and more than one device runs some
    (`colocated`'s shares); else None."""
    if not schedule.encoders or len(schedule.pipelines) != 1 or schedule.pipelines[0].encoder_batch != 1:
        return None
    encoders = set(schedule.encoders)
    owner: dict[int, int] = {}
    slots: list[list[int]] = []
    for device, order in enumerate(schedule.orders):
        mine = sorted({op.mb for op in order if op.module in encoders and op.kind == "F" and op.step == 0})
        for m in mine:
            if owner.setdefault(m, device) != device:
                return None
        if mine:
            slots.append(mine)
    if len(slots) < 2 or len(owner) != schedule.pipelines[0].microbatches:
        return None
    return tuple(tuple(s) for s in slots)


def deal_to_shares(shares: tuple[tuple[int, ...], ...], weight: list[float]) -> tuple[int, ...]:
    """An order (slot -> microbatch) that evens the shares' encoder work: heaviest
    microbatch first, each to the share with the least work that has a slot left
    (filled in slot order)."""
    load = [0.0] * len(shares)
    taken: list[list[int]] = [[] for _ in shares]
    for m in sorted(range(len(weight)), key=lambda m: (-weight[m], m)):
        g = min((g for g in range(len(shares)) if len(taken[g]) < len(shares[g])), key=lambda g: (load[g], g))
        taken[g].append(m)
        load[g] += weight[m]
    order = [0] * len(weight)
    for slots, ms in zip(shares, taken):
        for slot, m in zip(slots, ms):
            order[slot] = m
    return tuple(order)


def _heaviness(batch: Workload) -> list[float]:
    """Each microbatch's encoder work, ties broken by its LLM forward scale."""
    counts = batch.encoders[0].counts if batch.encoders and batch.encoders[0].counts else None
    scale = batch.llm.token_scale["F"] if batch.llm.token_scale else None
    M = len(counts or scale or ())
    return [(counts[m] if counts else 0.0) * 1e6 + (scale[m] if scale else 0.0) for m in range(M)]
