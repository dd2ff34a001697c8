"""Backward-splitting combinators: split_bw and defer_w."""
from __future__ import annotations

import heapq
from collections import deque

from mpipe_core.algebra.combinators.common import CombineError
from mpipe_core.ir.ops import BW, B, Op, W
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import check_complete, collect_facts, predecessors
from mpipe_core.workloads.workload import Workload


def split_bw(schedule: Schedule, workload: Workload) -> Schedule:
    """Every fused BW becomes B then W, in place (same device, adjacent)."""
    orders = []
    for order in schedule.orders:
        new: list[Op] = []
        for op in order:
            if op.kind == BW:
                new.append(op._replace(kind=B))
                new.append(op._replace(kind=W))
            else:
                new.append(op)
        orders.append(new)
    return schedule.with_orders(orders)


def defer_w(schedule: Schedule, workload: Workload) -> Schedule:
    """Re-order each device so W ops fill idle time instead of delaying the
    critical B chain.

    A global event simulation: the device that is free earliest decides next.
    It runs its next non-W op if that op's inputs have arrived; otherwise, if
    one of its W ops is pending (its B done), it runs the oldest pending W;
    otherwise it waits.  Remaining W ops run at the end.  The order it writes
    is the order this simulation realised, so it is valid by construction.
    """
    if not any(op.kind == W for op in schedule.ops()):
        raise CombineError("defer_w needs split B/W ops (write defer_w(split_bw(...)))")
    index = schedule.placement()
    check_complete(schedule, workload, index)
    facts = collect_facts(schedule)
    costs = CostModel(schedule, workload, facts)
    P = schedule.devices
    main = [[op for op in order if op.kind != W] for order in schedule.orders]
    w_of = {}
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op.kind == W:
                w_of[op._replace(kind=B)] = op
    pointer = [0] * P
    pending: list[deque] = [deque() for _ in range(P)]
    end_of: dict = {}
    out: list[list[Op]] = [[] for _ in range(P)]
    heap = [(0.0, d) for d in range(P)]
    waiting: dict = {}
    free_at = [0.0] * P

    def run(d: int, op: Op, at: float) -> None:
        t = at + costs.duration(op)
        end_of[op] = t
        free_at[d] = t
        out[d].append(op)
        w = w_of.get(op)
        if w is not None:
            pending[d].append(w)
        for other in waiting.pop(op, ()):
            heapq.heappush(heap, (free_at[other], other))
        heapq.heappush(heap, (t, d))

    while heap:
        t, d = heapq.heappop(heap)
        if t != free_at[d]:
            continue  # stale entry
        nxt = main[d][pointer[d]] if pointer[d] < len(main[d]) else None
        ready_at = None
        missing = None
        if nxt is not None:
            ready_at = t
            for producer, edge in predecessors(nxt, d, facts, index):
                e = end_of.get(producer)
                if e is None:
                    missing = producer
                    break
                if index[producer] != d:
                    e += costs.transfer(producer, nxt, edge)
                ready_at = max(ready_at, e)
        if pending[d] and (nxt is None or pending[d][0].step < nxt.step):
            run(d, pending[d].popleft(), t)  # W ops never cross the optimizer step
        elif nxt is not None and missing is None and ready_at <= t:
            pointer[d] += 1
            run(d, nxt, t)
        elif pending[d]:
            run(d, pending[d].popleft(), t)
        elif nxt is not None and missing is None:
            pointer[d] += 1
            run(d, nxt, ready_at)
        elif nxt is not None:
            waiting.setdefault(missing, []).append(d)
    if any(pointer[d] < len(main[d]) for d in range(P)):
        from mpipe_core.simulation.simulator import simulate

        simulate(schedule, workload)  # raises the deadlock with its cycle
        raise CombineError("defer_w could not complete the schedule")  # pragma: no cover
    return schedule.with_orders(out)
