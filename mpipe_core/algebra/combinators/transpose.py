"""transpose: the encoder row becomes a column.

In the fused baseline every encoder op runs on the device of LLM chunk 0 while
later stages wait.  `transpose` replicates the encoder on every device and runs
its work elsewhere, leaving the LLM order untouched: removing every encoder op
from the result gives back the input's LLM order exactly.

* `mode=prefix` is the reference (MindSpore hyper-parallel's
  ScheduleMPipeTranspose): NT = min(P, M) microbatches are transposed; rank
  i < NT runs microbatch i's encoder forward at the very start of its order and
  (if i > 0) ships the features to rank 0.  Microbatch m >= NT goes to rank
  m mod NT (`overflow=full`, also at the start) or runs inline on rank 0 right
  before F(0, m) (`overflow=min`).  Rank 0 is the device of LLM chunk 0; the
  other ranks follow in device order.
* A trainable encoder opens every step with a parameter broadcast (BCAST on
  every device).  `backward=recompute`: rank 0 re-runs the forward of each
  microbatch another rank owns (R, from the shipped input) and its backward
  right after B(0, m).  `backward=owner`: the feature gradient goes back to the
  owner, which runs the backward after its LLM work, and an all-reduce (AR)
  over all devices closes the step.  A frozen encoder ships features only.
* `mode=dynamic` places each encoder op (optionally split into `shards`) on the
  device and idle gap where its output reaches the consumer earliest, within an
  optional per-device memory cap (static memory, with the encoder replica a
  device gains, plus activations); the result is the best of that
  placement, both prefix variants and the input placement, so it is never worse
  than any of them.
"""
from __future__ import annotations

import math
from collections import defaultdict
from itertools import chain
from operator import itemgetter
from typing import Callable

from mpipe_core.algebra.combinators.common import (
    CombineError,
    GroupCountdown,
    first_stage_first,
    refuse_own_encoder_devices,
)
from mpipe_core.errors import MpipeError
from mpipe_core.ir.ops import ALLREDUCE, BCAST, BW, NO_MICROBATCH, B, F, Op, R, W
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.chunks import folds_encoders
from mpipe_core.simulation.costs import grouped
from mpipe_core.workloads.units import quantity
from mpipe_core.workloads.workload import Workload

INF = float("inf")


# How many simulations one dynamic placement may run (see _dynamic): up to 48,
# fewer for big schedules so that about 400k ops are simulated in all.
MAX_SIMULATIONS, MIN_SIMULATIONS, SIMULATED_OPS_BUDGET = 48, 8, 400_000


def transpose(schedule: Schedule, workload: Workload, mode="prefix", overflow="full",
              backward="auto", shards=1, memory_cap=None, encoders="all") -> Schedule:
    if not workload.encoders:
        raise CombineError("transpose needs a workload with encoders (this one has none)")
    if folds_encoders(schedule.pipelines):
        raise CombineError("balanced(...) already folded the encoders into the LLM chunks "
                           "(transpose the inner term instead, or use partition)")
    refuse_own_encoder_devices(schedule, "transpose")
    selected = _selected(workload, encoders)
    if backward == "auto":
        backward = auto_backward(mode, selected)
        if backward == "auto":  # dynamic, trainable: whichever backward ends sooner
            from mpipe_core.simulation.simulator import simulate

            tried = [transpose(schedule, workload, mode, overflow, b, shards, memory_cap, encoders)
                     for b in ("recompute", "owner")]
            return min(tried, key=lambda s: simulate(s, workload, check=False).makespan)  # ties: recompute
    names = {e.name for e in selected}
    # The body: the LLM plus any encoder this transpose leaves where it was.
    body = schedule.with_orders(
        ([op for op in order if op.module not in names] for order in schedule.orders),
        encoders=tuple(n for n in schedule.encoders if n not in names),
    )
    if len(body.pipelines) != 1:
        raise CombineError("transpose works on a single pipeline (not par/overlay)")
    if mode == "prefix" and shards != 1:
        raise CombineError("shards > 1 needs mode=dynamic (the reference never splits a microbatch)")
    if mode == "prefix" and memory_cap is not None:
        raise CombineError("memory_cap needs mode=dynamic")
    prefix = _prefix(body, selected, overflow, backward)
    if mode == "prefix":
        return prefix
    from mpipe_core.simulation.simulator import simulate

    candidates = [_dynamic(body, workload, selected, backward, shards, memory_cap)]
    if memory_cap is None:
        candidates += [_balanced(body, workload, selected, shards, backward), prefix, _prefix(body, selected, "min" if overflow == "full" else "full", backward)]
        if schedule.encoders and schedule.devices == body.devices:
            candidates.append(schedule)
    # (built complete here: `evaluate` checks the one it keeps)
    return min(candidates, key=lambda s: simulate(s, workload, check=False).makespan)


def replace_encoders(schedule: Schedule, workload: Workload, simulations: int,
                     balanced: bool = False, shards: int | None = None,
                     stop: Callable[[], bool] | None = None) -> Schedule:
    """`schedule`'s encoder ops placed again for `workload`'s costs (a drawn
    batch's), around its unchanged LLM order: mode=dynamic's earliest-arrival
    placement within `simulations` simulations, or (`balanced`) the
    front-loaded least-loaded placement (no simulation).  The backward
    (owner or recompute) is the schedule's own, and so is the shard count
    unless `shards` says another.  `stop` (asked before each simulation): a
    caller out of time; the ops not placed by then stay inline on rank 0."""
    names = tuple(schedule.encoders)
    encs = tuple(workload.encoder(n) for n in names)
    body = schedule.with_orders(([op for op in order if op.module not in names] for order in schedule.orders),
                                encoders=())
    ops = [op for order in schedule.orders for op in order if op.module in names]
    backward = "owner" if any(op.kind == ALLREDUCE for op in ops) else "recompute"
    if shards is None:
        shards = 1 + max((op.chunk for op in ops if op.kind == F), default=0)
    if balanced:
        return _balanced(body, workload, encs, shards, backward)
    return _dynamic(body, workload, encs, backward, shards, None, simulations, stop)


# ----------------------------------------------------------------------------- helpers

def auto_backward(mode: str, encoders: tuple) -> str:
    """What `backward=auto` means: the reference's recompute for mode=prefix and
    for frozen encoders (no backward to place); for dynamic with a trainable
    encoder, "auto" (the caller tries both and keeps the shorter makespan)."""
    if mode == "prefix" or not any(e.trainable for e in encoders):
        return "recompute"
    return "auto"


def _selected(workload: Workload, encoders) -> tuple:
    value = encoders  # "all", a name, or a tuple of names
    if value == "all":
        return workload.encoders
    words = value if isinstance(value, tuple) else (value,)
    chosen = []
    for word in words:
        name = str(word)
        known = [e.name for e in workload.encoders]
        if name not in known:
            raise CombineError(f"transpose: unknown encoder '{name}' (this workload has: {', '.join(known)})")
        chosen.append(workload.encoder(name))
    return tuple(chosen)


def _ranks(body: Schedule) -> list[int]:
    """Rank 0 is the device that runs LLM chunk 0; the others follow in device order."""
    return first_stage_first(body)


def _split(body: Schedule) -> bool:
    return any(op.kind == B for op in body.ops())


def _backward_ops(name: str, shard: int, mb: int, step: int, split: bool) -> list[Op]:
    if split:
        return [Op(name, B, shard, mb, step), Op(name, W, shard, mb, step)]
    return [Op(name, BW, shard, mb, step)]


def _steps(body: Schedule) -> int:
    return body.pipelines[0].steps


def _by_step(order) -> dict[int, list[Op]]:
    groups: dict[int, list[Op]] = defaultdict(list)
    for op in order:
        groups[op.step].append(op)
    return groups


# ----------------------------------------------------------------------------- prefix

def _prefix(body: Schedule, encs: tuple, overflow: str, backward: str) -> Schedule:
    """The reference's placement: rank i < NT owns microbatch i, overflow
    round-robin (`full`) or inline on rank 0 (`min`)."""
    P, pipe = body.devices, body.pipelines[0]
    ranks = _ranks(body)
    units = [g for g, _ in pipe.groups()]  # microbatches, or their groups (`encoder_batch`)
    NT = min(P, len(units))
    owner: dict[tuple[int, int], int | None] = {}
    for i, g in enumerate(units):
        if i < NT:
            owner[(g, 0)] = ranks[i]
        elif overflow == "full":
            owner[(g, 0)] = ranks[i % NT]
        else:
            owner[(g, 0)] = None  # inline on rank 0
    return _front_loaded(body, encs, owner, 1, backward)


def _balanced(body: Schedule, workload: Workload, encs: tuple, shards: int, backward: str) -> Schedule:
    """All encoder forwards up front, each shard on the least-loaded device in
    the order chunk 0 consumes microbatches: a prefix that balances work
    instead of assigning one microbatch per rank."""
    pipe = body.pipelines[0]
    ranks = _ranks(body)
    load = {d: 0.0 for d in ranks}
    forward = [grouped(e.costs("F", pipe.microbatches), pipe, workload.host.dispatch) for e in encs]
    cost = [sum(f[m] for f in forward) / shards for m in range(pipe.microbatches)]
    owner: dict[tuple[int, int], int | None] = {}
    for m in _consumption(body):
        for k in range(shards):
            d = min(ranks, key=lambda r: load[r])  # ties: rank order, rank 0 first
            owner[(m, k)] = d
            load[d] += cost[m]
    return _front_loaded(body, encs, owner, shards, backward)


def _consumption(body: Schedule) -> list[int]:
    """Microbatches (group firsts, with `encoder_batch`) in the order chunk 0 first consumes them."""
    pipe = body.pipelines[0]
    module, k = pipe.module, pipe.encoder_batch
    seen: dict[int, None] = {}
    for order in body.orders:
        for op in order:
            if op.chunk == 0 and op.kind == F and op.module == module:
                seen.setdefault(op.mb - op.mb % k, None)
    return list(seen)


def _group_marks(body: Schedule, d0: int) -> tuple[set, set]:
    """Chunk 0's ops on `d0` that open a group (its first F(0, m)) and that
    close it (the backward that completes its last input gradient)."""
    pipe = body.pipelines[0]
    module = pipe.module
    opens, closes = set(), set()
    started: set = set()
    countdown = GroupCountdown(pipe)
    for op in body.orders[d0]:
        if op.chunk != 0 or op.module != module:
            continue
        key = (pipe.group_of(op.mb), op.step)
        if op.kind == F and key not in started:
            started.add(key)
            opens.add(op)
        elif countdown.closes(op) is not None:
            closes.add(op)
    return opens, closes


def _front_loaded(body: Schedule, encs: tuple, owner: dict, shards: int, backward: str) -> Schedule:
    """Encoder forwards of each device's microbatch shards (owner[(m, k)])
    at the start of every step; None = inline on rank 0 right before F(0, m).
    Trainable encoders: a broadcast opens the step; the backward runs on rank 0
    after B(0, m) (recomputing shards it did not run) or, with
    `backward=owner`, on the owner after its LLM work, then an all-reduce."""
    P = body.devices
    ranks = _ranks(body)
    d0 = ranks[0]
    split = _split(body)
    pipe = body.pipelines[0]
    module = pipe.module
    order_of_mbs = _consumption(body)
    opens, closes = _group_marks(body, d0)
    trainable = [e for e in encs if e.trainable]
    orders: list[list[Op]] = [[] for _ in range(P)]
    for d in range(P):
        groups = _by_step(body.orders[d])
        for step in range(_steps(body)):
            out = orders[d]
            if P > 1:
                out += [Op(e.name, BCAST, d, NO_MICROBATCH, step) for e in trainable]
            for m in order_of_mbs:
                for k in range(shards):
                    if owner[(m, k)] == d:
                        out += [Op(e.name, F, k, m, step) for e in encs]
            for op in groups.get(step, ()):
                is_first = op.module == module and op.chunk == 0 and d == d0
                g = pipe.group_of(op.mb)
                if is_first and op in opens:
                    out += [Op(e.name, F, k, g, step) for k in range(shards)
                            if owner[(g, k)] is None for e in encs]
                out.append(op)
                if not is_first or op not in closes:
                    continue
                for e in trainable:
                    for k in range(shards):
                        own = owner[(g, k)]
                        if own is None or own == d0:
                            out += _backward_ops(e.name, k, g, step, split)
                        elif backward == "recompute":
                            out.append(Op(e.name, R, k, g, step))
                            out += _backward_ops(e.name, k, g, step, split)
            if backward == "owner" and d != d0:
                for m in order_of_mbs:
                    for k in range(shards):
                        if owner[(m, k)] == d:
                            for e in trainable:
                                out += _backward_ops(e.name, k, m, step, split)
            if backward == "owner" and P > 1:
                out += [Op(e.name, ALLREDUCE, d, NO_MICROBATCH, step) for e in trainable]
    return body.with_orders(orders, encoders=body.encoders + tuple(e.name for e in encs))


# ----------------------------------------------------------------------------- dynamic

def _dynamic(body: Schedule, workload: Workload, encs: tuple, backward: str, shards: int,
             memory_cap: float | None, simulations: int | None = None,
             stop: Callable[[], bool] | None = None) -> Schedule:
    """Greedy earliest-arrival placement of encoder work into idle gaps.

    Encoder forwards are placed one microbatch at a time, in the order LLM
    chunk 0 consumes them; each shard goes to the device and gap where it
    ends (plus the transfer to chunk 0's device) earliest.  After each
    placement the schedule is re-simulated, so later choices see real gaps.
    Trainable encoders: with `backward=owner` each shard's backward goes to the
    earliest gap after its input gradient can arrive on the shard's owner,
    then an all-reduce ends the step; with `recompute`, rank 0 recomputes and
    runs the backward right after B(0, m), as in the reference."""
    from mpipe_core.simulation.metrics import memory_over_time
    from mpipe_core.simulation.simulator import simulate

    P = body.devices
    ranks = _ranks(body)
    d0 = ranks[0]
    split = _split(body)
    trainable = any(e.trainable for e in encs)
    steps = _steps(body)
    module = body.pipelines[0].module
    orders = [list(o) for o in body.orders]
    # Broadcast opens every step on every device; encoder F of a device waits for it.
    if trainable and P > 1:
        for d in range(P):
            groups = _by_step(orders[d])
            new: list[Op] = []
            for step in range(steps):
                new += [Op(e.name, BCAST, d, NO_MICROBATCH, step) for e in encs if e.trainable]
                new += groups.get(step, [])
            orders[d] = new
    pipe = body.pipelines[0]
    opens, closes = _group_marks(body, d0)
    sizes = dict(pipe.groups())
    # The first consumer of each microbatch (or group): its encoder forward's deadline.
    consumption = [op for op in orders[d0] if op in opens]
    encoders_placed: list[str] = list(body.encoders)

    def current() -> Schedule:
        return body.with_orders(orders, encoders=tuple(encoders_placed))

    # Memory already committed on each device by the LLM alone.
    if memory_cap is not None:
        rest = _without(workload, encs)  # (the body: the broadcasts just added belong to `encs`)
        base = simulate(body, rest)
        alone = memory_over_time(body, rest, base)  # each series starts at the device's static memory
        peaks = [max((v for _, v in series), default=0.0) for series in alone]
        worst = max(range(P), key=lambda d: peaks[d])
        if peaks[worst] > memory_cap:
            static = alone[worst][0][1]
            raise MpipeError(
                f"memory_cap={quantity(memory_cap, workload.memory_unit)} is impossible: device {worst} needs "
                f"{quantity(peaks[worst], workload.memory_unit)} for the LLM alone (static "
                f"{quantity(static, workload.memory_unit)} + activations "
                f"{quantity(peaks[worst] - static, workload.memory_unit)})"
            )

    for e in encs:
        encoders_placed.append(e.name)
        # Until placed, a microbatch's forward sits inline on rank 0 so the
        # schedule stays complete and simulatable.
        for consumer in consumption:
            i = orders[d0].index(consumer)
            orders[d0][i:i] = [Op(e.name, F, k, pipe.group_of(consumer.mb), consumer.step) for k in range(shards)]
        if e.trainable:
            _insert_inline_backward(orders, d0, closes, pipe, e.name, shards, split)
    pending = [(consumer, e, k) for consumer in consumption for e in encs for k in range(shards)]
    # Re-simulating after every placement is exact but O(placements x ops);
    # big schedules place several ops per simulation, reserving the gaps used.
    budget = max(MIN_SIMULATIONS, min(MAX_SIMULATIONS, SIMULATED_OPS_BUDGET // max(1, current().num_ops)))
    if simulations is not None:  # a caller with a time budget (per_batch's planner)
        budget = max(1, simulations)
    per_simulation = max(1, math.ceil(len(pending) / budget))
    for first in range(0, len(pending), per_simulation):
        if stop is not None and stop():
            break  # (the rest stay inline on rank 0: the schedule is complete)
        group = pending[first:first + per_simulation]
        timeline = simulate(current(), workload, check=False, remember=False)  # the group's ops still inline
        times = _times(timeline)
        memory = None if memory_cap is None else _memory_state(current(), workload, timeline, encs, backward)
        moving = {Op(e.name, F, k, pipe.group_of(c.mb), c.step) for c, e, k in group}
        reserved: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for consumer, e, k in group:
            g = pipe.group_of(consumer.mb)
            op = Op(e.name, F, k, g, consumer.step)
            d, anchor, start, finish = _best_forward_slot(timeline, times, orders, op, d0, workload, memory_cap,
                                                          e, shards, memory, moving, reserved, sizes[g])
            reserved[d].append((start, finish))
            moving.discard(op)
            if anchor == op:
                continue  # inline on rank 0 is best: leave it (and its backward) there
            orders[d0].remove(op)
            orders[d].insert(orders[d].index(anchor) if anchor is not None else len(orders[d]), op)
            if e.trainable and backward == "owner" and d != d0:
                backs = _backward_ops(e.name, k, g, consumer.step, split)
                for b_op in backs:
                    orders[d0].remove(b_op)
                _place_owner_backward(orders, d, backs)
            elif e.trainable and d != d0:
                # recompute: rank 0 re-runs the forward from the shipped input
                first_back = next(i for i, o in enumerate(orders[d0])
                                  if o.module == e.name and o.kind in (B, BW) and o.chunk == k
                                  and o.mb == g and o.step == consumer.step)
                orders[d0].insert(first_back, Op(e.name, R, k, g, consumer.step))
    if trainable and backward == "owner" and P > 1:
        for d in range(P):
            groups = _by_step(orders[d])
            new = []
            for step in range(steps):
                new += groups.get(step, [])
                new += [Op(e.name, ALLREDUCE, d, NO_MICROBATCH, step) for e in encs if e.trainable]
            orders[d] = new
    return current()


def _without(workload: Workload, encs: tuple) -> Workload:
    """The workload less the encoders being placed (what the body already runs)."""
    return Workload(workload.llm, tuple(e for e in workload.encoders if e not in encs), workload.link,
                    workload.name, host=workload.host)


def _insert_inline_backward(orders, d0, closes, pipe, name, shards, split) -> None:
    """Each group's backward on rank 0, right after chunk 0 completes its input gradient."""
    out = []
    for op in orders[d0]:
        out.append(op)
        if op in closes:
            for k in range(shards):
                out += _backward_ops(name, k, pipe.group_of(op.mb), op.step, split)
    orders[d0] = out


def _times(timeline):
    """(start of, end of, start of each step): lookups for placing ops."""
    starts = dict(zip(timeline.ops, timeline.start))
    ends = dict(zip(timeline.ops, timeline.end))
    step_start: dict = {}
    steps = set(map(_STEP, timeline.ops))
    if len(steps) == 1:
        step_start[steps.pop()] = min(timeline.start)
        return starts, ends, step_start
    for o, s in zip(timeline.ops, timeline.start):
        if s < step_start.get(o.step, float("inf")):
            step_start[o.step] = s
    return starts, ends, step_start


_STEP = itemgetter(4)


def _best_forward_slot(timeline, times, orders, op, d0, workload, memory_cap, enc, shards, memory, moving,
                       reserved, size):
    """(device, anchor, start, finish): `op` goes right before `anchor` (None: at
    the end of the device's step) where it reaches its consumer earliest.
    Candidates: every idle gap of the op's step on every device that the op
    fits in (minus intervals `reserved` by this round's earlier placements),
    and its current inline slot on rank 0 (anchor == op).  Anchors are ops that
    stay put this round (not in `moving`)."""
    starts, ends, step_starts = times
    dur = ends[op] - starts[op]
    if enc.counts is None:
        nbytes = enc.output_bytes * size if size != 1 else enc.output_bytes
    else:  # a drawn batch: per tile of the group's microbatches (as `CostModel.transfer`)
        nbytes = math.fsum(enc.output_bytes_of(m) for m in range(op.mb, op.mb + size))
    transfer = workload.link_for(len(orders)).transfer(nbytes / shards)
    step = op.step
    step_start = step_starts[step]
    best = ((ends[op], False, d0), d0, op, starts[op], ends[op])  # inline
    limit = best[0][0]  # the best arrival so far
    for d, order in enumerate(orders):
        bcast = Op(enc.name, BCAST, d, NO_MICROBATCH, step)
        has_bcast = bcast in ends
        prev_end = ends[bcast] if has_bcast else step_start
        seen_bcast = not has_bcast
        taken = reserved.get(d, ())
        for pos, o in enumerate(chain(order, (None,))):
            if o is not None:
                o_step = o[4]
                if o_step < step:
                    continue
                if has_bcast and o == bcast:
                    seen_bcast = True
                    prev_end = ends[o]
                    continue
                if o_step > step:
                    o = None  # the end of this step's part of the order
            if prev_end + dur >= limit:
                break  # every later gap on this device finishes later still
            gap_end = starts[o] if o is not None else INF
            # (start >= prev_end: a gap shorter than the op cannot take it, reserved or not)
            if seen_bcast and prev_end + dur <= gap_end + 1e-9 and o != op:
                start = _after_reserved(prev_end, dur, taken) if taken else prev_end
                finish = start + dur
                if finish <= gap_end + 1e-9 and _memory_ok(memory_cap, memory, d, start, finish, enc, op, shards,
                                                           size):
                    arrival = finish + (transfer if d != d0 else 0.0)
                    score = (arrival, d != d0, d)
                    if score < best[0]:
                        best = (score, d, _stable_anchor(order, pos, moving, step), start, finish)
                        limit = arrival
            if o is None:
                break
            e = ends[o]
            if e > prev_end:
                prev_end = e
    return best[1], best[2], best[3], best[4]


def _after_reserved(start: float, dur: float, taken) -> float:
    """The earliest start >= `start` whose [start, start + dur) avoids `taken`."""
    moved = True
    while moved:
        moved = False
        for s, f in taken:
            if start < f - 1e-12 and s < start + dur - 1e-12:
                start = f
                moved = True
    return start


def _stable_anchor(order, pos: int, moving: set, step: int):
    for o in order[pos:]:
        if o.step > step:
            return o
        if o not in moving:
            return o
    return None


def _memory_state(schedule, workload, timeline, encs, backward):
    """What the memory cap is checked against in one placement round (whose
    timeline stays the same): per device the activation step function, the
    static memory, and the encoder copies it holds (module -> holds, trains)."""
    from mpipe_core.simulation.memory import activation_over_time, static_memory

    holds: dict[str, set] = defaultdict(set)
    trains: dict[str, set] = defaultdict(set)
    for op, d in zip(timeline.ops, timeline.device):
        holds[op.module].add(d)
        if op.kind in (B, W, BW):
            trains[op.module].add(d)
    return (activation_over_time(schedule, workload, timeline), static_memory(schedule, workload, timeline),
            holds, trains, backward)


def _memory_ok(memory_cap, memory, d, start, finish, enc, op, shards, size) -> bool:
    """Whether device d stays within the cap running `op` over [start, finish):
    its static memory, with the copy of the encoder it holds once the op runs
    there (a trained copy if its backward follows it there), plus the
    activations live then and the op's own (`size`: the microbatches of its group)."""
    if memory_cap is None:
        return True
    series, static, holds, trains, backward = memory
    trained = d in trains[enc.name] or (enc.trainable and backward == "owner")
    before = enc.static_of_copy(d in trains[enc.name]) if d in holds[enc.name] else 0.0
    level = 0.0
    for t, v in series[d]:
        if t <= start:
            level = v
        elif t < finish:
            level = max(level, v)
    size = sum(enc.forward_held(op.mb + size)[op.mb:op.mb + size]) / shards
    return static[d] - before + enc.static_of_copy(trained) + level + size <= memory_cap + 1e-12


def _place_owner_backward(orders, d, backs: list[Op]) -> None:
    """The owner runs the backward after its own LLM work of that step."""
    order = orders[d]
    step = backs[0].step
    last = next((i for i in range(len(order) - 1, -1, -1) if order[i].step == step and order[i].kind != ALLREDUCE),
                len(order) - 1)
    order[last + 1:last + 1] = backs
