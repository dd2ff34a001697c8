"""Why a prediction missed: a measured step's makespan minus the predicted
one, split by cause along the measured critical path.

Walk back from the op that ended last: before each op, the thing it waited
for is the latest-ending of its device's previous op and its producers.  So
the measured makespan is exactly

    sum of op durations on the path + waits for inputs from other devices
    + dispatch gaps after the device's own previous op + the path's first start

and the prediction along the same path is the predicted durations plus the
predicted transfers.  The difference, term by term, is the gap by cause:

* `op:<module> <kind> on device d`: those ops ran longer (or shorter) than
  predicted; the prediction's own contention slowdown is reported beside it;
* `transfer waits`: inputs from other devices came later than the link model says;
* `dispatch`: time between a device's ops beyond the per-op overhead the
  calibration folded into each cost (Python, posting sends and receives);
* `step start`: the path's first op started late after the step barrier;
* `critical path elsewhere`: the predicted makespan minus the prediction along
  this path (<= 0): the simulator had another, longer path.

The parts add up to measured - predicted exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mpipe_core.ir.ops import base_module
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import EDGE_BOUNDARY, collect_facts, predecessors
from mpipe_core.simulation.simulator import Timeline
from mpipe_core.workloads.workload import Workload

TRANSFER, DISPATCH, START, ELSEWHERE = "transfer waits", "dispatch", "step start", "critical path elsewhere"


@dataclass
class Cause:
    cause: str
    measured: float  # on the measured critical path
    predicted: float  # the prediction of the same ops / edges
    ops: int = 0  # ops (or edges) of the path it covers
    contention: float = 0.0  # of `predicted`: the modelled slowdown from overlapping ops

    @property
    def gap(self) -> float:
        return self.measured - self.predicted


@dataclass
class GapExplanation:
    measured: float
    predicted: float
    causes: list[Cause] = field(default_factory=list)
    path: int = 0  # ops on the measured critical path

    @property
    def gap(self) -> float:
        return self.measured - self.predicted


def op_group(op, device: int) -> str:
    return f"op:{base_module(op[0])} {op[1]} on device {device}"


def explain_gap(schedule: Schedule, workload: Workload, measured: dict, predicted: Timeline,
                overhead: float = 0.0) -> GapExplanation:
    """`measured`: op -> (start, end) for one step of `schedule`; `predicted`: the
    simulator's timeline of it; `overhead`: the per-op dispatch time the
    prediction's costs include (counted as dispatch, not as op time)."""
    index = {op: d for d, order in enumerate(schedule.orders) for op in order}
    position = {op: i for order in schedule.orders for i, op in enumerate(order)}
    facts = collect_facts(schedule)
    costs = CostModel(schedule, workload, facts)
    pred = {op: (s, e) for op, _, s, e in predicted.rows()}
    origin = min(s for s, _ in measured.values())
    p_origin = min(predicted.start, default=0.0)
    causes: dict[str, Cause] = {}

    def add(name: str, m: float, p: float, contention: float = 0.0) -> None:
        c = causes.setdefault(name, Cause(name, 0.0, 0.0))
        c.measured += m
        c.predicted += p
        c.ops += 1 if m or p else 0
        c.contention += contention

    cur = max(measured, key=lambda op: measured[op][1])
    m_end = measured[cur][1] - origin
    path_pred = 0.0
    steps = 0
    while True:
        steps += 1
        d = index[cur]
        s, e = measured[cur]
        ps, pe = pred[cur]
        solo = costs.duration(cur)
        fixed = min(overhead, pe - ps)  # a barrier costs nothing: it includes no dispatch either
        add(op_group(cur, d), e - s, pe - ps - fixed, contention=(pe - ps) - solo)
        add(DISPATCH, 0.0, fixed)
        path_pred += pe - ps
        # What it waited for: the latest-ending of the device's previous op and its producers.
        options = []
        k = position[cur]
        if k > 0:
            prev = schedule.orders[d][k - 1]
            options.append((measured[prev][1], prev, None))
        for producer, edge in predecessors(cur, d, facts, index):
            options.append((measured[producer][1], producer, edge))
        if not options:
            add(START, s - origin, 0.0)
            break
        end, prev, edge = max(options, key=lambda o: o[0])
        wait = s - end  # (unclamped: clocks of two ranks agree only so far; the sum stays exact)
        if edge is not None and index[prev] != d:
            link = costs.boundary(index[prev], d, cur[3]) if edge == EDGE_BOUNDARY else costs.transfer(prev, cur, edge)
            add(TRANSFER, wait, link)
            path_pred += link
        else:
            add(DISPATCH, wait, 0.0)
        cur = prev
    p_makespan = predicted.makespan - p_origin
    causes[ELSEWHERE] = Cause(ELSEWHERE, 0.0, p_makespan - path_pred)
    order = sorted(causes.values(), key=lambda c: -abs(c.gap))
    return GapExplanation(m_end, p_makespan, order, steps)
