"""Helpers shared by combinators."""
from __future__ import annotations

from mpipe_core.errors import MpipeError
from mpipe_core.ir.ops import BW, B, F, Op
from mpipe_core.ir.schedule import Pipeline, Schedule
from mpipe_core.simulation.chunks import folds_encoders
from mpipe_core.simulation.costs import grouped
from mpipe_core.workloads.workload import Workload


class CombineError(MpipeError):
    """A combinator applied to schedules it cannot combine; the evaluator adds
    the term position."""


def first_stage_first(body: Schedule) -> list[int]:
    """Devices with the one that runs LLM chunk 0 first, the others in device order."""
    module = body.pipelines[0].module
    d0 = next(d for d, order in enumerate(body.orders)
              for op in order if op.module == module and op.chunk == 0 and op.kind == F)
    return [d0] + [d for d in range(body.devices) if d != d0]


def refuse_own_encoder_devices(schedule: Schedule, name: str) -> None:
    """Encoders that `disaggregate` gave devices of their own stay there."""
    if any(p.encoder_devices for p in schedule.pipelines):
        raise CombineError(f"disaggregate(...) already put the encoders on devices of their own "
                           f"(apply {name} to its inner term instead)")


def encoder_layout_body(schedule: Schedule, workload: Workload, name: str) -> Schedule:
    """The one-pipeline LLM body a combinator that places the encoders itself
    (`encoder_stage`, `colocated`, `disaggregate`) starts from, or the
    CombineError saying why `schedule` cannot be one."""
    if not workload.encoders:
        raise CombineError(f"{name} needs a workload with encoders (this one has none)")
    if folds_encoders(schedule.pipelines):
        raise CombineError("balanced(...) already folded the encoders into the LLM chunks")
    refuse_own_encoder_devices(schedule, name)
    body = schedule.llm_only()
    if len(body.pipelines) != 1:
        raise CombineError(f"{name} works on a single pipeline (not par/overlay)")
    return body


def group_encoder_work(pipe: Pipeline, workload: Workload, backward: bool) -> dict[int, float]:
    """Group's first microbatch (each microbatch, without `encoder_batch`) ->
    the encoders' time for that group as their ops cost: the forward, plus the
    backward of the trainable ones when `backward`."""
    M, dispatch = pipe.microbatches, workload.host.dispatch
    work = [0.0] * M
    for e in workload.encoders:
        for kind in ("F", "BW") if backward and e.trainable else ("F",):
            work = [a + b for a, b in zip(work, grouped(e.costs(kind, M), pipe, dispatch))]
    return {g: work[g] for g, _ in pipe.groups()}


class GroupCountdown:
    """Counts down the input-gradient ops of each (group, step) of `pipe`:
    `closes(op)` is the (group, step) that `op` completes (the last of its
    group's microbatches to get its input gradient), else None."""

    def __init__(self, pipe: Pipeline):
        self._pipe = pipe
        self._sizes = dict(pipe.groups())
        self._left: dict[tuple[int, int], int] = {}

    def closes(self, op: Op) -> tuple[int, int] | None:
        if op.kind not in (B, BW):
            return None
        key = (self._pipe.group_of(op.mb), op.step)
        left = self._left.get(key, self._sizes[key[0]]) - 1
        self._left[key] = left
        return key if left == 0 else None
