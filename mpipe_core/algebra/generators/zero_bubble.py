"""ZB-H1 and ZB-H2: 1F1B with the backward split into B (input grad) and W (weight grad).

Both are the paper's handcrafted schedules (Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024, arXiv:2401.10241).  On rank r of p, the three streams
F, B and W run in lockstep with fixed lags (see `common.lockstep`): at step x
the rank runs F(x), then B(x - b_lag), then W(x - w_lag).

- ZB-H1: b_lag = p-1-r (1F1B's warm-up), w_lag = p-1.  Same peak activation
  memory as 1F1B; W fills the cool-down.
- ZB-H2: both lags doubled, b_lag = 2(p-1-r), w_lag = 2(p-1).  Rank r runs
  min(m, 2(p-r)-1) forwards before its first B (about twice 1F1B's in-flight
  activations); W trails F by 2(p-1) steps on every rank, so rank p-1
  ends with 2(p-1) W's in a row.
  With F = B = W and m >= 2p-1, rank r is busy without a gap from time r to
  r + 3m (the paper's parallelogram); when F + B > 2W it finishes before
  ZB-H1.
"""
from __future__ import annotations

from mpipe_core.algebra.generators.common import check_rounds, lockstep, require_sizes
from mpipe_core.ir.ops import B, F, W
from mpipe_core.ir.schedule import Schedule, single_pipeline


def _zero_bubble(p: int, m: int, stretch: int) -> Schedule:
    orders = [
        lockstep(rank, m, ((F, 0), (B, stretch * (p - 1 - rank)), (W, stretch * (p - 1))))
        for rank in range(p)
    ]
    return single_pipeline(orders, chunks=p, microbatches=m)


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1: rank r runs F(x), B(x-(p-1-r)), W(x-(p-1)) at step x.

    That is: min(m, p-1-r) warm-up forwards, then F/B pairs where W starts
    after the first r B's, then the remaining B/W pairs and the last r W's.
    This is the compute order of torch's `ScheduleInterleavedZeroBubble` with
    one stage per rank, whose rule on m (a multiple of max(1, m // p)) is kept.
    """
    require_sizes(p, m)
    check_rounds("zb_h1", p, m)
    return _zero_bubble(p, m, stretch=1)


def zb_h2(p: int, m: int) -> Schedule:
    """ZB-H2: rank r runs F(x), B(x-2(p-1-r)), W(x-2(p-1)) at step x (no torch equivalent).

    Phases on rank r, for m >= 2(p-1): 2(p-1-r) lone forwards; 2r (F, B)
    pairs; (F, B, W) triples; 2(p-1-r) (B, W) pairs; 2r lone W's.  Smaller m
    just drops the steps' out-of-range microbatches.  The order is deadlock
    free for every p and m: each dependency goes to a later step, or to the
    same step on the next rank (forwards) or a later lane (B after F, W after B).
    """
    require_sizes(p, m)
    return _zero_bubble(p, m, stretch=2)
