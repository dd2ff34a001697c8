"""Metrics of a simulated timeline: makespan, busy/idle, bubble ratio, memory
(static, peak, headroom under the device's capacity, whether it fits), the
lower bound and efficiency (docs/architecture.md, Simulator semantics)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from mpipe_core.ir.ops import COMPUTE_KINDS, F
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.chunks import chunk_costs
from mpipe_core.simulation.costs import grouped
from mpipe_core.simulation.memory import (
    activation_over_time,
    memory_over_time,
    peak_activation_memory,
    peak_memory,
    static_memory,
)
from mpipe_core.simulation.simulator import Timeline
from mpipe_core.workloads.units import quantity
from mpipe_core.workloads.workload import Workload

__all__ = ["MemoryFit", "Metrics", "activation_over_time", "compute_metrics", "fits", "lower_bound", "memory_fit",
           "memory_over_time", "peak_activation_memory", "peak_fits", "peak_memory", "static_memory"]


@dataclass
class Metrics:
    makespan: float
    busy: list[float]
    idle: list[float]
    bubble_ratio: float
    peak_memory: list[float]
    lower_bound: float
    efficiency: float
    devices: int
    ops: int
    # Per device: static memory (held all step) and the peak of activations;
    # `peak_memory` is their sum.  `capacity`: the device's memory (None:
    # unknown), `headroom` per device capacity - peak (None without a
    # capacity), `fits`: every device's peak within it (None without one).
    static_memory: list[float] = field(default_factory=list)
    peak_activation_memory: list[float] = field(default_factory=list)
    capacity: float | None = None
    headroom: list[float] | None = None
    fits: bool | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def compute_metrics(schedule: Schedule, workload: Workload, timeline: Timeline) -> Metrics:
    P = timeline.devices
    T = timeline.makespan
    # bincount adds each row's weight in row order: the same sums as a loop.
    col = timeline.columns or {"device": np.asarray(timeline.device, dtype=np.int64),
                               "start": np.asarray(timeline.start), "end": np.asarray(timeline.end)}
    busy = np.bincount(col["device"], weights=col["end"] - col["start"], minlength=P).tolist()
    idle = [T - b for b in busy]
    bubble = sum(idle) / (P * T) if T > 0 else 0.0
    lb = lower_bound(schedule, workload)
    static = static_memory(schedule, workload, timeline)
    activations = peak_activation_memory(schedule, workload, timeline)
    peaks = [s + a for s, a in zip(static, activations)]
    capacity = workload.capacity
    return Metrics(
        makespan=T,
        busy=busy,
        idle=idle,
        bubble_ratio=bubble,
        peak_memory=peaks,
        lower_bound=lb,
        efficiency=(lb / T) if T > 0 else 1.0,
        devices=P,
        ops=len(timeline),
        static_memory=static,
        peak_activation_memory=activations,
        capacity=capacity,
        headroom=None if capacity is None else [capacity - p for p in peaks],
        fits=fits(peaks, capacity),
    )


def within(peak: float, cap: float) -> bool:
    """Whether a peak memory is within a capacity or memory cap, with a relative
    slack of 1e-12 (float sums): the one comparison `fits` and tune's memory cap make."""
    return peak <= cap * (1 + 1e-12)


def fits(peaks: list[float], capacity: float | None) -> bool | None:
    """Whether every device's peak memory is within `capacity` (`within`; None: capacity unknown)."""
    if capacity is None:
        return None
    return all(within(p, capacity) for p in peaks)


def peak_fits(schedule: Schedule, workload: Workload, timeline: Timeline,
              cap: float | None = None) -> tuple[float, bool]:
    """(the worst device's peak memory, static + activations; whether it is
    `within` `cap`, default the workload's capacity; True without either).  A
    plan for a drawn batch is checked on that batch's costs
    (`batch_costs.microbatch_workload`): its long packs hold more.  Costs only
    the memory model's numpy passes over the simulated timeline."""
    worst = max(peak_memory(schedule, workload, timeline), default=0.0)
    cap = workload.capacity if cap is None else cap
    return worst, cap is None or within(worst, cap)


@dataclass(frozen=True)
class MemoryFit:
    """How a schedule's peak memory per device stands against the device's capacity."""

    capacity: float
    peaks: tuple[float, ...]  # per device, static + activations
    fits: bool
    worst: int  # the device with the highest peak (the lowest-numbered of equals)
    over: dict[int, float]  # device -> how far over the capacity its peak is (devices over only)

    @property
    def least_headroom(self) -> float:
        """Capacity minus the highest peak (negative: over)."""
        return self.capacity - self.peaks[self.worst]

    def text(self, unit: str = "") -> str:
        """The verdict in one line, as `mpipe eval` says it, with `unit` on every figure."""
        worst = self.peaks[self.worst]
        if self.fits:
            return (f"fits in {quantity(self.capacity, unit)} (least headroom "
                    f"{quantity(self.least_headroom, unit)}, device {self.worst})")
        return (f"does not fit in {quantity(self.capacity, unit)}: device {self.worst} needs "
                f"{quantity(worst, unit)}, {quantity(worst - self.capacity, unit)} over "
                f"({len(self.over)} of {len(self.peaks)} devices over)")


def memory_fit(peaks: list[float], capacity: float | None) -> MemoryFit | None:
    """`peaks` (per device) against `capacity`, with `fits`'s slack; None when the
    capacity is unknown."""
    if capacity is None or not peaks:
        return None
    ok = fits(peaks, capacity)
    over = {d: p - capacity for d, p in enumerate(peaks) if not within(p, capacity)}
    return MemoryFit(capacity, tuple(peaks), bool(ok), max(range(len(peaks)), key=peaks.__getitem__), over)


def lower_bound(schedule: Schedule, workload: Workload) -> float:
    """LB = max(total work / P, the largest load pinned to one device, the
    critical path of one microbatch, and with encoder devices of their own
    their work / their count), summed over steps (the optimizer update
    separates them).  Only essential work counts (F, B, W of every module);
    what a schedule adds (recompute, broadcast, all-reduce, transfers) does not.
    LLM chunks are pinned where the schedule put them; encoder work may move."""
    P = schedule.devices
    chunk_device = _chunk_devices(schedule)
    steps = max(p.steps for p in schedule.pipelines)
    total = [0.0] * steps
    pinned = [[0.0] * P for _ in range(steps)]
    critical = [0.0] * steps
    own_devices = [0.0] * steps  # encoder work / the devices that alone may run it (`disaggregate`)
    dispatch = workload.host.dispatch
    for pipe in schedule.pipelines:
        M, C = pipe.microbatches, pipe.chunks
        costs = chunk_costs(pipe, workload)
        # Chunk times per microbatch only when folded encoders make them vary.
        mbs = range(M) if costs.encoder is not None else range(1)
        f = [[costs.essential("F", c, m) for c in range(C)] for m in mbs]
        b = [[costs.essential("B", c, m) for c in range(C)] for m in mbs]
        w = [[costs.essential("W", c, m) for c in range(C)] for m in mbs]
        scale = 1 if costs.encoder is not None else M
        chunk_work = [scale * sum(f[i][c] + b[i][c] + w[i][c] for i in range(len(f))) for c in range(C)]
        work = sum(chunk_work)
        enc_f = [0.0] * M
        enc_back = [0.0] * M
        enc_work = 0.0
        # Folded encoders are inside the chunks' costs already.  A group of
        # microbatches (`encoder_batch`) is one op of the group's cost, which
        # precedes each of its microbatches' chains; its backward costs the
        # less of fused and split (each op pays the launch once).
        firsts = [g for g, _ in pipe.groups()]
        for enc in workload.encoders if pipe.encoder_layers is None else ():
            e_f = grouped(enc.costs("F", M), pipe, dispatch)
            if enc.trainable:
                fused = grouped(enc.costs("BW", M), pipe, dispatch)
                split = [b + w for b, w in zip(grouped(enc.costs("B", M), pipe, dispatch),
                                               grouped(enc.costs("W", M), pipe, dispatch))]
                e_bw = [min(x, y) for x, y in zip(fused, split)] if pipe.encoder_batch != 1 else fused
            else:
                e_bw = [0.0] * M
            f_work, bw_work = sum(e_f[g] for g in firsts), sum(e_bw[g] for g in firsts)
            work += f_work
            work += bw_work
            enc_work += f_work + bw_work
            for m in range(M):
                g = pipe.group_of(m)
                enc_f[m] = max(enc_f[m], e_f[g])
                enc_back[m] = max(enc_back[m], e_bw[g])
        # Per row of chunk times: forward chain, backward chain, and the
        # longest "B chain down to chunk c, then W(c)" (W follows its B).
        chains = []
        for i in range(len(f)):
            suffix, tail = 0.0, 0.0
            for c in range(C - 1, -1, -1):
                suffix += b[i][c]
                tail = max(tail, suffix + w[i][c])
            chains.append((sum(f[i]), suffix, tail))
        path = 0.0
        for m in range(M):
            forward, backward, tail = chains[m if costs.encoder is not None else 0]
            path = max(path, enc_f[m] + forward + max(tail, backward + enc_back[m]))
        for s in range(pipe.steps):  # every step of a copy does the same work
            total[s] += work
            critical[s] = max(critical[s], path)
            for c in range(C):
                pinned[s][chunk_device.get((pipe.module, c), 0)] += chunk_work[c]
            if pipe.encoder_devices:
                own_devices[s] = max(own_devices[s], enc_work / pipe.encoder_devices)
    return sum(max(total[s] / P, max(pinned[s]), critical[s], own_devices[s]) for s in range(steps))


def _chunk_devices(schedule: Schedule) -> dict[tuple[str, int], int]:
    """(LLM module, chunk) -> the device that runs its forward of microbatch 0, step 0."""
    columns = schedule.llm_columns
    if columns is not None:  # one pipeline's ops as columns: no pass over 100k+ tuples
        lengths = [len(order) for order in schedule.orders]
        device = np.repeat(np.arange(len(lengths)), lengths)
        first = (columns.kind == COMPUTE_KINDS.index(F)) & (columns.mb == 0)
        module = schedule.pipelines[0].module
        return {(module, c): d for c, d in zip(columns.chunk[first].tolist(), device[first].tolist())}
    llm_modules = {p.module for p in schedule.pipelines}
    chunk_device: dict = {}
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op[1] == F and op[3] == 0 and op[4] == 0 and op[0] in llm_modules:
                chunk_device[(op[0], op[2])] = d
    return chunk_device
