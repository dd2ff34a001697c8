"""Activation memory of a simulated timeline, column-wise with numpy.

An op's activations live on the device that ran its forward (or recompute),
from that op's start until the last backward part on that device ends (or the
forward ends, if none runs there).  Events are (device, time, +/- size);
frees sort before allocations at the same instant (memory reused back to
back), and each device's running total is summed in that order.
"""
from __future__ import annotations

import numpy as np

from .chunks import chunk_costs
from .ops import B, BW, F, LLM, R, W, base_module, replica_of, unzip, with_replica
from .schedule import Schedule
from .simulator import Timeline
from .workload import Workload

ALLOCATES, FREES = (F, R), (B, W, BW)


def memory_events(schedule: Schedule, workload: Workload, timeline: Timeline):
    """(device, time, delta) arrays, sorted by device, time, delta."""
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))
    n = len(timeline)
    if n == 0:
        return empty
    col = timeline.columns or columns(timeline)
    names, mod, role, chunk, step = col["names"], col["module"], col["role"], col["chunk"], col["step"]
    mb = col["mb"] + 1  # NO_MICROBATCH is -1
    dev, start, end = col["device"], col["start"], col["end"]
    if "llm_key" in col:
        first, released = _llm_lifetimes(col)
    else:
        dims = (timeline.devices, len(names), int(chunk.max()) + 1, int(mb.max()) + 1, int(step.max()) + 1)
        keys, group = np.unique(np.ravel_multi_index((dev, mod, chunk, mb, step), dims), return_inverse=True)
        alloc = np.flatnonzero(role == 0)
        if alloc.size == 0:
            return empty
        # The earliest forward (or recompute) of each key allocates (first on ties).
        first = alloc[np.lexsort((alloc, start[alloc], group[alloc]))]
        keep = np.ones(first.size, dtype=bool)
        keep[1:] = group[first[1:]] != group[first[:-1]]
        first = first[keep]
        free = np.full(keys.size, -1.0)
        frees = np.flatnonzero(role == 1)
        np.maximum.at(free, group[frees], end[frees])
        released = free[group[first]]
        released = np.where(released < 0, end[first], released)
        released = _held_until_consumed(schedule, first, released, names, mod, role, chunk, mb - 1, step, end)
    size = _sizes(schedule, workload, first, mod, names, chunk, mb - 1, step, role)
    live = size > 0
    first, released, size = first[live], released[live], size[live]
    device = np.concatenate((dev[first], dev[first]))
    time = np.concatenate((start[first], released))
    delta = np.concatenate((size, -size))
    order = np.lexsort((delta, time, device))
    return device[order], time[order], delta[order]


def _llm_lifetimes(col: dict) -> tuple[np.ndarray, np.ndarray]:
    """(forward rows, release times) of a one-pipeline LLM timeline, whose
    columns carry `llm_key` = chunk * M + microbatch and hold exactly one
    forward per key (the simulator's fast path checked it): the same answer as
    the general grouping above, without sorting every row.  A backward part
    on another device than its forward frees nothing there."""
    key, role, dev, end = col["llm_key"], col["role"], col["device"], col["end"]
    first = np.flatnonzero(role == 0)
    forward_device = np.full(int(key.max()) + 1, -1, dtype=np.int64)
    forward_device[key[first]] = dev[first]
    frees = np.flatnonzero(role == 1)
    frees = frees[dev[frees] == forward_device[key[frees]]]
    free = np.full(forward_device.size, -1.0)
    np.maximum.at(free, key[frees], end[frees])
    released = free[key[first]]
    return first, np.where(released < 0, end[first], released)


def _held_until_consumed(schedule, first, released, names, mod, role, chunk, mb, step, end) -> np.ndarray:
    """An encoder group's op (`encoder_batch`, more than one microbatch) keeps
    its activations, the group's features among them, until the last LLM
    forward of chunk 0 of that step that consumes them has ended, if that is later."""
    out = released
    for pipe in schedule.pipelines:
        if pipe.encoder_batch == 1 or pipe.module not in names:
            continue
        llm = names.index(pipe.module)
        forwards = np.flatnonzero((mod == llm) & (role == 0) & (chunk == 0))
        consumed = np.full((pipe.steps, pipe.microbatches), -np.inf)
        np.maximum.at(consumed, (step[forwards], mb[forwards]), end[forwards])
        # per step and group: the latest consumption among its microbatches
        latest = np.maximum.reduceat(consumed, np.arange(0, pipe.microbatches, pipe.encoder_batch), axis=1)
        encoders = [i for i, name in enumerate(names)
                    if base_module(name) != LLM and replica_of(name) == pipe.replica]
        mine = np.isin(mod[first], encoders) & (role[first] == 0)
        if not mine.any():
            continue
        rows = first[mine]
        held = latest[step[rows], mb[rows] // pipe.encoder_batch]
        out = out.copy() if out is released else out  # (never write into the caller's array)
        out[mine] = np.maximum(out[mine], held)
    return out


def columns(timeline: Timeline) -> dict:
    """The timeline's rows as arrays: module (index into `names`), role (0
    allocates, 1 frees, 2 neither), chunk, mb, step, device, start, end."""
    n = len(timeline)
    modules, kinds, chunks, mbs, steps = unzip(timeline.ops)
    names = sorted(set(modules))
    code = {m: i for i, m in enumerate(names)}
    return {
        "names": names,
        "module": np.fromiter(map(code.__getitem__, modules), dtype=np.int64, count=n),
        "role": np.fromiter((0 if k in ALLOCATES else 1 if k in FREES else 2 for k in kinds), dtype=np.int64,
                            count=n),
        "chunk": np.fromiter(chunks, dtype=np.int64, count=n),
        "mb": np.fromiter(mbs, dtype=np.int64, count=n),
        "step": np.fromiter(steps, dtype=np.int64, count=n),
        "device": np.asarray(timeline.device, dtype=np.int64),
        "start": np.asarray(timeline.start, dtype=float),
        "end": np.asarray(timeline.end, dtype=float),
    }


def _sizes(schedule, workload, rows, mod, names, chunk, mb, step, role) -> np.ndarray:
    """Activation size of the op group each row in `rows` opens."""
    size = np.zeros(rows.size)
    pipes = {p.module: p for p in schedule.pipelines}
    M = max(p.microbatches for p in schedule.pipelines)
    enc_act = {e.name: np.asarray(e.activations(M)) for e in workload.encoders}
    for i, name in enumerate(names):
        mine = mod[rows] == i
        if not mine.any():
            continue
        at = rows[mine]
        pipe = pipes.get(name)
        if pipe is not None:
            costs = chunk_costs(pipe, workload)
            table = np.asarray(costs.llm_activation)[chunk[at]]
            if costs.encoder_activation is not None:
                table = table + np.asarray(costs.encoder_activation)[chunk[at], mb[at]]
            size[mine] = table
            continue
        # An encoder: its per-microbatch activation (a group's: the sum over
        # its microbatches), split over the shards (the most chunks any F/R
        # of that microbatch and step shows).
        ops = np.flatnonzero((mod == i) & (role == 0))
        shards: dict = {}
        for m, s, c in zip(mb[ops].tolist(), step[ops].tolist(), chunk[ops].tolist()):
            if c + 1 > shards.get((m, s), 0):
                shards[(m, s)] = c + 1
        count = np.array([shards[(m, s)] for m, s in zip(mb[at].tolist(), step[at].tolist())])
        acts = enc_act[base_module(name)]
        pipe = pipes.get(with_replica(LLM, replica_of(name)))
        if pipe is not None and pipe.encoder_batch != 1:
            acts = np.add.reduceat(acts[:pipe.microbatches], np.arange(0, pipe.microbatches, pipe.encoder_batch))
            acts = np.repeat(acts, pipe.encoder_batch)[:pipe.microbatches]  # the group's sum at each of its indices
        size[mine] = acts[mb[at]] / count
    return size


def peak_memory(schedule: Schedule, workload: Workload, timeline: Timeline) -> list[float]:
    device, _, delta = memory_events(schedule, workload, timeline)
    peaks = [0.0] * timeline.devices
    bounds = np.searchsorted(device, np.arange(timeline.devices + 1))
    for d in range(timeline.devices):
        if bounds[d] < bounds[d + 1]:
            peaks[d] = max(0.0, float(np.cumsum(delta[bounds[d]:bounds[d + 1]]).max()))
    return peaks


def memory_over_time(schedule: Schedule, workload: Workload, timeline: Timeline) -> list[list[tuple[float, float]]]:
    """Per device, the step function (time, activation memory) for plotting."""
    device, time, delta = memory_events(schedule, workload, timeline)
    series: list[list[tuple[float, float]]] = [[(0.0, 0.0)] for _ in range(timeline.devices)]
    bounds = np.searchsorted(device, np.arange(timeline.devices + 1))
    for d in range(timeline.devices):
        a, b = bounds[d], bounds[d + 1]
        series[d] += zip(time[a:b].tolist(), np.cumsum(delta[a:b]).tolist())
    return series
