"""The public Python API of the core: text in, schedule + timeline + metrics out."""
from __future__ import annotations

import gc
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from mpipe_core.algebra.evaluate import evaluate_term
from mpipe_core.algebra.terms import Call, parse
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.metrics import Metrics, activation_over_time, compute_metrics, memory_over_time
from mpipe_core.simulation.simulator import Timeline, simulate
from mpipe_core.errors import MpipeError
from mpipe_core.simulation.step_figures import StepFigures, step_figures
from mpipe_core.workloads.workload import Workload, load_workload


@dataclass
class Evaluation:
    term: str  # canonical text
    ast: Call
    workload: Workload
    schedule: Schedule
    timeline: Timeline

    @cached_property
    def metrics(self) -> Metrics:
        return compute_metrics(self.schedule, self.workload, self.timeline)

    @cached_property
    def step(self) -> StepFigures | None:
        """One optimizer step in seconds, MFU and its breakdown (analytic workloads; None otherwise)."""
        return step_figures(self.schedule, self.workload, self.timeline)

    @cached_property
    def comm(self) -> list:
        """The communication on the timeline and the step's tail after it
        (`simulation.comm_timeline.CommSlice`s; empty without a cluster)."""
        from mpipe_core.simulation.comm_timeline import comm_slices

        return comm_slices(self.schedule, self.workload, self.timeline, self.step)

    @cached_property
    def memory_over_time(self) -> list[list[tuple[float, float]]]:
        """Per device, the step function (time, static + activation memory) of this
        timeline: it starts at the device's static memory (`metrics.static_memory`)."""
        return memory_over_time(self.schedule, self.workload, self.timeline, self.metrics.static_memory)

    @cached_property
    def activation_over_time(self) -> list[list[tuple[float, float]]]:
        """Per device, the step function (time, activation memory) alone."""
        return activation_over_time(self.schedule, self.workload, self.timeline)

    @property
    def units(self) -> tuple[str, str]:
        """(time unit, memory unit) the workload declares ("" = unitless)."""
        return self.workload.time_unit, self.workload.memory_unit

    def summary(self) -> dict[str, Any]:
        m = self.metrics
        return {
            "term": self.term, "devices": m.devices, "ops": m.ops,
            "makespan": m.makespan, "bubble_ratio": m.bubble_ratio, "lower_bound": m.lower_bound,
            "efficiency": m.efficiency, "busy": m.busy, "idle": m.idle, "peak_memory": m.peak_memory,
            "static_memory": m.static_memory, "headroom": m.headroom, "capacity": m.capacity, "fits": m.fits,
            **(self.step.as_dict() if self.step is not None else {}),
            **({"device_source": self.device_source} if self.step is not None else {}),
        }

    @property
    def device_source(self) -> dict[str, Any] | None:
        """What the step time rests on: the device's efficiencies and their source
        (`workloads.device_source`; None without a step model)."""
        from mpipe_core.workloads.device_source import device_source

        source = device_source(self.workload.source) if self.step is not None else None
        return None if source is None else source.as_dict()

    def timeline_rows(self) -> list[dict[str, Any]]:
        return [record.as_dict() for record in self.timeline.records()]


def evaluate(term: str | Call, workload: Workload | dict | str | None = None,
             max_ops: int | None = None) -> Evaluation:
    """Parse, evaluate and simulate a term on a workload (preset, file, dict or None)."""
    ast = parse(term) if isinstance(term, str) else term
    wl = costed(ast, load_workload(workload))
    # Millions of small tuples and no reference cycles: the cyclic collector
    # would only rescan them (about a third of the time on big schedules).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        schedule = evaluate_term(ast, wl, limit=max_ops)
        timeline = simulate(schedule, wl)
    finally:
        if was_enabled:
            # Everything allocated meanwhile sits in the youngest generation,
            # and the first collection after `enable` would scan it all (a
            # tenth of `mpipe eval`'s time).  freeze + unfreeze moves it to
            # the oldest generation unscanned: still collectable, by the
            # (rare) full collections only.
            gc.freeze()
            gc.unfreeze()
            gc.enable()
    return Evaluation(str(ast), ast, wl, schedule, timeline)


def term_microbatches(ast: Call) -> set[int]:
    """The microbatch counts of a term's generators."""
    from mpipe_core.algebra.terms.signatures import signature_of

    found = set()
    stack = [ast]
    while stack:
        call = stack.pop()
        sig = signature_of(call.name)
        if sig is not None and sig.kind == "generator":
            found.add(call.kw("m"))
        stack.extend(v for _, v in call.kwargs if isinstance(v, Call))
    return found


def costed(ast: Call, wl: Workload) -> Workload:
    """The costs a term is planned on: a workload with a `data` section and no
    drawn batch's costs yet gets its mean microbatch (`batch_costs.mean_workload`)
    at the term's microbatch count."""
    if wl.data is None or wl.llm.token_scale is not None:
        return wl
    from mpipe_core.workloads.batch_costs import mean_workload

    counts = term_microbatches(ast)
    if len(counts) != 1:
        raise MpipeError(f"a workload with data needs one microbatch count in the term, got "
                         f"{', '.join(map(str, sorted(counts))) or 'none'}")
    return mean_workload(wl, counts.pop())


def workload_digest(workload: Workload) -> str:
    """A workload's identity for caching: a hash of every field (the frozen
    dataclasses' repr; floats print exactly)."""
    return hashlib.sha256(repr(workload).encode()).hexdigest()


_EVALUATIONS: OrderedDict[tuple[str, str], Evaluation] = OrderedDict()
_EVALUATIONS_KEPT = 8


def evaluate_once(term: str | Call, workload: Workload | dict | str | None = None) -> Evaluation:
    """`evaluate`, remembered by (canonical term, workload digest): one run's
    set-up, calibration and comparisons in a process share one evaluation.
    Callers must not modify what it returns."""
    ast = parse(term) if isinstance(term, str) else term
    wl = costed(ast, load_workload(workload))  # (a data section counts through its mean costs)
    key = (str(ast), workload_digest(wl))
    hit = _EVALUATIONS.get(key)
    if hit is not None:
        _EVALUATIONS.move_to_end(key)
        return hit
    evaluation = evaluate(ast, wl)
    _EVALUATIONS[key] = evaluation
    while len(_EVALUATIONS) > _EVALUATIONS_KEPT:
        _EVALUATIONS.popitem(last=False)
    return evaluation
