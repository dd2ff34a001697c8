"""GPipe: every forward, then every backward."""
from __future__ import annotations

from mpipe_core.algebra.generators.common import require_sizes
from mpipe_core.ir.ops import BW, LLM, F, Op
from mpipe_core.ir.schedule import Schedule, single_pipeline


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al., 2019): fill with all m forwards, then drain all m backwards.

    Rank r holds chunk r and runs F0..F(m-1), then fused backwards BW0..BW(m-1)
    in the same microbatch order.  This is the compute order of torch's
    `ScheduleGPipe.pipeline_order` (which also uses the fused backward).
    """
    require_sizes(p, m)
    orders = [
        [Op(LLM, F, rank, mb) for mb in range(m)] + [Op(LLM, BW, rank, mb) for mb in range(m)]
        for rank in range(p)
    ]
    return single_pipeline(orders, chunks=p, microbatches=m)
