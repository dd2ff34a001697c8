"""disaggregate: the encoders on k devices of their own (Megatron MIMO's
non-colocated layout, DistMM, DistTrain).

The input's LLM orders stay as they are on its P devices; devices P .. P+k-1
run only the encoders, data parallel.  Microbatches (groups, with
`encoder_batch`) are taken in order, each by the encoder device whose
forwards so far add up least (list scheduling: the device free first; ties to
the lowest number), which with equal costs is round-robin.  Each device runs
its forwards in that order, the features going to LLM chunk 0's device over
the link; a trainable encoder then runs each backward on the same device,
in the order chunk 0 finishes the input gradients it needs, and an
all-reduce over the k encoder devices (none for k = 1) ends the step.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import replace

from mpipe_core.algebra.combinators.common import CombineError, encoder_layout_body, group_encoder_work
from mpipe_core.algebra.combinators.encoders import groups_completed
from mpipe_core.errors import ArgumentError
from mpipe_core.ir.ops import ALLREDUCE, BW, NO_MICROBATCH, B, F, Op, W
from mpipe_core.ir.schedule import Schedule
from mpipe_core.workloads.workload import Workload


def disaggregate(schedule: Schedule, workload: Workload, encoder_devices: int) -> Schedule:
    body = encoder_layout_body(schedule, workload, "disaggregate")
    if any(not order for order in body.orders):
        raise CombineError("disaggregate needs LLM work on every device of its input (the input has a device "
                           "of encoders only, as encoder_stage makes)")
    if encoder_devices < 1:
        raise ArgumentError("encoder_devices", f"encoder_devices must be >= 1, got {encoder_devices}")
    pipe = body.pipelines[0]
    K = encoder_devices
    encs = workload.encoders
    trainable = [e for e in encs if e.trainable]
    split = any(op.kind == B for op in body.ops())
    owner = assign(group_encoder_work(pipe, workload, backward=False), [g for g, _ in pipe.groups()], K)
    chunk0 = [op for order in body.orders for op in order if op.module == pipe.module and op.chunk == 0]
    completed = groups_completed(pipe, [op for op in chunk0 if op.kind in (B, BW)])
    mine: dict[int, list[int]] = defaultdict(list)
    for g, j in owner.items():
        mine[j].append(g)
    orders: list[list[Op]] = [list(o) for o in body.orders]
    for j in range(K):
        out: list[Op] = []
        for step in range(pipe.steps):
            out += [Op(e.name, F, 0, g, step) for g in mine[j] for e in encs]
            if not trainable:
                continue
            for g, s in completed:
                if s != step or owner[g] != j:
                    continue
                for e in trainable:
                    out += [Op(e.name, B, 0, g, step), Op(e.name, W, 0, g, step)] if split \
                        else [Op(e.name, BW, 0, g, step)]
            if K > 1:
                out += [Op(e.name, ALLREDUCE, body.devices + j, NO_MICROBATCH, step) for e in trainable]
        orders.append(out)
    return body.with_orders(orders, encoders=tuple(e.name for e in encs),
                            pipelines=(replace(pipe, encoder_devices=K),))


def assign(cost: dict[int, float], units: list[int], devices: int) -> dict[int, int]:
    """List scheduling: each unit in order to the device whose load is least
    (ties: the lowest device), loads counted in forward time."""
    free = [(0.0, j) for j in range(devices)]
    owner: dict[int, int] = {}
    for g in units:
        load, j = heapq.heappop(free)
        owner[g] = j
        heapq.heappush(free, (load + cost[g], j))
    return owner
