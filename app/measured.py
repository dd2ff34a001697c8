"""What the Runs page draws of a measured run: one step, or the mean of
steps, as bars; and the tables computed from those very bars, so the chart
and the tables always agree.

An op is identified within a step by (device, module, kind, chunk,
microbatch, occurrence): a `repeat` term runs the same key more than once
on a device in one step, and the k-th of them in start order is occurrence k.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from .bars import Bars
from .formatting import steps_text

MEAN = "mean"  # the step choice meaning "mean of the steps"
MEAN_STEP = -1  # the step number the mean's bars carry (their tooltips say which steps instead)


def _frame(bars: Bars) -> pd.DataFrame:
    df = pd.DataFrame({"device": bars.device, "module": bars.module, "kind": bars.kind,
                       "chunk": bars.chunk, "mb": bars.mb, "step": bars.step,
                       "start": bars.start, "end": bars.end})
    df = df.sort_values("start", kind="stable")
    df["occurrence"] = df.groupby(["step", "device", "module", "kind", "chunk", "mb"]).cumcount()
    return df


KEY = ["device", "module", "kind", "chunk", "mb", "occurrence"]


def _bars(df: pd.DataFrame, like: Bars) -> Bars:
    return Bars(df["device"].to_numpy(np.int64), df["start"].to_numpy(float), df["end"].to_numpy(float),
                df["module"].to_numpy(object), df["kind"].to_numpy(object), df["chunk"].to_numpy(np.int64),
                df["mb"].to_numpy(np.int64), df["step"].to_numpy(np.int64), like.devices, like.unit)


def step_view(bars: Bars, step: int | str, steps: Sequence[int]) -> Bars:
    """One step's ops timed from that step's first op, or (`step == MEAN`) each
    op's mean start and mean end over `steps`, both from their step's first op."""
    df = _frame(bars)
    df = df[df["step"].isin(list(steps) if step == MEAN else [step])].copy()
    origin = df.groupby("step")["start"].transform("min")
    df["start"] -= origin
    df["end"] -= origin
    if step == MEAN:
        df = df.groupby(KEY, as_index=False).agg(start=("start", "mean"), end=("end", "mean"))
        df["step"] = MEAN_STEP
    out = _bars(df.sort_values(["device", "start"], kind="stable"), bars)
    if step == MEAN:  # no step of its own: its tooltips name the steps it averages
        from dataclasses import replace

        out = replace(out, step_label="mean of steps " + steps_text(steps))
    return out


@dataclass(frozen=True)
class Comparison:
    makespan: float
    other_makespan: float
    devices: pd.DataFrame  # device, busy, idle, other busy, other idle
    ops: pd.DataFrame  # op, device, measured, other, difference, ends at (largest |difference| first)


def compare_bars(measured: Bars, other: Bars, top: int = 10) -> Comparison:
    """Per-device busy/idle and the ops differing most, from the bars drawn."""
    span, other_span = measured.makespan, other.makespan
    busy, other_busy = measured.busy(), other.busy()
    n = max(measured.devices, other.devices)
    pad = lambda a: np.pad(a, (0, n - len(a)))  # noqa: E731 - a one-line helper
    busy, other_busy = pad(busy), pad(other_busy)
    devices = pd.DataFrame({"device": range(n), "busy": busy, "idle": span - busy,
                            "other busy": other_busy, "other idle": other_span - other_busy})
    a, b = _frame(measured), _frame(other)
    joined = a.merge(b[KEY + ["start", "end"]], on=KEY, suffixes=("", "_o"))
    joined["measured"] = joined["end"] - joined["start"]
    joined["other"] = joined["end_o"] - joined["start_o"]
    joined["difference"] = joined["measured"] - joined["other"]
    joined = joined.reindex(joined["difference"].abs().sort_values(ascending=False, kind="stable").index)
    ops = pd.DataFrame({
        "op": [f"{m}:{c}{k}{mb if mb >= 0 else ''}" for m, c, k, mb in
               zip(joined["module"], joined["chunk"], joined["kind"], joined["mb"])],
        "device": joined["device"], "measured": joined["measured"], "other": joined["other"],
        "difference": joined["difference"], "ends at": joined["end"]}).head(top)
    return Comparison(span, other_span, devices, ops.reset_index(drop=True))
