"""V-shape schedules: two chunks per rank, placed so the model runs down and back up.

Rank r of p holds chunk r (on the way down) and chunk 2p-1-r (on the way
back up), so the last chunk sits on rank 0 beside the first, as torch's
`generate_stage_to_rank_mapping(style="v")` places them.

Both are written as phases, a short pattern repeated a number of times;
each step of a pattern takes the next microbatch of its chunk and kind.
`zbv` spells its phases as data; `dualpipev` as loops, because its weight
gradients come from a queue of owed ones.
"""
from __future__ import annotations

from collections import deque
from itertools import repeat

import numpy as np

from mpipe_core.algebra.generators.common import require_sizes
from mpipe_core.errors import ArgumentError
from mpipe_core.ir.ops import BW, COMPUTE_KINDS, LLM, B, F, Op, W
from mpipe_core.ir.schedule import LlmColumns, Schedule, single_pipeline


def v_chunks(p: int, rank: int) -> tuple[int, int]:
    """The two chunks of `rank`: going down, coming back up."""
    return rank, 2 * p - 1 - rank


def _run_phases(phases, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Expand `(pattern, times)` phases into (kind, chunk, microbatch) columns,
    numbering each (chunk, kind) stream 0, 1, 2, ...

    A pattern names each (chunk, kind) at most once, so within a phase the
    t-th repetition runs microbatch `first + t` of every step.  Microbatches
    >= m are dropped.
    """
    next_mb: dict[tuple[int, str], int] = {}
    kinds, chunks, mbs = [], [], []
    for pattern, times in phases:
        if times <= 0:
            continue
        firsts = np.array([next_mb.get(step, 0) for step in pattern])
        mb = (firsts[None, :] + np.arange(times)[:, None]).ravel()  # repetition-major
        keep = mb < m
        kinds.append(np.tile([COMPUTE_KINDS.index(kind) for _, kind in pattern], times)[keep])
        chunks.append(np.tile([chunk for chunk, _ in pattern], times)[keep])
        mbs.append(mb[keep])
        for step, first in zip(pattern, firsts.tolist()):
            next_mb[step] = first + times
    return np.concatenate(kinds), np.concatenate(chunks), np.concatenate(mbs)


def _ops(kind: np.ndarray, chunk: np.ndarray, mb: np.ndarray) -> list[Op]:
    """The op tuples of one rank's columns (built in C iterators: a Python loop
    per op was most of zbv's generation time; Op's own __new__ is Python code)."""
    n = len(kind)
    rows = zip(repeat(LLM, n), map(COMPUTE_KINDS.__getitem__, kind.tolist()), chunk.tolist(), mb.tolist(),
               repeat(0, n))
    return list(map(tuple.__new__, repeat(Op, n), rows))


def zbv(p: int, m: int) -> Schedule:
    """ZB-V (Qi et al., 2024, arXiv:2401.10241 section 6): zero bubble on a V.

    Phases on rank r with chunks d (down) and u (up), n = max(m, 2p-1):
    2(p-r)-1 x [F d]; r x [F u, F d]; (p-r) x [F u, B u, W u];
    n-2p+r+1 x [F d, B d, W d, F u, B u, W u]; p-r-1 x [B d, W d, F u, B u, W u];
    r x [B d, B u]; (p-r) x [B d, W d]; then the W's of u still owed, then
    those of d.  Ops on microbatches >= m are then dropped (n pads small m).
    This is the compute order of torch's `ScheduleZBVZeroBubble.pipeline_order`.
    """
    require_sizes(p, m)
    n = max(m, 2 * p - 1)
    columns = []
    for rank in range(p):
        d, u = v_chunks(p, rank)
        columns.append(_run_phases([
            ([(d, F)], 2 * (p - rank) - 1),
            ([(u, F), (d, F)], rank),
            ([(u, F), (u, B), (u, W)], p - rank),
            ([(d, F), (d, B), (d, W), (u, F), (u, B), (u, W)], n - 2 * p + rank + 1),
            ([(d, B), (d, W), (u, F), (u, B), (u, W)], p - rank - 1),
            ([(d, B), (u, B)], rank),
            ([(d, B), (d, W)], p - rank),
            ([(u, W)], rank),
            ([(d, W)], rank),
        ], m))
    orders = [_ops(*rank_columns) for rank_columns in columns]
    kind, chunk, mb = (np.concatenate(column) for column in zip(*columns))
    return single_pipeline(orders, chunks=2 * p, microbatches=m, columns=LlmColumns(kind, chunk, mb))


def dualpipev(p: int, m: int) -> Schedule:
    """DualPipeV (DeepSeek's DualPipe folded onto a V; torch's `ScheduleDualPipeV`).

    Overlapped forward+backward actions are flattened: torch's OVERLAP_F_B
    action is written as its forward op immediately followed by its fused
    backward op (BW), in the order torch lists the sub-actions.  "W?" below
    runs the weight gradient of the oldest input-only backward (B) still
    owed, if any.  Phases on rank r with chunks d (down) and u (up):

    2(p-r-1) x [F d]; (r+1) x [F d, F u]; (p-r-1) x [B u, W?, F u];
    (m-2p+r+1) x [F d, BW u, F u, BW d]; (p-r-1) x [BW u, F u, BW d];
    (r+1) x [back u, back d] where the first r+1 of these are BW and the
    rest B; (p-r-1) x [W?, B d]; then every W still owed.

    This is the compute order of torch's `ScheduleDualPipeV.pipeline_order`.
    torch needs m >= 2p, and so does this.
    """
    require_sizes(p, m)
    if m < 2 * p:
        raise ArgumentError("m", f"dualpipev needs m >= 2p, as torch's ScheduleDualPipeV does (got m={m}, p={p})")
    orders = []
    for rank in range(p):
        d, u = v_chunks(p, rank)
        next_f = {d: 0, u: 0}
        next_back = {d: 0, u: 0}  # B and BW share one microbatch counter per chunk
        owed_w: deque[tuple[int, int]] = deque()
        order: list[Op] = []

        def forward(chunk: int) -> None:
            order.append(Op(LLM, F, chunk, next_f[chunk]))
            next_f[chunk] += 1

        def backward(chunk: int, split: bool = False) -> None:
            mb = next_back[chunk]
            next_back[chunk] += 1
            order.append(Op(LLM, B if split else BW, chunk, mb))
            if split:
                owed_w.append((chunk, mb))

        def weight_if_owed() -> None:
            if owed_w:
                chunk, mb = owed_w.popleft()
                order.append(Op(LLM, W, chunk, mb))

        for _ in range(2 * (p - rank - 1)):
            forward(d)
        for _ in range(rank + 1):
            forward(d)
            forward(u)
        for _ in range(p - rank - 1):
            backward(u, split=True)
            weight_if_owed()
            forward(u)
        for _ in range(m - 2 * p + rank + 1):
            forward(d)
            backward(u)
            forward(u)
            backward(d)
        for _ in range(p - rank - 1):
            backward(u)
            forward(u)
            backward(d)
        for i in range(2 * (rank + 1)):
            backward(u if i % 2 == 0 else d, split=i >= rank + 1)
        for _ in range(p - rank - 1):
            weight_if_owed()
            backward(d, split=True)
        while owed_w:
            weight_if_owed()
        orders.append(order)
    return single_pipeline(orders, chunks=2 * p, microbatches=m)
