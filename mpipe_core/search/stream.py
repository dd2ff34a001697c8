"""A term over a stream of drawn batches (`mpipe eval TERM --batches N`).

Each batch is a step: with dp replicas each runs its own share of the
global batch (`data.balance` deals it), and the slowest replica sets the
step.  A plain term runs its static plan (made for the mean microbatch) on
every batch; `per_batch(t)` plans each replica's share with the planner
(`per_batch.py`) and is compared with static `t` on the same batches.

Figures: makespan per batch in the workload's time unit; `step_time_s`
from the cluster model where the workload has one (an analytic workload:
`simulation/step_figures.py`, the slowest replica's), else the makespan in
seconds where the unit is a unit of time; mean, p50, p95 (numpy's linear
percentiles) and max; tokens per second (per time unit when unitless); for
per_batch the gain per batch (static / planned) and overall (sum of static
over sum of planned), planning time per batch (the slowest replica's); with
dp > 1 the straggler gap, 1 - mean / max of the replicas' makespans, with
the data's balance and with the other one.  Peak memory per batch: the
worst device's (static + activations, `metrics.peak_fits`) of each
replica's plan on that replica's own costs, the worst replica's; a batch
over the workload's device memory is listed in `over_capacity`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mpipe_core.algebra.terms import Call, parse
from mpipe_core.errors import MpipeError
from mpipe_core.search.per_batch import BUDGET_MS, Plan, Planner
from mpipe_core.simulation.metrics import peak_fits, within
from mpipe_core.simulation.simulator import simulate
from mpipe_core.simulation.step_figures import step_figures
from mpipe_core.workloads.batch_costs import drawn_batches, microbatch_workload, replicas
from mpipe_core.workloads.workload import Workload, load_workload

SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
OTHER_BALANCE = {"none": "tiles+tokens", "tiles+tokens": "none"}


@dataclass
class BatchResult:
    index: int
    makespan: float
    tokens: int
    tiles: int
    replicas: list[float]
    static_makespan: float | None = None
    plan_ms: float | None = None
    how: list[str] = field(default_factory=list)
    fallback: bool = False
    other_replicas: list[float] | None = None  # dp > 1: the replicas' makespans under the other balance
    step_time_s: float | None = None  # the cluster model's step (analytic workloads), the slowest replica's
    plans: list = field(default_factory=list, repr=False)  # keep_plans: each replica's Plan (per_batch.py)
    peak_memory: float | None = None  # the worst device's peak memory, the worst replica's


def gap(makespans: list[float]) -> float:
    """Straggler gap: the share of the step the average replica waits."""
    top = max(makespans)
    return 0.0 if top <= 0 else 1.0 - float(np.mean(makespans)) / top


@dataclass
class StreamResult:
    term: str
    per_batch: bool
    batches: list[BatchResult]
    time_unit: str
    dp: int
    balance: str
    setup_ms: float = 0.0
    note: str | None = None
    budget_ms: float = BUDGET_MS
    memory_unit: str = ""
    capacity: float | None = None  # the device's memory (None: unknown)

    def over_capacity(self) -> list[BatchResult]:
        """The batches whose peak memory exceeds the device's (none without a capacity)."""
        if self.capacity is None:
            return []
        return [b for b in self.batches if not within(b.peak_memory, self.capacity)]

    def step_time_s(self, batch: BatchResult) -> float | None:
        """The cluster model's step time where the workload has one, else the
        makespan in seconds where its unit is a unit of time."""
        if batch.step_time_s is not None:
            return batch.step_time_s
        factor = SECONDS.get(self.time_unit)
        return None if factor is None else batch.makespan * factor

    def summary(self) -> dict[str, Any]:
        spans = np.array([b.makespan for b in self.batches])
        out: dict[str, Any] = {
            "mean": float(spans.mean()), "p50": float(np.percentile(spans, 50)),
            "p95": float(np.percentile(spans, 95)), "max": float(spans.max()),
        }
        tokens = sum(b.tokens for b in self.batches)
        seconds = [self.step_time_s(b) for b in self.batches]
        if all(x is not None for x in seconds):
            out["step_time_s_mean"] = float(np.mean(seconds))
            out["tokens_per_s"] = tokens / sum(seconds)
        else:
            out["tokens_per_time_unit"] = tokens / spans.sum()
        if self.per_batch:
            static = np.array([b.static_makespan for b in self.batches])
            plans = np.array([b.plan_ms for b in self.batches])
            out.update(static_mean=float(static.mean()), static_p95=float(np.percentile(static, 95)),
                       gain=float(static.sum() / spans.sum()), gain_min=float((static / spans).min()),
                       gain_max=float((static / spans).max()), plan_ms_mean=float(plans.mean()),
                       plan_ms_max=float(plans.max()), fallbacks=sum(b.fallback for b in self.batches))
        out["peak_memory_max"] = max(b.peak_memory for b in self.batches)
        if self.capacity is not None:
            out["over_capacity"] = [b.index for b in self.over_capacity()]
        if self.dp > 1:
            out["straggler_gap"] = {
                self.balance: float(np.mean([gap(b.replicas) for b in self.batches])),
                OTHER_BALANCE[self.balance]: float(np.mean([gap(b.other_replicas) for b in self.batches])),
            }
        return out

    def as_dict(self) -> dict[str, Any]:
        rows = []
        for b in self.batches:
            row: dict[str, Any] = {"batch": b.index, "makespan": b.makespan}
            seconds = self.step_time_s(b)
            if seconds is not None:
                row["step_time_s"] = seconds
            row.update(tokens=b.tokens, tiles=b.tiles, peak_memory=b.peak_memory)
            if self.per_batch:
                row.update(static_makespan=b.static_makespan, plan_ms=b.plan_ms, plan=b.how,
                           fallback=b.fallback)
            if self.dp > 1:
                row["replicas"] = b.replicas
            rows.append(row)
        return {"term": self.term, "per_batch": self.per_batch, "dp": self.dp, "balance": self.balance,
                "time_unit": self.time_unit, "memory_unit": self.memory_unit, "capacity": self.capacity,
                "budget_ms": self.budget_ms if self.per_batch else None,
                "setup_ms": self.setup_ms, "note": self.note, "batches": rows, "summary": self.summary()}


def evaluate_stream(term: str | Call, workload: Workload | dict | str, batches: int,
                    budget_ms: float = BUDGET_MS, max_ops: int | None = None,
                    keep_plans: bool = False) -> StreamResult:
    """`term` over the first `batches` batches of the workload's data; with
    `keep_plans`, each batch keeps each replica's plan (to draw the plan a batch got)."""
    wl = load_workload(workload)
    if batches < 1:
        raise MpipeError(f"--batches: expected a whole number of batches >= 1, got {batches}")
    if wl.data is None:
        raise MpipeError(f"--batches needs a workload with a data section (docs/data.md); '{wl.name}' has none")
    ast = parse(term) if isinstance(term, str) else term
    planner = Planner(ast, wl, max_ops=max_ops)
    wrapped = ast.name == "per_batch"
    M, dp = planner.microbatches, replicas(wl)
    balance = wl.data.balance
    drawn = drawn_batches(wl, M, batches)
    other = drawn_batches(wl, M, batches, OTHER_BALANCE[balance]) if dp > 1 else None
    out = []
    for i, batch in enumerate(drawn):
        spans, statics, plans, hows, fell, kept = [], [], [], [], False, []
        seconds, peaks = [], []
        for r in range(dp):
            costs = microbatch_workload(wl, batch.of(r))
            if wrapped:
                plan = planner.plan(costs, budget_ms, batch.of(r))
                spans.append(plan.makespan)
                statics.append(plan.static_makespan)
                plans.append(plan.plan_ms)
                hows.append(plan.how)
                fell = fell or plan.fallback
                if keep_plans:
                    kept.append(plan)
                schedule, costs = plan.schedule, plan.workload
                timeline = plan.timeline if plan.timeline is not None else \
                    simulate(schedule, costs, check=False, remember=False)
            else:
                schedule = planner.static
                timeline = simulate(schedule, costs, check=False, remember=False)
                spans.append(timeline.makespan)
                if keep_plans:
                    kept.append(Plan(schedule, costs, tuple(range(M)), spans[-1], spans[-1], 0.0, "static", False))
            checked = plan.peak_memory if wrapped else None
            peaks.append(checked if checked is not None else peak_fits(schedule, costs, timeline)[0])
            if wl.step is not None:  # the cluster model's step time of this replica's plan
                seconds.append(step_figures(schedule, costs, timeline).step_time_s)
        other_spans = None
        if other is not None:
            other_spans = []
            for r in range(dp):
                costs = microbatch_workload(wl, other[i].of(r))
                other_spans.append(planner.plan(costs, budget_ms, other[i].of(r)).makespan if wrapped else
                                   simulate(planner.static, costs, check=False, remember=False).makespan)
        out.append(BatchResult(i, max(spans), batch.tokens, batch.tiles, spans,
                               max(statics) if wrapped else None, max(plans) if wrapped else None, hows, fell,
                               other_spans, max(seconds) if seconds else None, kept, max(peaks)))
    return StreamResult(str(ast), wrapped, out, wl.time_unit, dp, balance, planner.setup_ms,
                        planner.note if wrapped else None, budget_ms, wl.memory_unit, wl.capacity)
