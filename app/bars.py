"""A timeline as column arrays: one row per op, ready to draw.

`Bars` is what every chart takes, whether the ops were simulated by the core
(`from_timeline`), measured by a run (`from_timings`) or come from a run
comparison (`from_records`); measured and compared ops arrive as
`mpipe_core.ir.timeline_record.TimelineRecord`s.  It knows nothing of Plotly; it
only answers questions a chart asks: where the idle gaps are, how busy each
device was, which module classes exist.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from mpipe_core.ir.ops import LLM, base_module
from mpipe_core.ir.timeline_record import TimelineRecord

SIMULATED_UNIT = "units"  # workload time units
MEASURED_UNIT = "ms"


@dataclass(frozen=True)
class Bars:
    device: np.ndarray  # int64
    start: np.ndarray  # float64
    end: np.ndarray  # float64
    module: np.ndarray  # object: "llm", "vision", "llm@1", ...
    kind: np.ndarray  # object: F, B, W, BW, R, BCAST, AR
    chunk: np.ndarray  # int64
    mb: np.ndarray  # int64 (-1: no microbatch)
    step: np.ndarray  # int64
    devices: int
    unit: str = SIMULATED_UNIT
    # What a tooltip says instead of "step N" when the bars are no single step
    # (the mean of several steps); "" for bars of real steps.
    step_label: str = ""

    def __len__(self) -> int:
        return len(self.start)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    @property
    def makespan(self) -> float:
        return float(self.end.max()) if len(self) else 0.0

    def select(self, mask: np.ndarray) -> "Bars":
        return Bars(self.device[mask], self.start[mask], self.end[mask], self.module[mask],
                    self.kind[mask], self.chunk[mask], self.mb[mask], self.step[mask],
                    self.devices, self.unit, self.step_label)

    def shifted(self, offset: float, scale: float = 1.0, unit: str | None = None) -> "Bars":
        """Times mapped to `(t - offset) * scale`."""
        return Bars(self.device, (self.start - offset) * scale, (self.end - offset) * scale,
                    self.module, self.kind, self.chunk, self.mb, self.step, self.devices,
                    unit or self.unit, self.step_label)

    def step_starts(self) -> list[tuple[int, float]]:
        """(step, its first op's start) of each step, in step order."""
        steps = np.unique(self.step)
        return [(int(s), float(self.start[self.step == s].min())) for s in steps]

    def is_llm(self) -> np.ndarray:
        return np.fromiter((base_module(m) == LLM for m in self.module), bool, len(self))

    def busy(self) -> np.ndarray:
        """Busy time per device."""
        return np.bincount(self.device, weights=self.duration, minlength=self.devices)[: self.devices]

    def gaps(self, until: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Idle intervals `(device, start, end)`: before, between and after each
        device's ops, up to `until` (default: the makespan)."""
        horizon = self.makespan if until is None else until
        if self.devices == 0:
            empty = np.zeros(0)
            return empty.astype(np.int64), empty, empty
        order = np.lexsort((self.start, self.device))
        dev, start, end = self.device[order], self.start[order], self.end[order]
        # Running max of `end` within each device: offset devices so that one
        # device's values always exceed the previous device's.
        span = max(horizon, float(end.max()) if len(end) else 0.0) + 1.0
        shifted = np.maximum.accumulate(end + dev * span) - dev * span
        first = np.ones(len(dev), bool)
        first[1:] = dev[1:] != dev[:-1]
        prev_end = np.empty(len(dev))
        prev_end[first] = 0.0
        prev_end[~first] = shifted[:-1][~first[1:]]
        # Trailing gap of each device that has ops, and whole-span gaps of those without.
        last = np.ones(len(dev), bool)
        last[:-1] = dev[:-1] != dev[1:]
        unused = np.setdiff1d(np.arange(self.devices), dev)
        g_dev = np.concatenate([dev, dev[last], unused])
        g_start = np.concatenate([prev_end, shifted[last], np.zeros(len(unused))])
        g_end = np.concatenate([start, np.full(int(last.sum()), horizon), np.full(len(unused), horizon)])
        eps = 1e-9 * max(horizon, 1.0)
        keep = g_end - g_start > eps
        return g_dev[keep], g_start[keep], g_end[keep]

    def per_device_summary(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(op count, busy time) per device of the ops selected by `mask`."""
        dev = self.device[mask]
        count = np.bincount(dev, minlength=self.devices)[: self.devices]
        time = np.bincount(dev, weights=self.duration[mask], minlength=self.devices)[: self.devices]
        return count, time


def _columns(n: int, modules: Sequence[str], kinds: Sequence[str], chunks, mbs, steps,
             device, start, end, devices: int, unit: str) -> Bars:
    return Bars(
        device=np.asarray(device, dtype=np.int64).reshape(n),
        start=np.asarray(start, dtype=np.float64).reshape(n),
        end=np.asarray(end, dtype=np.float64).reshape(n),
        module=np.asarray(modules, dtype=object).reshape(n),
        kind=np.asarray(kinds, dtype=object).reshape(n),
        chunk=np.asarray(chunks, dtype=np.int64).reshape(n),
        mb=np.asarray(mbs, dtype=np.int64).reshape(n),
        step=np.asarray(steps, dtype=np.int64).reshape(n),
        devices=devices,
        unit=unit,
    )


def from_timeline(timeline) -> Bars:
    """The core's simulated `Timeline` (parallel lists of ops, devices, starts, ends)."""
    n = len(timeline.ops)
    if n:
        modules, kinds, chunks, mbs, steps = zip(*timeline.ops)
    else:
        modules = kinds = chunks = mbs = steps = ()
    return _columns(n, modules, kinds, chunks, mbs, steps, timeline.device, timeline.start,
                    timeline.end, timeline.devices, SIMULATED_UNIT)


def from_records(records: Iterable[TimelineRecord], devices: int | None = None, unit: str = MEASURED_UNIT,
                 *, scale: float = 1.0, origin: float = 0.0) -> Bars:
    """Timeline records with times mapped to `(t - origin) * scale`."""
    records = list(records)
    n = len(records)
    if n:
        dev, modules, kinds, chunks, mbs, steps, start, end, *_host_and_pipeline = zip(*records)
    else:
        dev = modules = kinds = chunks = mbs = steps = start = end = ()
    dev = np.asarray(dev, dtype=np.int64)
    count = max(devices or 0, int(dev.max()) + 1 if n else 0)
    start = (np.asarray(start, dtype=np.float64) - origin) * scale
    end = (np.asarray(end, dtype=np.float64) - origin) * scale
    return _columns(n, modules, kinds, chunks, mbs, steps, dev, start, end, count, unit)


def from_timings(records: Iterable[TimelineRecord], devices: int | None = None, *, scale: float = 1000.0,
                 origin: float | None = None) -> Bars:
    """A run's measured records (seconds, as stored) as bars in milliseconds
    from the run's first op (or from `origin`, in seconds); device = rank."""
    records = list(records)
    t0 = origin if origin is not None else min((r.start for r in records), default=0.0)
    return from_records(records, devices, MEASURED_UNIT, scale=scale, origin=t0)
