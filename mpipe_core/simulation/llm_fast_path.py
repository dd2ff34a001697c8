"""The simulator's fast path: one LLM pipeline, one step, no encoder ops.

That is what every big term is (a generator, split/deferred, partitioned or
balanced), and what a user's `mpipe eval` of one spends its time on.  Ops
become integer ids `(kind * C + chunk) * M + mb`, so the completeness check,
each op's single producer, its duration and the transfer it pays are numpy
arrays; only the ASAP sweep itself stays a Python loop, over plain ints and
floats.  The rules are the dataflow's (see `dataflow.py`): F(c) after F(c-1);
the last chunk's backward after its F; B/BW(c) after the backward of c+1;
W after B.  Anything this path cannot accept (other ops, a missing or
duplicate op, a deadlock) returns None and the general simulator takes
over, with its messages.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from mpipe_core.ir.ops import COMPUTE_KINDS, unzip
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.chunks import chunk_costs
from mpipe_core.simulation.p2p import blocking_sends, p2p_extras, p2p_extras_per_microbatch
from mpipe_core.workloads.workload import Workload

KINDS = COMPUTE_KINDS  # a kind's code is its index here (as in `LlmColumns`)
KIND_CODE = {kind: code for code, kind in enumerate(KINDS)}


def simulate_llm_pipeline(schedule: Schedule, workload: Workload):
    """(ops, device, start, end) lists and their numpy columns, or None when
    the general path must run."""
    if len(schedule.pipelines) != 1 or schedule.encoders or workload.host.contends:
        return None  # (shared hosts: the processor-sharing simulation in `contention.py`)
    pipe = schedule.pipelines[0]
    if pipe.steps != 1 or pipe.replica != 0 or (workload.encoders and pipe.encoder_layers is None):
        return None
    ops = list(chain.from_iterable(schedule.orders))
    n = len(ops)
    if n == 0:
        return None
    C, M = pipe.chunks, pipe.microbatches
    if schedule.llm_columns is not None:  # the generator's own columns: all llm, step 0
        code, chunk, mb = schedule.llm_columns.kind, schedule.llm_columns.chunk, schedule.llm_columns.mb
    else:
        modules, kinds, chunks, mbs, steps = unzip(ops)
        if modules.count(pipe.module) != n or steps.count(0) != n:  # C-speed counts, no sets
            return None
        try:
            code = np.fromiter(map(KIND_CODE.__getitem__, kinds), dtype=np.int64, count=n)
        except KeyError:  # a kind the LLM does not have
            return None
        chunk = np.fromiter(chunks, dtype=np.int64, count=n)
        mb = np.fromiter(mbs, dtype=np.int64, count=n)
    if chunk.min() < 0 or chunk.max() >= C or mb.min() < 0 or mb.max() >= M:
        return None
    ids = (code * C + chunk) * M + mb
    count = np.bincount(ids, minlength=4 * C * M).reshape(4, C, M)
    split, fused = count[1] == 1, count[3] == 1
    if count.max() > 1 or not (count[0] == 1).all() or not (split == (count[2] == 1)).all() \
            or not (split ^ fused).all():
        return None  # the general path names what is wrong
    lengths = [len(o) for o in schedule.orders]
    device = np.repeat(np.arange(len(lengths)), lengths)
    producer, lag, duration, position = llm_rows(pipe, workload, code, chunk, mb, ids, count, device,
                                                  devices=len(lengths))
    end = _sweep(lengths, producer.tolist(), lag.tolist(), duration.tolist())
    if end is None:
        return None
    end_at = np.fromiter(end, float, n)
    # Each start is what the sweep waited for: the device's previous op, or
    # the producer's end plus its transfer (the same float operations, so the
    # same values, as the sweep's own max).
    previous = np.empty(n)
    previous[0] = 0.0
    previous[1:] = end_at[:-1]
    firsts = np.cumsum(lengths[:-1], dtype=np.int64)
    previous[firsts[firsts < n]] = 0.0  # each device's first op (trailing empty devices have none)
    ready = np.where(producer >= 0, end_at[np.maximum(producer, 0)] + lag, -np.inf)
    start_at = np.maximum(previous, ready)
    start = start_at.tolist()
    # What the memory metrics need, in `memory.columns`' shape (one module).
    columns = {"names": [pipe.module], "module": np.zeros(n, dtype=np.int64),
               "role": np.where(code == 0, 0, 1), "chunk": chunk, "mb": mb, "step": np.zeros(n, dtype=np.int64),
               "device": device, "start": start_at, "end": end_at, "kind": code,
               "llm_key": chunk * M + mb}  # one forward per key, checked above (`memory._llm_lifetimes`)
    return ops, device.tolist(), start, end, columns


def llm_rows(pipe, workload: Workload, code, chunk, mb, ids, count, device, rows=None, devices=None):
    """For LLM rows (kind code, chunk, microbatch, id and device columns, and
    `count`, the ops per id of the whole pipeline; `rows`: each one's row in
    the whole schedule, default 0..n-1): the row of each one's producer (-1:
    none, or F(0, m), whose producers are encoder ops), what its result costs
    to move here, the op's duration, and the row of every id (-1: absent)."""
    C, M = pipe.chunks, pipe.microbatches
    n = len(code)
    device_of = np.full(4 * C * M, -1, dtype=np.int64)
    device_of[ids] = device
    # The one producer of each op, and what its result costs to move here.
    back_of_next = np.where(count[1].reshape(-1) == 1, 1, 3)  # B if split else BW, per (c, m)
    producer = np.full(n, -1, dtype=np.int64)
    cm = chunk * M + mb
    is_f, is_w = code == 0, code == 2
    is_back = (code == 1) | (code == 3)
    later = np.minimum(cm + M, C * M - 1)  # (c + 1, m), clipped for the last chunk
    producer = np.where(is_f & (chunk > 0), cm - M, producer)  # F(c-1, m)
    last = is_back & (chunk == C - 1)
    producer = np.where(last, cm, producer)  # F(c, m)
    inner = is_back & (chunk < C - 1)
    producer = np.where(inner, back_of_next[later] * C * M + later, producer)  # backward of c+1
    producer = np.where(is_w, C * M + cm, producer)  # B(c, m)
    devices = devices if devices is not None else int(device.max(initial=0)) + 1
    link = workload.link_for(devices)
    # A blocking send is part of the sending op (p2p.py): the edge then costs nothing more.
    boundary = 0.0 if blocking_sends(workload) else link.transfer(workload.llm.boundary_bytes)
    safe = np.where(producer >= 0, producer, 0)
    crossing = (is_f & (chunk > 0)) | inner
    cluster = workload.step is not None and workload.step.cluster is not None
    if workload.llm.token_ratio is not None and not blocking_sends(workload):
        hop = _boundary_per_microbatch(workload, link, devices, device_of[safe], device, mb, crossing, cluster)
    elif cluster and boundary != 0.0:
        # Each hop on the link between the two stages' devices.
        src = device_of[safe]
        hops = np.zeros((devices, devices))
        for a, b in set(zip(src[crossing].tolist(), np.asarray(device)[crossing].tolist())):
            if 0 <= a < devices and 0 <= b < devices:
                hops[a, b] = workload.boundary_transfer_between(devices, a, b)
        hop = np.where(crossing, hops[np.clip(src, 0, devices - 1), np.clip(device, 0, devices - 1)],
                       link.latency)
    else:
        hop = np.where(crossing, boundary, link.latency)
    lag = np.where((producer >= 0) & (device_of[safe] != device), hop, 0.0)

    costs = chunk_costs(pipe, workload)
    table = np.array([costs.llm[k] for k in KINDS])  # kind x chunk
    duration = table[code, chunk]
    per_mb = None
    if workload.step is not None:
        where: list = [None] * C
        forwards = np.flatnonzero(is_f)
        for c_, d_ in zip(chunk[forwards].tolist(), device[forwards].tolist()):
            if where[c_] is None:
                where[c_] = d_
        if workload.llm.token_ratio is not None:  # a drawn batch: each microbatch's own hidden state
            per_mb = p2p_extras_per_microbatch(C, where, workload, devices, M)
            if per_mb is not None:
                per_mb = np.array([per_mb[k] for k in KINDS])[code, chunk, mb]  # added last, as `CostModel`
        else:
            extras = p2p_extras(C, where, workload, devices)
            if extras is not None:
                duration = duration + np.array([extras[k] for k in KINDS])[code, chunk]
    if costs.encoder is not None:
        folded = np.array([costs.encoder[k] for k in KINDS])  # kind x chunk x microbatch
        duration = duration + folded[code, chunk, mb]
    if per_mb is not None:
        duration = duration + per_mb

    position = np.full(4 * C * M, -1, dtype=np.int64)
    position[ids] = np.arange(n) if rows is None else rows
    producer = np.where(producer >= 0, position[safe], -1)
    return producer, lag, duration, position


def _boundary_per_microbatch(workload: Workload, link, devices: int, src, dst, mb, crossing, cluster: bool):
    """Per row, what a crossing edge costs in a drawn batch: microbatch mb's hidden
    state (`LLM.boundary_bytes_of`), on the stages' own link with a cluster (the
    same prices as `CostModel.boundary`); the link's latency elsewhere."""
    hop = np.full(len(mb), link.latency)
    rows = np.flatnonzero(crossing)
    if not cluster:
        microbatches = range(len(workload.llm.token_ratio))
        per_mb = np.array([link.transfer(workload.llm.boundary_bytes_of(m)) for m in microbatches])
        hop[rows] = per_mb[mb[rows]]
        return hop
    prices: dict = {}
    out = []
    for a, b, m in zip(src[rows].tolist(), np.asarray(dst)[rows].tolist(), mb[rows].tolist()):
        price = prices.get((a, b, m))
        if price is None:
            price = prices[(a, b, m)] = workload.boundary_transfer_between(
                devices, a, b, workload.llm.boundary_bytes_of(m)) if 0 <= a < devices and 0 <= b < devices else 0.0
        out.append(price)
    hop[rows] = out
    return hop


def _sweep(lengths, producer, lag, duration):
    """ASAP end times, device by device: run a device until its next op waits
    for one not yet done, then switch to a device that can go on.  Ops are rows
    (device by device in order); `producer` is a row or -1."""
    n = len(producer)
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
    return end
