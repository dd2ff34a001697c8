"""A device's efficiencies fitted from a layer profile:
`mpipe calibrate --device --layer-profile FILE`.

A layer profile (`mpipe_core/workloads/layer_profile.py`) gives one layer's
measured forward and backward times at a stated shape, under some parallel
settings and recompute modes (what `mpipe profile` measures on one node; the
published one is Korthikanti et al. 2022, Table 4, in
`examples/layer-profiles/`).  The fit finds the device's `gemm_efficiency`
(the GEMMs' fraction of peak, before tile and wave quantization) and
`hbm_efficiency` (the memory-bound kernels' fraction of the HBM bandwidth)
whose predicted times are closest to the measured ones: least squares of the
log ratio predicted / measured over every cell (each row's forward and
backward), by alternating golden-section searches on each fraction's
logarithm until neither moves.  A best value at either end of [0.001, 1]
means the profile is not this device: refused, not clipped.  Nothing else is
fitted; the communication is the cluster's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from mpipe_core.workloads.layer_profile import LayerProfile, predict, resolved_device

from ..errors import CalibrationError
from .device_fit import SEARCH, _golden_log

FITTED = ("gemm_efficiency", "memory_efficiency", "attention_efficiency")
ROUNDS = 30
TOLERANCE = 1e-5  # relative change of both fractions that ends the search


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
                "rms_error": self.rms, "max_error": self.worst,
                "cells": [dict(vars(c), error=c.error) for c in self.cells], "device_section": self.device_section}

    def format(self) -> str:
        lines = [f"device {self.device} fitted from a layer profile ({len(self.cells)} cells)"
                 + (f": {self.source}" if self.source else "")]
        for key, value in self.fitted.items():
            lines.append(f"  {key:<17} {self.before[key]:.4g} -> {value:.4g}")
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


def fit_layer_profile(profile: LayerProfile) -> LayerFit:
    """The profile's device with `gemm_efficiency` and `hbm_efficiency` fitted to its cells."""
    base = resolved_device(profile.device)
    name = profile.device if isinstance(profile.device, str) else str(profile.device.get("preset", "custom"))
    measured = [x for row in profile.rows for x in (row.forward_ms, row.backward_ms)]
    before = {"gemm_efficiency": float(base.get("gemm_efficiency", base.get("efficiency", 0.5))),
              "memory_efficiency": float(base.get("memory_efficiency", base.get("hbm_efficiency", 0.9)))}
    before["attention_efficiency"] = float(base.get("attention_efficiency", before["gemm_efficiency"]))

    def cost(fractions: Mapping[str, float]) -> float:
        pred = _predictions(profile, {**base, **fractions})
        return sum(math.log(p / m) ** 2 for p, m in zip(pred, measured))

    current = dict(before)
    for _ in range(ROUNDS):
        previous = dict(current)
        for key in FITTED:
            current[key] = _golden_log(lambda x: cost({**current, key: x}), *SEARCH, iters=60)
        if all(abs(current[k] / previous[k] - 1) < TOLERANCE for k in FITTED):
            break
    for key, value in current.items():
        if value >= SEARCH[1] * (1 - 1e-4) or value <= SEARCH[0] * (1 + 1e-4):
            raise CalibrationError(f"the fitted {key} would be outside (0, 1]: the layer profile is not this device "
                                   f"({name}) on this cluster")
    fitted = {k: round(current[k], 4) for k in FITTED}
    pred_before = _predictions(profile, {**base, **before})
    pred_after = _predictions(profile, {**base, **fitted})
    cells = []
    for i, row in enumerate(profile.rows):
        for j, which in enumerate(("forward", "backward")):
            k = 2 * i + j
            cells.append(Cell(row.label, which, measured[k], pred_before[k], pred_after[k]))
    section = (dict(profile.device) if isinstance(profile.device, dict) else {"preset": profile.device})
    section.update(fitted)
    return LayerFit(profile.source, name, before, fitted, cells, section)
