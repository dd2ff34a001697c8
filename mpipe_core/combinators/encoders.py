"""Encoder placement baselines: fused on the first stage, or a stage of their own."""
from __future__ import annotations

from ..chunks import folds_encoders
from ..ops import B, BW, F, LLM, Op, W
from ..schedule import Schedule
from ..workload import Workload
from .common import CombineError


def fuse_encoders(schedule: Schedule, workload: Workload) -> Schedule:
    """The conventional layout: on the device of LLM chunk 0, each encoder's
    forward of microbatch m runs right before F(0, m), and (if trainable) its
    backward right after chunk 0's backward of m (BW after BW; B after B, W after W)."""
    if not workload.encoders or schedule.encoders:
        return schedule
    trainable = [e for e in workload.encoders if e.trainable]
    orders = []
    for order in schedule.orders:
        new: list[Op] = []
        for op in order:
            module, kind, chunk, mb, step = op
            if chunk == 0 and module.split("@")[0] == LLM:
                rep = module[len(LLM):]  # "" or "@k"
                if kind == F:
                    new.extend(Op(e.name + rep, F, 0, mb, step) for e in workload.encoders)
                    new.append(op)
                    continue
                new.append(op)
                if kind in (B, BW, W):
                    new.extend(Op(e.name + rep, kind, 0, mb, step) for e in trainable)
                continue
            new.append(op)
        orders.append(new)
    return schedule.with_orders(orders, encoders=tuple(e.name for e in workload.encoders))


def encoder_stage(schedule: Schedule, workload: Workload) -> Schedule:
    """The encoders get one extra device (device 0) ahead of the LLM's stages.

    That device runs like a 1F1B stage in front of the pipeline: up to P
    forwards ahead (P = the LLM's device count), then one backward (if
    trainable) per forward, then the remaining backwards.  Microbatches go in
    the order LLM chunk 0 consumes them."""
    if not workload.encoders:
        raise CombineError("encoder_stage needs a workload with encoders (this one has none)")
    if folds_encoders(schedule.pipelines):
        raise CombineError("balanced(...) already folded the encoders into the LLM chunks")
    llm_only = schedule.llm_only()
    if len(llm_only.pipelines) != 1:
        raise CombineError("encoder_stage works on a single pipeline (not par/overlay)")
    pipe = llm_only.pipelines[0]
    first = [op for order in llm_only.orders for op in order if op.module == pipe.module and op.chunk == 0]
    f_order = [(op.mb, op.step) for op in first if op.kind == F]
    b_order = [(op.mb, op.step) for op in first if op.kind in (B, BW)]
    split = any(op.kind == B for op in first)
    encs = workload.encoders
    trainable = [e for e in encs if e.trainable]

    def forward(mb, step):
        return [Op(e.name, F, 0, mb, step) for e in encs]

    def backward(mb, step):
        if split:
            return [Op(e.name, k, 0, mb, step) for e in trainable for k in (B, W)]
        return [Op(e.name, BW, 0, mb, step) for e in trainable]

    stage: list[Op] = []
    if not trainable:
        for mb, step in f_order:
            stage += forward(mb, step)
    else:
        ahead = min(len(f_order), llm_only.devices)
        done_b = 0
        for mb, step in f_order[:ahead]:
            stage += forward(mb, step)
        for mb, step in f_order[ahead:]:
            stage += backward(*b_order[done_b])
            done_b += 1
            stage += forward(mb, step)
        for mb, step in b_order[done_b:]:
            stage += backward(mb, step)
    return llm_only.with_orders([stage] + [list(o) for o in llm_only.orders],
                                encoders=tuple(e.name for e in encs))
