"""Encoder placement baselines (fused on the first stage, or a stage of their
own) and `encoder_batch`, one encoder op per group of microbatches."""
from __future__ import annotations

from dataclasses import replace

from mpipe_core.algebra.combinators.common import CombineError, GroupCountdown, encoder_layout_body
from mpipe_core.errors import ArgumentError
from mpipe_core.ir.ops import BW, LLM, B, F, Op, W, base_module
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.chunks import folds_encoders
from mpipe_core.workloads.workload import Workload


def with_encoder_batch(schedule: Schedule, k: int) -> Schedule:
    """The same schedule whose pipelines serve k microbatches per encoder op."""
    if all(p.encoder_batch == k for p in schedule.pipelines):
        return schedule
    pipelines = tuple(replace(p, encoder_batch=k) for p in schedule.pipelines)
    return schedule.with_orders(schedule.orders, pipelines=pipelines, llm_columns=schedule.llm_columns)


def fuse_encoders(schedule: Schedule, workload: Workload, group: int = 1) -> Schedule:
    """The conventional layout: on the device of LLM chunk 0, each encoder's
    forward of microbatch m runs right before F(0, m), and (if trainable) its
    backward right after chunk 0's backward of m (BW after BW; B after B, W after W).

    With `group` k > 1 (`encoder_batch`) one encoder op serves k consecutive
    microbatches: its forward runs before the first of their F(0, m), its
    backward parts after the last of their chunk-0 backward parts."""
    if group != 1:
        schedule = with_encoder_batch(schedule, group)
    if not workload.encoders or schedule.encoders:
        return schedule
    trainable = [e for e in workload.encoders if e.trainable]
    pipes = {p.module: p for p in schedule.pipelines}
    seen: dict[tuple, int] = {}  # (module, F or B, group, step) -> chunk-0 ops of that group seen so far
    weight_after: set = set()  # chunk-0 W ops the encoders' W follows
    orders = []
    for order in schedule.orders:
        new: list[Op] = []
        for op in order:
            module, kind, chunk, mb, step = op
            if chunk == 0 and base_module(module) == LLM:
                rep = module[len(LLM):]  # "" or "@k"
                pipe = pipes[module]
                first = pipe.group_of(mb)
                new.append(op)
                if kind == W:
                    if op in weight_after:
                        new.extend(Op(e.name + rep, W, 0, first, step) for e in trainable)
                    continue
                key = (module, F if kind == F else B, first, step)
                count = seen[key] = seen.get(key, 0) + 1
                if kind == F:
                    if count == 1:
                        new[-1:] = [Op(e.name + rep, F, 0, first, step) for e in workload.encoders] + [op]
                elif count == min(pipe.encoder_batch, pipe.microbatches - first):
                    # the group's last input gradient: its backward (split as that op is)
                    new.extend(Op(e.name + rep, kind, 0, first, step) for e in trainable)
                    if kind == B:
                        weight_after.add(op._replace(kind=W))
                continue
            new.append(op)
        orders.append(new)
    return schedule.with_orders(orders, encoders=tuple(e.name for e in workload.encoders))


def encoder_batch(schedule: Schedule, workload: Workload, k: int) -> Schedule:
    """One encoder op per k consecutive microbatches, wherever the inner term
    puts the encoders (MindSpeed-MM `--hetero-encoder-mbs-scale`, FlagScale
    `vit_batch_factor`).  The evaluator builds the inner term with groups of k
    (every placement reads `Pipeline.encoder_batch`); this checks the result."""
    if not workload.encoders:
        raise CombineError("encoder_batch needs a workload with encoders (this one has none)")
    if folds_encoders(schedule.pipelines):
        raise CombineError("balanced(...) already folded the encoders into the LLM chunks: there are no "
                           "encoder ops to group")
    for pipe in schedule.pipelines:
        if k > pipe.microbatches:
            raise ArgumentError("k", f"k={k} is more than the {pipe.microbatches} microbatches of a step "
                                     f"(a group holds at most all of them)")
    return schedule


def encoder_stage(schedule: Schedule, workload: Workload) -> Schedule:
    """The encoders get one extra device (device 0) ahead of the LLM's stages.

    That device runs like a 1F1B stage in front of the pipeline: up to P
    forwards ahead (P = the LLM's device count), then one backward (if
    trainable) per forward, then the remaining backwards.  Microbatches (or
    groups of them, `encoder_batch`) go in the order LLM chunk 0 consumes
    them; a group's backward comes when chunk 0 has finished its last one."""
    llm_only = encoder_layout_body(schedule, workload, "encoder_stage")
    pipe = llm_only.pipelines[0]
    first = [op for order in llm_only.orders for op in order if op.module == pipe.module and op.chunk == 0]
    f_order = list(dict.fromkeys((pipe.group_of(op.mb), op.step) for op in first if op.kind == F))
    b_order = groups_completed(pipe, [op for op in first if op.kind in (B, BW)])
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
        # Backward i runs after forward P + i, or later if chunk 0 consumes
        # more forwards before that backward's input gradient (else its wait
        # would hold back a forward chunk 0 needs first: gpipe, few stages).
        needed = _forwards_before(pipe, first, b_order)
        # ... and never a forward of a later step before a backward (the optimizer update is between).
        up_to = {step: sum(1 for _, s in f_order if s <= step) for _, step in b_order}
        done_f = 0
        for i, (mb, step) in enumerate(b_order):
            ahead = min(up_to[step], max(llm_only.devices + i, needed[i]))
            while done_f < ahead:
                stage += forward(*f_order[done_f])
                done_f += 1
            stage += backward(mb, step)
        for mb, step in f_order[done_f:]:
            stage += forward(mb, step)
    return llm_only.with_orders([stage] + [list(o) for o in llm_only.orders],
                                encoders=tuple(e.name for e in encs))


def _forwards_before(pipe, chunk0: list[Op], b_order: list[tuple[int, int]]) -> list[int]:
    """For each group in `b_order`: how many groups chunk 0 (its ops in order)
    starts forwarding before it completes that group's input gradient."""
    started: set = set()
    before: dict[tuple[int, int], int] = {}
    countdown = GroupCountdown(pipe)
    for op in chunk0:
        if op.kind == F:
            started.add((pipe.group_of(op.mb), op.step))
        elif (key := countdown.closes(op)) is not None:
            before[key] = len(started)
    return [before[key] for key in b_order]


def groups_completed(pipe, backwards: list[Op]) -> list[tuple[int, int]]:
    """(group's first microbatch, step) in the order `backwards` (chunk 0's
    input-gradient ops, in order) finishes each group's last microbatch."""
    countdown = GroupCountdown(pipe)
    return [key for op in backwards if (key := countdown.closes(op)) is not None]
