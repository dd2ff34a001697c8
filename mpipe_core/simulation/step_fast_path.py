"""The simulator's fast path for one pipeline's step with encoder ops.

Transposed, colocated, disaggregated and fused schedules are a pipeline of
LLM ops plus a few thousand encoder ops; `mpipe tune` and transpose's dynamic
placement simulate hundreds of them.  Here the LLM rows get their one producer
the way `llm_fast_path` does it (numpy columns), and only the rows the
encoders touch (encoder ops, and the LLM's F(0, m) that waits for their
features) ask `dataflow.predecessors`, the one place the dependency rules
live.  The sweep is the general simulator's: each device runs its ops in
order, an op starting at the later of its device being free and each
producer's end plus the transfer it needs (the same float operations, so the
same timeline).  Anything else (several steps or pipelines, shared hosts, an
op the rules do not know, a deadlock) returns None and the general simulator
takes over, with its messages.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import chain

import numpy as np

from mpipe_core.errors import MpipeError
from mpipe_core.ir.ops import ALLREDUCE, unzip
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import EDGE_BOUNDARY, collect_facts, predecessors
from mpipe_core.simulation.llm_fast_path import KIND_CODE, llm_rows
from mpipe_core.workloads.workload import Workload

MULTI = -2  # a row whose producers are listed in `multi` (several, or encoder ops)


class _Codes(dict):
    """Kind -> code: the LLM's kinds as `llm_fast_path` numbers them, any other kind past them."""

    def __missing__(self, kind):
        return len(KIND_CODE)


ANY_KIND = _Codes(KIND_CODE)


def simulate_step_with_encoders(schedule: Schedule, workload: Workload, index: dict):
    """(ops, device, start, end) lists, or None when the general path must run.
    `index` maps every op to its device (the caller built it for its checks)."""
    if workload.host.contends:
        return None
    shape = _shape_of(schedule, index)
    if shape is None:
        return None
    pipe = schedule.pipelines[0]
    llm_producer, llm_lag, llm_duration, _ = llm_rows(
        pipe, workload, shape.code, shape.chunk, shape.mb, shape.ids, shape.count, shape.device[shape.llm_at],
        rows=shape.llm_at, devices=len(shape.lengths))
    n = len(shape.ops)
    producer = np.full(n, MULTI, dtype=np.int64)
    lag = np.zeros(n)
    duration = np.zeros(n)
    producer[shape.llm_at] = llm_producer
    lag[shape.llm_at] = llm_lag
    duration[shape.llm_at] = llm_duration
    producer_l, lag_l, duration_l = producer.tolist(), lag.tolist(), duration.tolist()
    costs = CostModel(schedule, workload, shape.facts)
    multi = _priced(shape, costs, duration_l, producer_l)
    swept = _sweep(shape.lengths, producer_l, lag_l, duration_l, multi)
    if swept is None:
        return None
    start, end = swept
    return shape.ops, list(shape.device_l), start, end


class _Shape:
    """What the fast path reads from a schedule alone (its ops as columns, the
    producers of the rows the encoders touch): a stream of batches simulates
    one schedule on many workloads (`per_batch`, `eval --batches`), so this is
    kept per schedule object (schedules are frozen) and only the costs are
    worked out again."""

    def __init__(self, schedule: Schedule, ops, modules, code, chunk, mb, ids, count, llm_at, lengths, device,
                 facts, special, found):
        self.ops, self.modules, self.lengths = ops, modules, lengths
        self.code, self.chunk, self.mb, self.ids, self.count, self.llm_at = code, chunk, mb, ids, count, llm_at
        self.device, self.device_l = device, device.tolist()
        self.facts, self.special, self.found = facts, special, found
        self.module = schedule.pipelines[0].module


def _shape_of(schedule: Schedule, index: dict) -> _Shape | None:
    """The schedule's `_Shape` (None: the general path must run), from the last few built."""
    key = id(schedule)
    with _SHAPES_LOCK:
        hit = _SHAPES.get(key)
        if hit is not None and hit[0] is schedule:
            _SHAPES.move_to_end(key)
            return hit[1]
    shape = _build_shape(schedule, index)
    with _SHAPES_LOCK:
        _SHAPES[key] = (schedule, shape)
        while len(_SHAPES) > _SHAPES_KEPT:
            _SHAPES.popitem(last=False)
    return shape


_SHAPES: OrderedDict = OrderedDict()  # id(schedule) -> (schedule, its _Shape or None)
_SHAPES_KEPT = 8
_SHAPES_LOCK = threading.Lock()


def _build_shape(schedule: Schedule, index: dict) -> _Shape | None:
    if len(schedule.pipelines) != 1 or not schedule.encoders:
        return None
    pipe = schedule.pipelines[0]
    if pipe.steps != 1 or pipe.replica != 0 or pipe.encoder_layers is not None:
        return None
    ops = list(chain.from_iterable(schedule.orders))
    n = len(ops)
    modules, kinds, chunks, mbs, steps = unzip(ops)
    if steps.count(0) != n:
        return None
    module = pipe.module
    C, M = pipe.chunks, pipe.microbatches
    is_llm = np.fromiter(map(module.__eq__, modules), dtype=bool, count=n)
    llm_at = np.flatnonzero(is_llm)
    code_all = np.fromiter(map(ANY_KIND.__getitem__, kinds), dtype=np.int64, count=n)
    code = code_all[llm_at]
    if code.size and code.max() >= len(KIND_CODE):  # a kind the LLM does not have
        return None
    chunk_all = np.fromiter(chunks, dtype=np.int64, count=n)
    mb_all = np.fromiter(mbs, dtype=np.int64, count=n)
    chunk, mb = chunk_all[llm_at], mb_all[llm_at]
    if chunk.size == 0 or chunk.min() < 0 or chunk.max() >= C or mb.min() < 0 or mb.max() >= M:
        return None
    ids = (code * C + chunk) * M + mb
    count = np.bincount(ids, minlength=4 * C * M).reshape(4, C, M)
    split, fused = count[1] == 1, count[3] == 1
    if count.max() > 1 or not (count[0] == 1).all() or not (split == (count[2] == 1)).all() \
            or not (split ^ fused).all():
        return None  # the general path names what is wrong
    lengths = [len(o) for o in schedule.orders]
    device = np.repeat(np.arange(len(lengths)), lengths)
    position = np.full(4 * C * M, -1, dtype=np.int64)
    position[ids] = llm_at
    # Rows the encoders touch: every encoder op, and each F(0, m).
    facts = collect_facts(schedule)
    first_forwards = llm_at[(code == 0) & (chunk == 0)]
    special = np.union1d(np.flatnonzero(~is_llm), first_forwards).tolist()
    encoder_row = {ops[r]: r for r in np.flatnonzero(~is_llm).tolist()}
    try:
        found = _producers(special, ops, module, device.tolist(), facts, index, position.tolist(), encoder_row, C, M)
    except MpipeError:  # the general path says what is wrong
        return None
    if found is None:
        return None
    return _Shape(schedule, ops, modules, code, chunk, mb, ids, count, llm_at, lengths, device, facts, special,
                  found)


def _producers(special, ops, module, device_l, facts, index, position, encoder_row, C, M):
    """(row, producer, edge) of each special row's producers (None: one is
    missing or not an op of this schedule)."""
    found_of: list = []
    collective: dict = {}  # (module, step) -> an all-reduce's producers: the same for each of its devices
    for r in special:
        op = ops[r]
        key = (op[0], op[4])
        if op[1] == ALLREDUCE and key in collective:
            found = collective[key]
        else:
            found = _rows_of(predecessors(op, device_l[r], facts, index), module, position, encoder_row, C, M)
            if found is None:
                return None
            if op[1] == ALLREDUCE:
                found = collective[key] = _last_per_device(found, device_l)
        found_of.append(found)
    return found_of


def _priced(shape: _Shape, costs: CostModel, duration_l: list, producer_l: list) -> list:
    """(row, lag) pairs of each special row's producers on these costs; fills in
    the encoder rows' durations."""
    multi: list = [None] * len(shape.ops)
    transfer = costs.transfer
    ops, modules, device_l, module = shape.ops, shape.modules, shape.device_l, shape.module
    for r, found in zip(shape.special, shape.found):
        op = ops[r]
        d = device_l[r]
        producer_l[r] = MULTI
        if modules[r] != module:
            duration_l[r] = costs.duration(op)
        deps = []
        for row, prod, edge in found:
            if device_l[row] != d:
                deps.append((row, costs.boundary(device_l[row], d, op[3]) if edge == EDGE_BOUNDARY
                             else transfer(prod, op, edge)))
            else:
                deps.append((row, 0.0))
        multi[r] = deps
    return multi


def _rows_of(producers, module, position, encoder_row, C, M):
    """(row, producer, edge) of each (producer, edge); None if one is not in the schedule."""
    found = []
    for prod, edge in producers:
        if prod[0] == module:
            kind_code = KIND_CODE.get(prod[1])
            c, m = prod[2], prod[3]
            if kind_code is None or prod[4] != 0 or not (0 <= c < C and 0 <= m < M):
                return None
            row = position[(kind_code * C + c) * M + m]
            if row < 0:
                return None
        else:
            row = encoder_row.get(prod)
            if row is None:
                return None
        found.append((row, prod, edge))
    return found


def _last_per_device(deps: list, device_l: list) -> list:
    """`deps`: (row, ...) of an all-reduce's producers.  It waits for every
    weight gradient of its step, each priced the same (the link's latency
    from another device, nothing from its own).  A device's ops end in its
    order, so the last of them on each device ends latest, and (float
    addition being monotone) only it can decide the max: the same start, from
    one producer per device instead of every one."""
    last: dict[int, tuple] = {}
    for dep in deps:
        d = device_l[dep[0]]
        if d not in last or dep[0] > last[d][0]:
            last[d] = dep
    return list(last.values())


def _sweep(lengths, producer, lag, duration, multi):
    """Start and end times, device by device: run a device until its next op
    waits for one not yet done, then switch to a device that can go on.
    `producer` is a row, -1 (none) or MULTI (see `multi[row]`: (row, lag) pairs)."""
    n = len(producer)
    start = [0.0] * n
    end = [-1.0] * n  # -1: not run yet
    waiter: list = [None] * n
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    pointer = offsets[:-1]
    free = [0.0] * len(lengths)
    todo = list(range(len(lengths)))
    while todo:
        d = todo.pop()
        t, stop = free[d], offsets[d + 1]
        for k in range(pointer[d], stop):
            p = producer[k]
            if p >= 0:
                e = end[p]
                if e < 0:  # wait for row p; its device wakes this one
                    if waiter[p] is None:
                        waiter[p] = [d]
                    else:
                        waiter[p].append(d)
                    pointer[d] = k
                    break
                e += lag[k]
                if e > t:
                    t = e
            elif p == MULTI:
                at = t
                blocked = -1
                for q, hop in multi[k]:
                    e = end[q]
                    if e < 0:
                        blocked = q
                        break
                    e += hop
                    if e > at:
                        at = e
                if blocked >= 0:
                    if waiter[blocked] is None:
                        waiter[blocked] = [d]
                    else:
                        waiter[blocked].append(d)
                    pointer[d] = k
                    break
                t = at
            start[k] = t
            t += duration[k]
            end[k] = t
            if waiter[k] is not None:
                todo.extend(waiter[k])
                waiter[k] = None
        else:
            pointer[d] = stop
        free[d] = t
    if any(pointer[d] < offsets[d + 1] for d in range(len(lengths))):
        return None  # a deadlock: the general path finds and reports the cycle
    return start, end
