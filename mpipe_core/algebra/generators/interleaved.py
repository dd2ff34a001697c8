"""Interleaved 1F1B: 1F1B over v looped chunks per rank, depth first."""
from __future__ import annotations

from mpipe_core.algebra.generators.common import check_rounds, require_sizes, warmup_then_alternate
from mpipe_core.ir.ops import BW, LLM, F, Op
from mpipe_core.ir.schedule import Schedule, single_pipeline


def depth_first(kind: str, rank: int, p: int, m: int, v: int, per_round: int) -> list[Op]:
    """One rank's forwards (kind F) or backwards: `per_round` microbatches per chunk, chunk by chunk.

    Rank r holds the looped chunks r, r+p, ..., r+(v-1)p.  Forwards visit them
    first to last, backwards last to first; once every chunk has run a block
    of `per_round` microbatches, the next round of microbatches starts.
    """
    ops = []
    for k in range(m * v):
        local = (k // per_round) % v
        if kind != F:
            local = v - 1 - local
        mb = (k // (per_round * v)) * per_round + k % per_round
        ops.append(Op(LLM, kind, local * p + rank, mb))
    return ops


def interleaved(p: int, m: int, v: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., 2021), in torch's flexible form.

    Microbatches go in `max(1, m // p)` equal rounds (torch rejects m that the
    rounds do not divide).  Rank r streams its forwards and its fused
    backwards depth first (see `depth_first`) and merges them 1F1B-style after
    `min((v-1)*per_round + 2*(p-1-r), m*v)` warm-up forwards.  This is the
    compute order of torch's `ScheduleInterleaved1F1B.pipeline_order`.
    """
    require_sizes(p, m, v)
    per_round = check_rounds("interleaved", p, m)
    orders = []
    for rank in range(p):
        warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
        forwards = depth_first(F, rank, p, m, v, per_round)
        backwards = depth_first(BW, rank, p, m, v, per_round)
        orders.append(warmup_then_alternate(forwards, backwards, warmup))
    return single_pipeline(orders, chunks=p * v, microbatches=m)
