"""A device's efficiencies fitted from a layer profile:
`mpipe calibrate --device --layer-profile FILE`.

A layer profile (`mpipe_core/workloads/layer_profile.py`) gives one layer's
measured forward and backward times at a stated shape, under some parallel
settings and recompute modes (one layer timed on one node; the
published one is Korthikanti et al. 2022, Table 4, in
`examples/layer-profiles/`).  The fit finds the device's `gemm_efficiency`
(the GEMMs' fraction of peak, before tile and wave quantization) and
`memory_efficiency` (the memory-bound kernels' fraction of the HBM bandwidth)
and `attention_efficiency` (the unfused attention core's batched GEMMs, which
the selective-recompute rows time on their own) whose predicted times are
closest to the measured ones: least squares of the log ratio predicted /
measured over every cell (each row's forward and backward), by Levenberg-
Marquardt on the fractions' logarithms, kept inside [0.001, 1].

A profile whose best `memory_efficiency` lies at or above 1 cannot tell it
apart (the memory-bound kernels are a small share of a layer): the device's
value stays, the report says so, and the other two are fitted.  A GEMM or
attention fraction at either end of [0.001, 1] means the profile is not this
device: refused, not clipped.  Nothing else is fitted; the communication is
the cluster's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from mpipe_core.workloads.layer_profile import LayerProfile, predict, resolved_device

from ..errors import CalibrationError
from .device_fit import SEARCH

FITTED = ("gemm_efficiency", "memory_efficiency", "attention_efficiency")
ROUNDS = 100
TOLERANCE = 1e-7  # a step of the log fractions this small ends the search


@dataclass
class Cell:
    label: str
    which: str  # "forward" or "backward"
    measured_ms: float
    before_ms: float
    after_ms: float

    @property
    def error(self) -> float:
        return self.after_ms / self.measured_ms - 1


@dataclass
class LayerFit:
    source: str
    device: str
    before: dict[str, float]
    fitted: dict[str, float]
    not_fitted: dict[str, str]  # fraction -> why the device's value was kept
    cells: list[Cell]
    device_section: dict = field(repr=False)

    @property
    def rms(self) -> float:
        return math.sqrt(sum(c.error ** 2 for c in self.cells) / len(self.cells))

    @property
    def worst(self) -> float:
        return max(abs(c.error) for c in self.cells)

    def as_dict(self) -> dict:
        return {"source": self.source, "device": self.device, "before": self.before, "fitted": self.fitted,
                "not_fitted": self.not_fitted,
                "rms_error": self.rms, "max_error": self.worst,
                "cells": [dict(vars(c), error=c.error) for c in self.cells], "device_section": self.device_section}

    def format(self) -> str:
        lines = [f"device {self.device} fitted from a layer profile ({len(self.cells)} cells)"
                 + (f": {self.source}" if self.source else "")]
        for key, value in self.fitted.items():
            lines.append(f"  {key:<20} {self.before[key]:.4g} -> {value:.4g}")
        for key, why in self.not_fitted.items():
            lines.append(f"  {key:<20} {self.before[key]:.4g} kept: {why}")
        lines.append(f"{'layer':<42} {'':<8} {'measured':>8} {'before':>8} {'fitted':>8} {'error':>7}")
        for c in self.cells:
            lines.append(f"{c.label:<42} {c.which:<8} {c.measured_ms:>8.2f} {c.before_ms:>8.2f} {c.after_ms:>8.2f} "
                         f"{c.error:>+7.1%}")
        lines.append(f"rms error {self.rms:.1%}, max {self.worst:.1%}")
        return "\n".join(lines)


def _predictions(profile: LayerProfile, device: Mapping) -> list[float]:
    out = []
    for row in profile.rows:
        out.extend(predict(profile, row, device))
    return out


def _search(residuals, current: dict[str, float], keys: tuple[str, ...]) -> dict[str, float]:
    """Least squares of `residuals(fractions)` over `keys`, each kept in [SEARCH]: Levenberg-
    Marquardt on the fractions' logarithms (a Jacobian by finite differences), each step
    projected into the box.  The cells move nearly together with the GEMM and the memory
    fractions, a long flat valley that alternating one-dimensional searches crawl along."""
    lo, hi = math.log(SEARCH[0]), math.log(SEARCH[1])
    theta = np.array([math.log(current[k]) for k in keys])

    def res(t: np.ndarray) -> np.ndarray:
        return np.asarray(residuals({**current, **{k: math.exp(x) for k, x in zip(keys, t)}}))

    r = res(theta)
    damping = 1e-3
    for _ in range(ROUNDS):
        jac = np.empty((len(r), len(keys)))
        for j in range(len(keys)):
            h = 1e-6 if theta[j] - 1e-6 >= lo else -1e-6
            step = theta.copy()
            step[j] -= h
            jac[:, j] = (r - res(step)) / h
        grad, normal = jac.T @ r, jac.T @ jac
        while True:
            delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -grad)
            trial = np.clip(theta + delta, lo, hi)
            r_trial = res(trial)
            if r_trial @ r_trial <= r @ r:
                damping = max(damping / 10, 1e-9)
                break
            damping *= 10
            if damping > 1e9:
                trial, r_trial = theta, r
                break
        moved = float(np.max(np.abs(trial - theta)))
        theta, r = trial, r_trial
        if moved < TOLERANCE:
            break
    return {**current, **{k: math.exp(x) for k, x in zip(keys, theta)}}


def _at_bound(value: float) -> str | None:
    if value >= SEARCH[1] * (1 - 1e-3):
        return "above"
    if value <= SEARCH[0] * (1 + 1e-3):
        return "below"
    return None


def fit_layer_profile(profile: LayerProfile) -> LayerFit:
    """The profile's device with its efficiencies fitted to the profile's cells (those the
    profile identifies; `LayerFit.not_fitted` says why any other was kept)."""
    base = resolved_device(profile.device)
    name = profile.device if isinstance(profile.device, str) else str(profile.device.get("preset", "custom"))
    measured = [x for row in profile.rows for x in (row.forward_ms, row.backward_ms)]
    gemm = float(base.get("gemm_efficiency", base.get("efficiency", 0.5)))
    before = {"gemm_efficiency": gemm,
              "memory_efficiency": float(base.get("memory_efficiency", base.get("hbm_efficiency", 0.9))),
              "attention_efficiency": float(base.get("attention_efficiency", gemm))}

    def residuals(fractions: Mapping[str, float]) -> list[float]:
        pred = _predictions(profile, {**base, **fractions})
        return [math.log(p / m) for p, m in zip(pred, measured)]

    keys = FITTED
    current = _search(residuals, before, keys)
    not_fitted = {}
    # The memory-bound kernels are a small share of a layer: a profile may prefer them faster
    # than HBM allows.  Then it cannot tell their efficiency; the device's stays.
    if _at_bound(current["memory_efficiency"]) == "above":
        not_fitted["memory_efficiency"] = ("the profile's best lies at or above 1 (its memory-bound time is too "
                                           "small a share to tell apart from the GEMMs')")
        keys = tuple(k for k in FITTED if k != "memory_efficiency")
        current = _search(residuals, before, keys)
    for key in keys:
        side = _at_bound(current[key])
        if side is not None:
            raise CalibrationError(f"the fitted {key} would be {side} the range (0.001, 1]: the layer profile is "
                                   f"not this device ({name}) on this cluster")
    fitted = {k: round(current[k], 4) for k in keys}
    pred_before = _predictions(profile, {**base, **before})
    pred_after = _predictions(profile, {**base, **fitted})
    cells = []
    for i, row in enumerate(profile.rows):
        for j, which in enumerate(("forward", "backward")):
            k = 2 * i + j
            cells.append(Cell(row.label, which, measured[k], pred_before[k], pred_after[k]))
    section = (dict(profile.device) if isinstance(profile.device, dict) else {"preset": profile.device})
    section.update(fitted)
    return LayerFit(profile.source, name, before, fitted, not_fitted, cells, section)
