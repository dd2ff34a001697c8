"""ASAP simulation: each device runs its ops in order; an op starts at
max(end of the previous op on its device, end of each dependency + transfer).

Steps (`repeat`/`seq`) are separated by the optimizer update, a global barrier:
step s+1 starts when every op of step s has ended.

A workload whose devices share a host that contends (`Host.contends`) is simulated by
`contention.simulate_step_shared` (ops slow each other down while they
overlap); otherwise every op takes its own cost.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from mpipe_core.errors import ScheduleError
from mpipe_core.ir.ops import Op, format_op
from mpipe_core.ir.schedule import Schedule
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.simulation.contention import simulate_step_shared
from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import EDGE_BOUNDARY, check_complete, collect_facts, predecessors
from mpipe_core.workloads.workload import Workload


@dataclass
class Timeline:
    """One row per op, device by device in schedule order (parallel lists, so
    plotting and metrics work column-wise)."""

    ops: list[Op]
    device: list[int]
    start: list[float]
    end: list[float]
    devices: int
    # Column arrays a fast path already built (see `memory.columns`), reused.
    columns: dict | None = field(default=None, repr=False, compare=False)

    @property
    def makespan(self) -> float:
        return max(self.end, default=0.0)

    def __len__(self) -> int:
        return len(self.ops)

    def rows(self):
        for op, d, s, e in zip(self.ops, self.device, self.start, self.end):
            yield op, d, s, e

    def records(self) -> list[TimelineRecord]:
        return [TimelineRecord.of(op, d, s, e) for op, d, s, e in self.rows()]


def simulate(schedule: Schedule, workload: Workload, check: bool = True, remember: bool = True) -> Timeline:
    """Simulate `schedule` on `workload`; raise ScheduleError if it is not valid.

    `check=False` skips the completeness check, for combinators re-simulating
    schedules they built complete (a missing dependency still raises).

    A schedule with encoder ops that was simulated on the same workload object
    not long ago (a combinator comparing candidates, then `evaluate` keeping
    one; `mpipe tune` building the same prefix transpose again) gets that
    timeline back: schedules, workloads and timelines are never modified.
    `remember=False`: a schedule no one will ask for again (a placement's
    intermediate step), kept out of that memory."""
    from mpipe_core.simulation.llm_fast_path import simulate_llm_pipeline

    fast = simulate_llm_pipeline(schedule, workload)
    if fast is not None:
        ops, device, start, end, columns = fast
        return Timeline(ops, device, start, end, schedule.devices, columns)
    key = (hash(schedule.orders), schedule.pipelines, schedule.encoders, id(workload))
    with _RECENT_LOCK:
        hit = _RECENT.get(key)
    same = hit is not None and hit[1] is workload and hit[0].orders == schedule.orders
    if same and (hit[2] or not check):
        return hit[3]
    index = _placement(schedule)
    if check:
        check_complete(schedule, workload, index)
    timeline = hit[3] if same else _simulate(schedule, workload, index)
    if not remember:
        return timeline
    with _RECENT_LOCK:
        _RECENT[key] = (schedule, workload, check, timeline)
        _RECENT.move_to_end(key)
        while len(_RECENT) > _RECENT_KEPT:
            _RECENT.popitem(last=False)
    return timeline


# Recent timelines of schedules with encoder ops: key -> (schedule, workload, checked, timeline).
_RECENT: OrderedDict = OrderedDict()
_RECENT_KEPT = 16
_RECENT_LOCK = threading.Lock()


def _placement(schedule: Schedule) -> dict:
    """op -> device, kept for the last few schedule objects (they are frozen):
    a stream of batches simulates one schedule on many workloads."""
    key = id(schedule)
    with _RECENT_LOCK:
        hit = _PLACEMENTS.get(key)
        if hit is not None and hit[0] is schedule:
            return hit[1]
    index = {op: d for d, order in enumerate(schedule.orders) for op in order}
    with _RECENT_LOCK:
        _PLACEMENTS[key] = (schedule, index)
        while len(_PLACEMENTS) > _RECENT_KEPT:
            _PLACEMENTS.popitem(last=False)
    return index


_PLACEMENTS: OrderedDict = OrderedDict()  # id(schedule) -> (schedule, op -> device); read-only once built


def _simulate(schedule: Schedule, workload: Workload, index: dict) -> Timeline:
    if len(index) == schedule.num_ops:  # (a duplicate op: the general path names it)
        from mpipe_core.simulation.step_fast_path import simulate_step_with_encoders

        fast = simulate_step_with_encoders(schedule, workload, index)
        if fast is not None:
            return Timeline(*fast, schedule.devices)
    facts = collect_facts(schedule)
    costs = CostModel(schedule, workload, facts)

    steps = max(p.steps for p in schedule.pipelines)
    if steps == 1:
        per_step = [[list(o) for o in schedule.orders]]
    else:
        per_step = _split_steps(schedule, steps)

    ops: list[Op] = []
    device: list[int] = []
    start: list[float] = []
    end: list[float] = []
    begin = 0.0
    host = workload.host
    for orders in per_step:
        shared = (simulate_step_shared(orders, index, facts, costs, begin, host)
                  if host.contends else None)
        # (a deadlocked step comes back None: the plain path names the cycle)
        s_ops, s_dev, s_start, s_end = (rows_by_device(orders, *shared) if shared
                                        else _simulate_step(orders, index, facts, costs, begin))
        ops += s_ops
        device += s_dev
        start += s_start
        end += s_end
        begin = max(s_end, default=begin)
    if steps > 1:  # present rows device by device, in order
        rows = sorted(range(len(ops)), key=lambda i: (device[i], start[i]))
        ops = [ops[i] for i in rows]
        device = [device[i] for i in rows]
        start = [start[i] for i in rows]
        end = [end[i] for i in rows]
    return Timeline(ops, device, start, end, schedule.devices)


def _split_steps(schedule: Schedule, steps: int) -> list[list[list[Op]]]:
    per_step: list[list[list[Op]]] = [[[] for _ in schedule.orders] for _ in range(steps)]
    for d, order in enumerate(schedule.orders):
        last = 0
        for op in order:
            if op.step < last:
                raise ScheduleError(
                    f"deadlock: device {d} runs {format_op(op)} (step {op.step}) after an op of "
                    f"step {last}, but step {last} waits for the optimizer update that needs step {op.step}",
                    cycle=[(d, op)],
                )
            last = op.step
            per_step[op.step][d].append(op)
    return per_step


def _simulate_step(orders, index, facts, costs: CostModel, begin: float):
    end_of: dict = {}
    # Each device runs its ops in its own order, so appending as they run keeps
    # the rows device by device in schedule order without a second pass.
    starts: list[list[float]] = [[] for _ in orders]
    ends: list[list[float]] = [[] for _ in orders]
    free_at = [begin] * len(orders)
    pointer = [0] * len(orders)
    waiting: dict = {}  # op -> devices whose head waits for it
    todo = list(range(len(orders)))
    duration = costs.duration
    transfer = costs.transfer
    end_of_get = end_of.get
    boundary = costs.boundary_transfer  # the common case, priced once
    per_hop, hop = costs.per_hop, costs.boundary  # a cluster: each hop on its own link
    while todo:
        d = todo.pop()
        order = orders[d]
        k = pointer[d]
        t = free_at[d]
        n = len(order)
        starts_d = starts[d]
        ends_d = ends[d]
        while k < n:
            op = order[k]
            begin_at = t
            blocked = None
            for producer, edge in predecessors(op, d, facts, index):
                done = end_of_get(producer)  # (end time, device)
                if done is None:
                    if producer not in index:
                        raise ScheduleError(
                            f"op {format_op(Op(*op))} on device {d} needs {format_op(Op(*producer))}, "
                            f"which the schedule does not contain"
                        )
                    blocked = producer
                    break
                e = done[0]
                if done[1] != d:
                    if edge == EDGE_BOUNDARY:
                        e += hop(done[1], d, op[3]) if per_hop else boundary
                    else:
                        e += transfer(producer, op, edge)
                if e > begin_at:
                    begin_at = e
            if blocked is not None:
                waiting.setdefault(blocked, []).append(d)
                break
            t = begin_at + duration(op)
            starts_d.append(begin_at)
            ends_d.append(t)
            end_of[op] = (t, d)
            k += 1
            woken = waiting.pop(op, None)
            if woken:
                todo.extend(woken)
        pointer[d] = k
        free_at[d] = t
    stuck = [d for d, order in enumerate(orders) if pointer[d] < len(order)]
    if stuck:
        cycle = _find_cycle(orders, pointer, index, facts, end_of)
        text = " -> ".join(f"device {d}: {format_op(Op(*op))}" for d, op in cycle)
        raise ScheduleError(f"deadlock: {text} (each waits for the next)", cycle=cycle)
    return rows_by_device(orders, starts, ends)


def rows_by_device(orders, starts, ends):
    """Per-device start/end lists -> the step's (ops, devices, starts, ends), device by device."""
    ops: list = []
    dev: list[int] = []
    start: list[float] = []
    end: list[float] = []
    for d, order in enumerate(orders):
        ops.extend(order)
        dev.extend([d] * len(order))
        start.extend(starts[d])
        end.extend(ends[d])
    return ops, dev, start, end


def _find_cycle(orders, pointer, index, facts, end_of) -> list[tuple[int, tuple]]:
    """Follow 'head op of device d waits for op x, which sits behind the head of
    device d2' until a device repeats; return the (device, op) ring."""
    def first_missing(d):
        op = orders[d][pointer[d]]
        for producer, _ in predecessors(op, d, facts, index):
            if producer not in end_of:
                return producer
        return None

    start = next(d for d in range(len(orders)) if pointer[d] < len(orders[d]))
    seen: dict[int, int] = {}
    path: list[tuple[int, tuple]] = []
    d = start
    while d not in seen:
        seen[d] = len(path)
        head = orders[d][pointer[d]]
        path.append((d, head))
        waits_for = first_missing(d)
        d = index[waits_for]
        if pointer[d] < len(orders[d]) and orders[d][pointer[d]] != waits_for:
            path.append((d, waits_for))
    ring = path[seen[d]:]
    return [(dev, Op(*op)) for dev, op in ring]
