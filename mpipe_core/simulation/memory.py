"""Memory of a simulated timeline: static memory per device plus activations
over time, column-wise with numpy.

An op's activations live on the device that ran its forward (or recompute),
from that op's start until the last backward part on that device ends (or the
forward ends, if none runs there).  In a drawn batch (docs/data.md) the LLM
part of a chunk's activation scales with the microbatch's tokens
(`ChunkCosts.token_ratio`) and an encoder's with its tiles (`Encoder.counts`).
A chunk under `recompute` keeps only what
its mode keeps from the forward on; what its backward rebuilds (one layer at
a time in a fused BW, every recomputed layer in a split B, whose W needs
them: `chunks.py`) is allocated when the backward starts, on its device, and
freed with the rest.  A frozen tower runs under no_grad and keeps nothing
for a backward: its op, or the layers of it a chunk folds, hold one layer's
working set (`Encoder.no_grad_working_set`) only while that forward runs.
Events are (device, time, +/- size); frees sort before allocations at the
same instant (memory reused back to back), and each device's running
total is summed in that order.

Static memory (parameters, gradients, optimizer state) is held for the whole
step by every device that runs an op of what it belongs to: an LLM chunk's
(its layers, the embedding on chunk 0, the head on the last, folded encoder
layers) on each device running one of its ops; an encoder's on each device
running one of its ops, as a trained copy where its backward runs there and
as a forward-only replica elsewhere (a trained copy's state sharded over
the k copies of one pipeline holds its share: `Encoder.static_of_copy`).
The figures come from the workload
(`memory_model` has the formulas behind the analytic ones).
"""
from __future__ import annotations

import numpy as np

from mpipe_core.ir.ops import BW, LLM, B, F, R, W, base_module, replica_of, unzip, with_replica
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.chunks import chunk_costs
from mpipe_core.simulation.simulator import Timeline
from mpipe_core.workloads.workload import Workload

ALLOCATES, FREES = (F, R), (B, W, BW)


def memory_events(schedule: Schedule, workload: Workload, timeline: Timeline):
    """(device, time, delta) arrays, sorted by device, time, delta."""
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))
    n = len(timeline)
    if n == 0:
        return empty
    col = _columns(timeline)
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
    for rebuilt in (_rebuilt(schedule, workload, timeline, col), _encoder_rebuilt(schedule, workload, timeline, col),
                    _frozen_transient(schedule, workload, col)):
        if rebuilt is not None:
            device, time, delta = (np.concatenate((a, b)) for a, b in zip((device, time, delta), rebuilt))
    order = np.lexsort((delta, time, device))
    return device[order], time[order], delta[order]


def _columns(timeline: Timeline) -> dict:
    """The timeline's columns, built once and kept on it (a timeline never changes)."""
    if timeline.columns is None:
        timeline.columns = columns(timeline)
    return timeline.columns


def _rebuilt(schedule: Schedule, workload: Workload, timeline: Timeline, col: dict):
    """(device, time, delta) of what recomputing backwards rebuild: from the
    start of each B (or fused BW) of a recomputed chunk, on its device, until
    the last backward part of that chunk and microbatch there ends.  None when
    nothing is rebuilt."""
    names = col["names"]
    sizes = {}  # module index -> the chunk costs' rebuilt figures as arrays
    for pipe in schedule.pipelines:
        if pipe.recompute is None or pipe.module not in names:
            continue
        costs = chunk_costs(pipe, workload)
        split, fused = np.asarray(costs.recompute_activation), np.asarray(costs.recompute_activation_fused)
        encoder = costs.encoder_rebuilt is not None
        enc_split = np.asarray(costs.encoder_rebuilt) if encoder else None
        enc_fused = np.asarray(costs.encoder_rebuilt_fused) if encoder else None
        ratio = None if costs.token_ratio is None else np.asarray(costs.token_ratio)
        if split.any() or (encoder and enc_split.any()):
            sizes[names.index(pipe.module)] = (split, fused, enc_split, enc_fused, ratio)
    if not sizes:
        return None
    mod, chunk, role, dev, mb = col["module"], col["chunk"], col["role"], col["device"], col["mb"]
    if "kind" in col:  # the fast path's kind codes (`ops.COMPUTE_KINDS`: 1 is B, 3 is BW)
        is_b, is_bw = col["kind"] == 1, col["kind"] == 3
    else:
        kinds = timeline.ops
        is_b = np.fromiter((op[1] == B for op in kinds), dtype=bool, count=len(timeline))
        is_bw = np.fromiter((op[1] == BW for op in kinds), dtype=bool, count=len(timeline))
    size_of = np.zeros(len(timeline))
    for i, (split, fused, enc_split, enc_fused, ratio) in sizes.items():
        rows = np.flatnonzero(is_b & (mod == i))
        c = chunk[rows]
        llm = split[c] if ratio is None else split[c] * ratio[mb[rows]]  # (a drawn batch: its tokens)
        size_of[rows] = llm if enc_split is None else llm + enc_split[c, mb[rows]]
        rows = np.flatnonzero(is_bw & (mod == i))
        c = chunk[rows]  # one layer at a time: the largest layer's, LLM or folded encoder
        llm = fused[c] if ratio is None else fused[c] * ratio[mb[rows]]
        size_of[rows] = llm if enc_fused is None else np.maximum(llm, enc_fused[c, mb[rows]])
    rows = np.flatnonzero(size_of > 0)
    if rows.size == 0:
        return None
    step = col["step"]
    dims = (timeline.devices, len(names), int(chunk.max()) + 1, int(mb.max()) + 2, int(step.max()) + 1)
    frees = np.flatnonzero((role == 1) & np.isin(mod, list(sizes)))
    free_keys = np.ravel_multi_index((dev[frees], mod[frees], chunk[frees], mb[frees] + 1, step[frees]), dims)
    keys, group = np.unique(free_keys, return_inverse=True)
    last_end = np.full(keys.size, -np.inf)
    np.maximum.at(last_end, group, col["end"][frees])
    row_keys = np.ravel_multi_index((dev[rows], mod[rows], chunk[rows], mb[rows] + 1, step[rows]), dims)
    released = last_end[np.searchsorted(keys, row_keys)]  # each backward row is one of its key's frees
    size = size_of[rows]
    return (np.concatenate((dev[rows], dev[rows])), np.concatenate((col["start"][rows], released)),
            np.concatenate((size, -size)))


def encoder_kept(enc, pipe, M: int) -> tuple[np.ndarray, np.ndarray]:
    """(what each of an encoder's ops keeps from its forward on, what its backward
    rebuilds), per microbatch index of its pipeline (a group's sum at each of its
    indices, `encoder_batch`): all it keeps and nothing, or under
    `recompute(..., encoders=...)` what the mode keeps and the rest."""
    whole = np.asarray(enc.forward_held(M))  # (a frozen tower's: its working set while it runs)
    kept = whole
    if pipe.encoder_recompute is not None and enc.trainable:
        kept = np.asarray(enc.activations(M, pipe.encoder_recompute))
    out = []
    for acts in (kept, whole - kept):
        if pipe.encoder_batch != 1:
            acts = np.add.reduceat(acts[:pipe.microbatches], np.arange(0, pipe.microbatches, pipe.encoder_batch))
            acts = np.repeat(acts, pipe.encoder_batch)[:pipe.microbatches]
        out.append(acts)
    return out[0], out[1]


def _encoder_rebuilt(schedule: Schedule, workload: Workload, timeline: Timeline, col: dict):
    """(device, time, delta) of what recomputing encoder backwards rebuild
    (`recompute(..., encoders=...)`): from a split B's start, all its layers'
    rest (its W needs them), or in a fused BW one layer's at a time, until
    the last backward part of that op's microbatch and shard ends on its
    device; a shard rebuilds its share.  None when nothing is rebuilt."""
    pipes = {p.module: p for p in schedule.pipelines if p.encoder_recompute is not None}
    if not pipes:
        return None
    names, mod, chunk, role = col["names"], col["module"], col["chunk"], col["role"]
    dev, mb, step, start, end = col["device"], col["mb"], col["step"], col["start"], col["end"]
    kinds = timeline.ops
    out = ([], [], [])
    for i, name in enumerate(names):
        if base_module(name) == LLM:
            continue
        pipe = pipes.get(with_replica(LLM, replica_of(name)))
        enc = workload.encoder(base_module(name)) if pipe is not None else None
        if enc is None or not enc.trainable:
            continue
        rebuilt = encoder_kept(enc, pipe, pipe.microbatches)[1]
        if not rebuilt.any():
            continue
        mine = np.flatnonzero(mod == i)
        shards: dict = {}
        last: dict = {}
        for r in mine.tolist():
            key = (int(dev[r]), int(chunk[r]), int(mb[r]), int(step[r]))
            if role[r] == 0:
                shards[(int(mb[r]), int(step[r]))] = max(shards.get((int(mb[r]), int(step[r])), 0), int(chunk[r]) + 1)
            elif role[r] == 1:
                last[key] = max(last.get(key, -np.inf), float(end[r]))
        for r in mine.tolist():
            kind = kinds[r][1]
            if kind not in (B, BW):
                continue
            share = rebuilt[mb[r]] / shards.get((int(mb[r]), int(step[r])), 1)
            size = share if kind == B else share / max(enc.layers, 1)
            out[0].append(int(dev[r]))
            out[1].append((float(start[r]), last[(int(dev[r]), int(chunk[r]), int(mb[r]), int(step[r]))]))
            out[2].append(size)
    if not out[0]:
        return None
    device = np.asarray(out[0], dtype=np.int64)
    times = np.asarray(out[1])
    size = np.asarray(out[2])
    return (np.concatenate((device, device)), np.concatenate((times[:, 0], times[:, 1])),
            np.concatenate((size, -size)))


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


def _frozen_transient(schedule: Schedule, workload: Workload, col: dict):
    """(device, time, delta) of what folded frozen encoder layers hold while
    their chunk's forward (or recompute) runs: from its start to its end.
    None when no chunk folds a frozen encoder."""
    names, mod, role, chunk, mb = col["names"], col["module"], col["role"], col["chunk"], col["mb"]
    out = ([], [], [])
    for pipe in schedule.pipelines:
        if pipe.encoder_layers is None or pipe.module not in names:
            continue
        transient = chunk_costs(pipe, workload).encoder_transient
        if transient is None:
            continue
        rows = np.flatnonzero((mod == names.index(pipe.module)) & (role == 0))
        size = np.asarray(transient)[chunk[rows], mb[rows]]
        rows, size = rows[size > 0], size[size > 0]
        out[0].append(np.concatenate((col["device"][rows], col["device"][rows])))
        out[1].append(np.concatenate((col["start"][rows], col["end"][rows])))
        out[2].append(np.concatenate((size, -size)))
    if not out[0]:
        return None
    return tuple(np.concatenate(parts) for parts in out)


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
    enc_act = {e.name: np.asarray(e.forward_held(M)) for e in workload.encoders}
    for i, name in enumerate(names):
        mine = mod[rows] == i
        if not mine.any():
            continue
        at = rows[mine]
        pipe = pipes.get(name)
        if pipe is not None:
            costs = chunk_costs(pipe, workload)
            table = np.asarray(costs.llm_activation)[chunk[at]]
            if costs.token_ratio is not None:  # a drawn batch: the LLM part follows its tokens
                table = table * np.asarray(costs.token_ratio)[mb[at]]
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
        if pipe is not None:
            acts = encoder_kept(workload.encoder(base_module(name)), pipe, acts.size)[0]
        size[mine] = acts[mb[at]] / count
    return size


def static_memory(schedule: Schedule, workload: Workload, timeline: Timeline) -> list[float]:
    """Per device, the static memory of the chunks and encoder copies it holds."""
    P = timeline.devices
    encoders = any(e.static or e.replica_static for e in workload.encoders)
    if not (workload.llm.has_static or encoders) or len(timeline) == 0:
        return [0.0] * P
    col = _columns(timeline)
    mod, chunk, role, dev = col["module"], col["chunk"], col["role"], col["device"]
    out = np.zeros(P)
    pipes = {p.module: p for p in schedule.pipelines}
    encoders_of = {e.name: e for e in workload.encoders}
    for i, name in enumerate(col["names"]):
        pipe = pipes.get(name)
        enc = encoders_of.get(base_module(name))
        if pipe is None and enc is None:
            continue  # an encoder this workload leaves out (transpose's memory cap: the LLM alone)
        mine = mod == i
        if pipe is not None:
            static = chunk_costs(pipe, workload).static
            held = np.bincount(chunk[mine] * P + dev[mine], minlength=pipe.chunks * P).reshape(pipe.chunks, P)
            out += (held > 0).T @ np.asarray(static)
            continue
        holds = np.bincount(dev[mine], minlength=P) > 0
        trains = np.bincount(dev[mine & (role == 1)], minlength=P) > 0
        copies = int(trains.sum())  # the trained copies its state may be sharded over
        out += np.where(trains, enc.static_of_copy(True, copies), np.where(holds, enc.static_of_copy(False), 0.0))
    return out.tolist()


def peak_activation_memory(schedule: Schedule, workload: Workload, timeline: Timeline) -> list[float]:
    """Per device, the most activation memory live at once."""
    device, _, delta = memory_events(schedule, workload, timeline)
    peaks = [0.0] * timeline.devices
    bounds = np.searchsorted(device, np.arange(timeline.devices + 1))
    for d in range(timeline.devices):
        if bounds[d] < bounds[d + 1]:
            peaks[d] = max(0.0, float(np.cumsum(delta[bounds[d]:bounds[d + 1]]).max()))
    return peaks


def peak_memory(schedule: Schedule, workload: Workload, timeline: Timeline) -> list[float]:
    """Per device, static memory plus the peak of its activations."""
    static = static_memory(schedule, workload, timeline)
    return [s + a for s, a in zip(static, peak_activation_memory(schedule, workload, timeline))]


def activation_over_time(schedule: Schedule, workload: Workload,
                         timeline: Timeline) -> list[list[tuple[float, float]]]:
    """Per device, the step function (time, activation memory)."""
    device, time, delta = memory_events(schedule, workload, timeline)
    series: list[list[tuple[float, float]]] = [[(0.0, 0.0)] for _ in range(timeline.devices)]
    bounds = np.searchsorted(device, np.arange(timeline.devices + 1))
    for d in range(timeline.devices):
        a, b = bounds[d], bounds[d + 1]
        series[d] += zip(time[a:b].tolist(), np.cumsum(delta[a:b]).tolist())
    return series


def memory_over_time(schedule: Schedule, workload: Workload, timeline: Timeline,
                     static: list[float] | None = None) -> list[list[tuple[float, float]]]:
    """Per device, the step function (time, static + activation memory) for plotting:
    it starts at the device's static memory (`static`, if already computed)."""
    static = static_memory(schedule, workload, timeline) if static is None else static
    series = activation_over_time(schedule, workload, timeline)
    return [[(t, s + v) for t, v in points] for points, s in zip(series, static)]
