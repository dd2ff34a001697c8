"""Metrics of a simulated timeline: makespan, busy/idle, bubble ratio, peak
activation memory, the lower bound and efficiency (docs/architecture.md, Simulator semantics)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .ops import B, BW, F, R, W, base_module
from .schedule import Schedule
from .simulator import Timeline
from .workload import Workload

BACKWARD_PARTS = (B, W, BW)


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

    def as_dict(self) -> dict:
        return asdict(self)


def compute_metrics(schedule: Schedule, workload: Workload, timeline: Timeline) -> Metrics:
    P = timeline.devices
    T = timeline.makespan
    busy = [0.0] * P
    for d, s, e in zip(timeline.device, timeline.start, timeline.end):
        busy[d] += e - s
    idle = [T - b for b in busy]
    bubble = sum(idle) / (P * T) if T > 0 else 0.0
    lb = lower_bound(schedule, workload)
    return Metrics(
        makespan=T,
        busy=busy,
        idle=idle,
        bubble_ratio=bubble,
        peak_memory=peak_memory(schedule, workload, timeline),
        lower_bound=lb,
        efficiency=(lb / T) if T > 0 else 1.0,
        devices=P,
        ops=len(timeline),
    )


def _activation_sizes(schedule: Schedule, workload: Workload):
    llm = {p.module: [k * workload.llm.activation for k in workload.llm.layers_per_chunk(p.chunks)]
           for p in schedule.pipelines}
    m = max(p.microbatches for p in schedule.pipelines)
    enc = {e.name: e.activations(m) for e in workload.encoders}
    return llm, enc


def memory_events(schedule: Schedule, workload: Workload, timeline: Timeline):
    """(device, time, +/- bytes) events: an op's activations live on the device
    that ran its forward (or recompute), from that op's start until the last
    backward part on that device ends (or the forward ends, if none runs there)."""
    llm_act, enc_act = _activation_sizes(schedule, workload)
    alloc: dict = {}
    free: dict = {}
    shards: dict = {}
    for op, d, s, e in timeline.rows():
        module, kind, chunk, mb, step = op
        key = (d, module, chunk, mb, step)
        if kind == F or kind == R:
            if key not in alloc or s < alloc[key][0]:
                alloc[key] = (s, e)
            if module not in llm_act:
                shards[(module, mb, step)] = max(shards.get((module, mb, step), 0), chunk + 1)
        elif kind in BACKWARD_PARTS:
            if e > free.get(key, -1.0):
                free[key] = e
    events = []
    for key, (s, f_end) in alloc.items():
        d, module, chunk, mb, step = key
        if module in llm_act:
            size = llm_act[module][chunk]
        else:
            size = enc_act[base_module(module)][mb] / shards.get((module, mb, step), 1)
        if size <= 0:
            continue
        events.append((d, s, size))
        events.append((d, free.get(key, f_end), -size))
    return events


def peak_memory(schedule: Schedule, workload: Workload, timeline: Timeline) -> list[float]:
    peaks = [0.0] * timeline.devices
    current = [0.0] * timeline.devices
    # Frees before allocations at the same instant (memory reused back to back).
    for d, _, delta in sorted(memory_events(schedule, workload, timeline), key=lambda e: (e[1], e[2])):
        current[d] += delta
        if current[d] > peaks[d]:
            peaks[d] = current[d]
    return peaks


def memory_over_time(schedule: Schedule, workload: Workload, timeline: Timeline) -> list[list[tuple[float, float]]]:
    """Per device, the step function (time, activation memory) for plotting."""
    series: list[list[tuple[float, float]]] = [[(0.0, 0.0)] for _ in range(timeline.devices)]
    current = [0.0] * timeline.devices
    for d, t, delta in sorted(memory_events(schedule, workload, timeline), key=lambda e: (e[1], e[2])):
        current[d] += delta
        series[d].append((t, current[d]))
    return series


def lower_bound(schedule: Schedule, workload: Workload) -> float:
    """LB = max(total work / P, the largest load pinned to one device, the
    critical path of one microbatch), summed over steps (the optimizer update
    separates them).  Only essential work counts (F, B, W of every module);
    what a schedule adds (recompute, broadcast, all-reduce, transfers) does not.
    LLM chunks are pinned where the schedule put them; encoder work may move."""
    P = schedule.devices
    llm_modules = {p.module for p in schedule.pipelines}
    chunk_device: dict = {}
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op[1] == F and op[3] == 0 and op[4] == 0 and op[0] in llm_modules:
                chunk_device[(op[0], op[2])] = d
    steps = max(p.steps for p in schedule.pipelines)
    total = [0.0] * steps
    pinned = [[0.0] * P for _ in range(steps)]
    critical = [0.0] * steps
    for pipe in schedule.pipelines:
        table = workload.llm.chunk_cost_table(pipe.chunks)
        per_mb = [table["F"][c] + table["BW"][c] for c in range(pipe.chunks)]
        work = sum(per_mb) * pipe.microbatches
        enc_f = [0.0] * pipe.microbatches
        enc_back = [0.0] * pipe.microbatches
        for enc in workload.encoders:
            f = enc.costs("F", pipe.microbatches)
            work += sum(f)
            bw = enc.costs("BW", pipe.microbatches) if enc.trainable else [0.0] * pipe.microbatches
            work += sum(bw)
            for m in range(pipe.microbatches):
                enc_f[m] = max(enc_f[m], f[m])
                enc_back[m] = max(enc_back[m], bw[m])
        chain = sum(table["F"]) + sum(table["B"])
        path = max(enc_f[m] + chain + max(table["W"][0], enc_back[m]) for m in range(pipe.microbatches))
        for s in range(pipe.steps):  # every step of a copy does the same work
            total[s] += work
            critical[s] = max(critical[s], path)
            for c in range(pipe.chunks):
                pinned[s][chunk_device.get((pipe.module, c), 0)] += per_mb[c] * pipe.microbatches
    return sum(max(total[s] / P, max(pinned[s]), critical[s]) for s in range(steps))
