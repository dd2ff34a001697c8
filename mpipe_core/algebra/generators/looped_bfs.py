"""Looped BFS: v looped chunks per rank, breadth first."""
from __future__ import annotations

from mpipe_core.algebra.generators.common import require_sizes
from mpipe_core.ir.ops import BW, LLM, F, Op
from mpipe_core.ir.schedule import Schedule, single_pipeline


def looped_bfs(p: int, m: int, v: int = 2) -> Schedule:
    """Breadth-first pipeline (Lamy-Poirier, 2022, arXiv:2211.05953).

    Rank r holds the looped chunks r, r+p, ..., r+(v-1)p.  It runs every
    microbatch's forward on its first chunk, then on its next chunk, and so on;
    then the fused backwards from its last chunk back to its first, each chunk
    from the last microbatch down to microbatch 0.  This is the compute order
    of torch's `ScheduleLoopedBFS.pipeline_order`.
    """
    require_sizes(p, m, v)
    orders = []
    for rank in range(p):
        chunks = range(rank, p * v, p)
        order = [Op(LLM, F, c, mb) for c in chunks for mb in range(m)]
        order += [Op(LLM, BW, c, mb) for c in reversed(chunks) for mb in reversed(range(m))]
        orders.append(order)
    return single_pipeline(orders, chunks=p * v, microbatches=m)
