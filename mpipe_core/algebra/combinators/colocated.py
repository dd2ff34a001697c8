"""colocated: Megatron MIMO's colocated schedule on the input's devices.

Three phases, each a barrier (the encoder's collectives need every device):

1. Every device runs the encoder forward for its data-parallel share of the
   step's microbatches (or groups, `encoder_batch`); the shares' features go
   to the device of LLM chunk 0 (`GATHER` closes the phase on every device).
2. The input's LLM ops, in its order, on the gathered (detached) features.
3. Trainable encoders only: once chunk 0 has produced the input gradient of
   every microbatch's features (`SCATTER` opens the phase), each device runs
   the encoder backward of its own share, fed the feature gradients over the
   link, then the gradient all-reduce (`AR`) over all the devices.

Shares are contiguous slices in microbatch order, the first to chunk 0's
device, the others in device order: the split whose largest share has the
least encoder work (F, plus B and W if trainable), exactly, and among those
the most even (`partition.split_min_max`).  With equal costs and P dividing
M that is M/P microbatches each.
"""
from __future__ import annotations

from collections import defaultdict

from mpipe_core.algebra.combinators.common import (
    CombineError,
    encoder_layout_body,
    first_stage_first,
    group_encoder_work,
)
from mpipe_core.algebra.combinators.partition import split_min_max
from mpipe_core.ir.ops import ALLREDUCE, BW, GATHER, NO_MICROBATCH, SCATTER, B, F, Op, W
from mpipe_core.ir.schedule import Pipeline, Schedule
from mpipe_core.workloads.workload import Workload


def colocated(schedule: Schedule, workload: Workload) -> Schedule:
    body = encoder_layout_body(schedule, workload, "colocated")
    if any(not order for order in body.orders):
        raise CombineError("colocated needs LLM work on every device (the input has a device of "
                           "encoders only, as encoder_stage makes)")
    pipe = body.pipelines[0]
    P = body.devices
    encs = workload.encoders
    trainable = [e for e in encs if e.trainable]
    split = any(op.kind == B for op in body.ops())
    share = dict(zip(first_stage_first(body), shares(pipe, workload, P)))
    orders: list[list[Op]] = []
    for d in range(P):
        by_step: dict[int, list[Op]] = defaultdict(list)
        for op in body.orders[d]:
            by_step[op.step].append(op)
        out: list[Op] = []
        for step in range(pipe.steps):
            out += [Op(e.name, F, 0, g, step) for g in share[d] for e in encs]
            if P > 1:
                out += [Op(e.name, GATHER, d, NO_MICROBATCH, step) for e in encs]
            out += by_step.get(step, [])
            if not trainable:
                continue
            if P > 1:
                out += [Op(e.name, SCATTER, d, NO_MICROBATCH, step) for e in trainable]
            for g in share[d]:
                for e in trainable:
                    out += [Op(e.name, B, 0, g, step), Op(e.name, W, 0, g, step)] if split \
                        else [Op(e.name, BW, 0, g, step)]
            if P > 1:
                out += [Op(e.name, ALLREDUCE, d, NO_MICROBATCH, step) for e in trainable]
        orders.append(out)
    return body.with_orders(orders, encoders=tuple(e.name for e in encs))


def shares(pipe: Pipeline, workload: Workload, parts: int) -> list[list[int]]:
    """`parts` contiguous slices of the groups (their first microbatches), in
    order: the least possible largest encoder work, the rest as even as that
    allows.  Fewer groups than parts: one each, the last parts empty."""
    firsts = [g for g, _ in pipe.groups()]
    if len(firsts) <= parts:
        return [[g] for g in firsts] + [[] for _ in range(parts - len(firsts))]
    work = group_encoder_work(pipe, workload, backward=True)
    sizes = split_min_max([work[g] for g in firsts], parts)
    out, at = [], 0
    for size in sizes:
        out.append(firsts[at:at + size])
        at += size
    return out
