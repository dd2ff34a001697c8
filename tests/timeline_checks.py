"""An independent check that a simulated timeline is a valid execution of its
schedule, for tests: what the simulator promises, verified from the outside.

- every op of the schedule appears exactly once, on the device whose order holds it;
- each device runs its ops in its order, one at a time (no two overlap);
- no op takes less than its cost (contention only slows ops down);
- each op starts no earlier than each of its dataflow producers' end plus the
  transfer between their devices;
- step s+1 starts after every op of step s has ended (the optimizer barrier).
"""
from __future__ import annotations

from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import collect_facts, predecessors

EPS = 1e-9


def timeline_problems(evaluation) -> list[str]:
    """What is wrong with `evaluation`'s timeline (an empty list: nothing)."""
    schedule, workload, timeline = evaluation.schedule, evaluation.workload, evaluation.timeline
    problems: list[str] = []
    placed = {op: d for d, order in enumerate(schedule.orders) for op in order}
    rows: dict = {}
    for op, d, s, e in timeline.rows():
        if op in rows:
            problems.append(f"{op} runs twice")
        rows[op] = (d, s, e)
    missing = set(placed) - set(rows)
    problems += [f"{op} never runs" for op in sorted(missing)[:5]]
    problems += [f"{op} runs on device {rows[op][0]}, its order is device {placed[op]}'s"
                 for op in rows if op in placed and rows[op][0] != placed[op]]
    facts = collect_facts(schedule)
    costs = CostModel(schedule, workload, facts)
    scale = max(1.0, timeline.makespan)
    for d, order in enumerate(schedule.orders):
        previous = None
        for op in order:
            if op not in rows:
                continue
            _, s, e = rows[op]
            if e - s < costs.duration(op) - EPS * scale:
                problems.append(f"{op} takes {e - s}, less than its cost {costs.duration(op)}")
            if previous is not None and s < rows[previous][2] - EPS * scale:
                problems.append(f"{op} starts at {s} on device {d} before {previous} ends at {rows[previous][2]}")
            previous = op
            for producer, edge in predecessors(op, d, facts, placed):
                if producer not in rows:
                    problems.append(f"{op} waits for {producer}, which never runs")
                    continue
                pd, _, pe = rows[producer]
                ready = pe + (costs.transfer(producer, op, edge) if pd != d else 0.0)
                if s < ready - EPS * scale:
                    problems.append(f"{op} starts at {s}, before its input from {producer} is ready at {ready}")
    ends: dict[int, float] = {}
    for op, (_, _, e) in rows.items():
        ends[op.step] = max(ends.get(op.step, 0.0), e)
    for op, (_, s, _) in rows.items():
        if op.step > 0 and s < ends.get(op.step - 1, 0.0) - EPS * scale:
            problems.append(f"{op} of step {op.step} starts at {s}, before step {op.step - 1} ends")
    return problems
