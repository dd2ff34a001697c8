"""Shape combinators: repeat, seq, par, mirror, overlay."""
from __future__ import annotations

from dataclasses import replace

from mpipe_core.algebra.combinators.common import CombineError
from mpipe_core.ir.ops import replica_of, with_replica
from mpipe_core.ir.schedule import Schedule
from mpipe_core.workloads.workload import Workload


def _steps(schedule: Schedule) -> int:
    return max(p.steps for p in schedule.pipelines)


def repeat(schedule: Schedule, workload: Workload, n: int) -> Schedule:
    """n training steps of the same schedule; the optimizer update between steps
    is a global barrier (the simulator starts step s+1 when step s has ended)."""
    s = _steps(schedule)
    orders = [[op._replace(step=op.step + k * s) for k in range(n) for op in order] for order in schedule.orders]
    pipelines = tuple(replace(p, steps=p.steps * n) for p in schedule.pipelines)
    return schedule.with_orders(orders, pipelines=pipelines)


def seq(first: Schedule, second: Schedule, workload: Workload) -> Schedule:
    """The steps of `first`, then those of `second` (same devices, same pipeline)."""
    if first.devices != second.devices:
        raise CombineError(f"seq needs both schedules on the same devices ({first.devices} vs {second.devices})")
    shape = lambda s: [(p.replica, p.chunks, p.microbatches) for p in s.pipelines]  # noqa: E731
    if shape(first) != shape(second) or first.encoders != second.encoders:
        raise CombineError(
            "seq needs both schedules to train the same pipeline (chunks, microbatches, encoders): "
            f"{shape(first)} vs {shape(second)}"
        )
    if [p.recompute for p in first.pipelines] != [p.recompute for p in second.pipelines]:
        raise CombineError("seq needs both schedules to recompute the same layers "
                           "(put recompute(...) around seq, or the same one inside both)")
    s = _steps(first)
    orders = [list(a) + [op._replace(step=op.step + s) for op in b] for a, b in zip(first.orders, second.orders)]
    pipelines = tuple(replace(p, steps=p.steps + _steps(second)) for p in first.pipelines)
    return first.with_orders(orders, pipelines=pipelines)


def _shift_replicas(schedule: Schedule, offset: int) -> Schedule:
    if offset == 0:
        return schedule
    rename = lambda op: op._replace(module=with_replica(op.module, replica_of(op.module) + offset))  # noqa: E731
    orders = [[rename(op) for op in order] for order in schedule.orders]
    pipelines = tuple(replace(p, replica=p.replica + offset) for p in schedule.pipelines)
    return schedule.with_orders(orders, pipelines=pipelines)


def _replicas(schedule: Schedule) -> int:
    return max(p.replica for p in schedule.pipelines) + 1


def par(left: Schedule, right: Schedule, workload: Workload) -> Schedule:
    """Two independent pipelines on disjoint device groups: left's devices first.
    The right one trains its own copy of the model (modules `llm@1`, ...)."""
    right = _shift_replicas(right, _replicas(left))
    return Schedule(
        orders=left.orders + right.orders,
        pipelines=left.pipelines + right.pipelines,
        encoders=tuple(dict.fromkeys(left.encoders + right.encoders)),
    )


def mirror(schedule: Schedule, workload: Workload) -> Schedule:
    """Device d becomes device P-1-d: the pipeline runs the other way."""
    return schedule.with_orders(reversed(schedule.orders))


def overlay(first: Schedule, second: Schedule, workload: Workload) -> Schedule:
    """Both pipelines on the same devices, each device's two orders merged by the
    times each op starts when its own schedule runs alone (ties: first wins).

    Merging by standalone start times (step by step) cannot deadlock: a cycle
    would need an op to start strictly before itself.  `overlay(a, mirror(a))` is a Chimera-like
    bidirectional schedule.
    """
    from mpipe_core.simulation.simulator import simulate

    if first.devices != second.devices:
        raise CombineError(
            f"overlay needs schedules on the same number of devices ({first.devices} vs {second.devices})"
        )
    second = _shift_replicas(second, _replicas(first))
    t1 = simulate(first, workload)
    t2 = simulate(second, workload)
    key1 = {op: (op.step, s, 0, i) for i, (op, s) in enumerate(zip(t1.ops, t1.start))}
    key2 = {op: (op.step, s, 1, i) for i, (op, s) in enumerate(zip(t2.ops, t2.start))}
    orders = []
    for a, b in zip(first.orders, second.orders):
        merged = [(key1[op], op) for op in a] + [(key2[op], op) for op in b]
        merged.sort(key=lambda item: item[0])
        orders.append([op for _, op in merged])
    return Schedule(
        orders=tuple(tuple(o) for o in orders),
        pipelines=first.pipelines + second.pipelines,
        encoders=tuple(dict.fromkeys(first.encoders + second.encoders)),
    )


