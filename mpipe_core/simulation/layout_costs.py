"""What a colocated or disaggregated schedule's makespan is made of, against
the same LLM schedule with its encoders fused on the first stage.

Read off the simulated timeline, not modelled again:

* colocated: the makespan is exactly phase 1 (every device's encoder forward
  share, until the gather lets the LLM start) + phase 2 (the LLM) + phase 3
  (from chunk 0's last input gradient: each share's encoder backward, then the
  all-reduce).  Which device's share set each barrier says what waited on what.
* disaggregate: the LLM devices run the input's LLM order; the first stage's
  forwards wait for features from the encoder devices, the encoder backwards
  for input gradients.  The waits are the stretches an op sat ready on an idle
  device until its input arrived.

Per device: busy time by what ran (LLM, encoder forward, encoder backward,
collectives) and idle time, which add up to the makespan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mpipe_core.ir.ops import ALLREDUCE, BW, GATHER, LLM, SCATTER, B, F, R, W, base_module
from mpipe_core.workloads.units import human, percent, quantity

PARTS = ("llm", "encoder forward", "encoder backward", "collectives")


@dataclass
class DeviceTime:
    device: int
    role: str  # "LLM" or "encoder" (a device of the encoders' own)
    busy: dict[str, float]  # part -> time
    idle: float

    def as_dict(self) -> dict:
        return {"device": self.device, "role": self.role, "busy": dict(self.busy), "idle": self.idle}


@dataclass
class LayoutCosts:
    layout: str  # "colocated" or "disaggregate"
    baseline: str  # the term compared against: the input with its encoders fused
    baseline_makespan: float
    baseline_devices: int
    makespan: float
    devices: list[DeviceTime] = field(default_factory=list)
    waits: list[str] = field(default_factory=list)  # what waited on what, with figures
    unit: str = ""

    @property
    def saved(self) -> float:
        return self.baseline_makespan - self.makespan

    def _q(self, value: float) -> str:
        return quantity(value, self.unit)

    def verdict(self) -> str:
        of = f"{self._q(abs(self.saved))} of {self._q(self.baseline_makespan)}"
        pct = percent(abs(self.saved) / self.baseline_makespan) if self.baseline_makespan else "–"
        if self.saved > 1e-9:
            head = f"{self.layout} saves {pct} ({of}) against {self.baseline}"
        elif self.saved < -1e-9:
            head = f"{self.layout} loses ({pct} slower, {of}) against {self.baseline}"
        else:
            head = f"{self.layout} breaks even with {self.baseline}"
        n = len(self.devices)
        if n != self.baseline_devices:
            head += f" on {n} devices instead of {self.baseline_devices}"
        return f"{head}: " + "; ".join(self.waits)

    def device_lines(self) -> list[str]:
        """One line per device: what it added (busy time by part) and its idle time."""
        out = []
        for d in self.devices:
            parts = ", ".join(f"{name} {self._q(t)}" for name, t in d.busy.items() if t > 1e-12)
            out.append(f"device {d.device} ({d.role}): {parts or 'nothing'}; idle {self._q(d.idle)}")
        return out

    def as_dict(self) -> dict:
        return {"layout": self.layout, "baseline": self.baseline, "baseline_makespan": self.baseline_makespan,
                "makespan": self.makespan, "saved": self.saved, "waits": list(self.waits),
                "devices": [d.as_dict() for d in self.devices], "verdict": self.verdict()}


def _part(op) -> str:
    if base_module(op.module) == LLM:
        return "llm"
    if op.kind in (F, R):
        return "encoder forward"
    if op.kind in (B, W, BW):
        return "encoder backward"
    return "collectives"


def layout_costs(ev, baseline, layout: str) -> LayoutCosts:
    """`ev`: a colocated or disaggregated evaluation (maybe inside encoder_batch);
    `baseline`: its input term's evaluation (encoders fused)."""
    tl = ev.timeline
    rows = list(tl.rows())
    T = tl.makespan
    llm_devices = {d for op, d, _, _ in rows if base_module(op.module) == LLM}
    busy = [dict.fromkeys(PARTS, 0.0) for _ in range(tl.devices)]
    for op, d, s, e in rows:
        busy[d][_part(op)] += e - s
    devices = [DeviceTime(d, "LLM" if d in llm_devices else "encoder", busy[d], T - sum(busy[d].values()))
               for d in range(tl.devices)]
    costs = LayoutCosts(layout, baseline.term, baseline.timeline.makespan, baseline.timeline.devices, T,
                        devices, unit=ev.workload.time_unit)
    costs.waits = (_colocated_waits(costs, rows, T) if layout == "colocated" else
                   _disaggregated_waits(costs, rows, T, llm_devices))
    return costs


def _longest(devices: list[DeviceTime], part: str) -> DeviceTime:
    return max(devices, key=lambda d: (d.busy[part], -d.device))


def _colocated_waits(costs: LayoutCosts, rows, T: float) -> list[str]:
    q = costs._q
    llm = [(s, e) for op, _, s, e in rows if base_module(op.module) == LLM]
    first_llm = min(s for s, _ in llm)
    last_llm = max(e for _, e in llm)
    scatter = [s for op, _, s, _ in rows if op.kind == SCATTER]
    root = next((d for op, d, _, _ in rows if base_module(op.module) == LLM and op.kind == F and op.chunk == 0), 0)
    gathered = [e for op, d, _, e in rows if op.kind == GATHER and d == root]
    elsewhere = [e for op, d, _, e in rows if op.kind == GATHER and d != root]
    forward = _longest(costs.devices, "encoder forward")
    text = (f"phase 1 (encoder forwards, then the gather) took {q(first_llm)}: the longest share, device "
            f"{forward.device}'s, took {q(forward.busy['encoder forward'])}")
    if gathered:
        text += f"; the gather closed at {q(max(gathered))} on the first stage's device"
        if elsewhere and max(elsewhere) > max(gathered):
            text += f" and at {q(max(elsewhere))} on the others (the barrier's latency)"
        text += ", and no LLM op started before it"
    parts = [text]
    if scatter:
        backward = _longest(costs.devices, "encoder backward")
        reduce = max((e - s for op, _, s, e in rows if op.kind == ALLREDUCE), default=0.0)
        start = min(scatter)
        parts.append(f"phase 2 (the LLM) took {q(start - first_llm)}")
        parts.append(f"phase 3 waited for chunk 0's last input gradient at {q(start)}, then took {q(T - start)}: "
                     f"device {backward.device}'s share of encoder backward {q(backward.busy['encoder backward'])}"
                     f" and the all-reduce {q(reduce)}")
        parts.append(f"{human(first_llm)} + {human(start - first_llm)} + {human(T - start)} = {human(T)}")
    else:
        parts.append(f"phase 2 (the LLM) took {q(last_llm - first_llm)} (a frozen encoder has no phase 3)")
        parts.append(f"{human(first_llm)} + {human(last_llm - first_llm)} = {human(T)}")
    spread = [d.busy["encoder forward"] for d in costs.devices]
    parts.append(f"shares of encoder forward ranged {q(min(spread))} to {q(max(spread))} per device")
    return parts


def _disaggregated_waits(costs: LayoutCosts, rows, T: float, llm_devices: set) -> list[str]:
    q = costs._q
    by_device: dict[int, list] = {}
    for row in rows:
        by_device.setdefault(row[1], []).append(row)
    end_of = {op: e for op, _, _, e in rows}
    feature_wait = grad_wait = 0.0
    worst = (0.0, None)
    for d, ops in by_device.items():
        free = 0.0
        for op, _, s, e in ops:
            gap = s - free
            if gap > 1e-12 and base_module(op.module) == LLM and op.kind == F and op.chunk == 0:
                feature_wait += gap
                if gap > worst[0]:
                    worst = (gap, op)
            elif gap > 1e-12 and base_module(op.module) != LLM and op.kind in (B, BW):
                grad_wait += gap
            free = e
    encoders = [d for d in costs.devices if d.role == "encoder"]
    moved = sum(d.busy["encoder forward"] + d.busy["encoder backward"] for d in encoders)
    parts = [f"the encoders' {q(moved)} of work ran on {len(encoders)} device(s) of their own, each busy "
             f"{q(sum(T - d.idle for d in encoders) / len(encoders))} and idle "
             f"{q(sum(d.idle for d in encoders) / len(encoders))} on average"]
    if worst[1] is not None:
        parts.append(f"the first stage's forwards waited {q(feature_wait)} in all for features (the longest, "
                     f"{q(worst[0])}, before microbatch {worst[1].mb})")
    else:
        parts.append("the first stage's forwards never waited for features")
    if any(op.kind in (B, BW) and base_module(op.module) != LLM for op, _, _, _ in rows):
        parts.append(f"the encoder devices waited {q(grad_wait)} in all for input gradients")
    last = max(rows, key=lambda r: r[3])[0]
    llm_idle = [d.idle for d in costs.devices if d.role == "LLM"]
    parts.append(f"the LLM devices idled {q(sum(llm_idle) / len(llm_idle))} on average; the step ends with "
                 f"{'an encoder op' if base_module(last.module) != LLM else 'the LLM'} at {q(end_of[last])}")
    return parts
