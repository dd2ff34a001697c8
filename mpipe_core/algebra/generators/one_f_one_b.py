"""1F1B: one forward, one backward in the steady state."""
from __future__ import annotations

from mpipe_core.algebra.generators.common import lockstep, require_sizes
from mpipe_core.errors import ArgumentError
from mpipe_core.ir.ops import BW, F
from mpipe_core.ir.schedule import Schedule, single_pipeline


def one_f_one_b(p: int, m: int) -> Schedule:
    """Textbook 1F1B (PipeDream-Flush, as in Megatron-LM).

    Rank r holds chunk r, runs `min(m, p-r-1)` warm-up forwards, then
    alternates one forward and one fused backward, then runs the remaining
    backwards.  Equivalently, the backward stream trails the forward stream by
    `p-1-r` steps.

    torch 2.13's `Schedule1F1B.pipeline_order` is not used as the reference: on
    the last rank it never runs F0 (torch's own `_validate_schedule` rejects
    it).  Its constructor's rule that m >= p is kept, so the same terms are
    accepted.
    """
    require_sizes(p, m)
    if m < p:
        raise ArgumentError("m", f"1f1b needs m >= p, as torch's Schedule1F1B does (got m={m}, p={p})")
    orders = [lockstep(rank, m, ((F, 0), (BW, p - 1 - rank))) for rank in range(p)]
    return single_pipeline(orders, chunks=p, microbatches=m)
