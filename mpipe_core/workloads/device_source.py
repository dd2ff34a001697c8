"""What a step time rests on: the device's efficiencies and where they came from.

Every step time and MFU the cluster model prints is the device's achieved
fractions of its peak (GEMMs, the unfused attention core's GEMMs, HBM for the
GEMMs' bytes and the optimizer, the memory-bound kernels, the fused attention
kernel) times the work; a fraction a device leaves out that the model takes
from another (attention from the GEMM's, memory from the HBM's) prints as
`attention = gemm`;
a reader must know whether those fractions were measured for their stack.  A
device section is one of:

* a preset as shipped: its figures' source (`PRESET_SOURCES`, docs/cluster.md);
  a preset whose figures are nominal (a vendor's modelling defaults, never a
  measurement of a training step: the Ascend parts today) is *uncalibrated*,
  and the text says which command would calibrate it;
* a calibration: `calibrate --log`, `calibrate RUN --device` and `calibrate
  --device --layer-profile FILE -w W` write `device.calibration` (`{"from":
  "log", "log": FILE, "format", "lines", "date", ...}`, `{"from": "run", "run":
  N, "date", ...}` or `{"from": "layer profile", "profile": FILE, "cells",
  "date"}`) beside the fitted fractions;
* a device the workload states itself (its own fractions, no calibration
  recorded): said so.

Pure data and text (imports the presets only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mpipe_core.workloads.presets import DEVICES

# (measured?, source) of each device preset's efficiencies.  Nominal figures are uncalibrated.
PRESET_SOURCES: dict[str, tuple[bool, str]] = {
    "a100": (True, "GEMM and attention-core fractions fitted to Korthikanti et al. 2022 Table 4 (one GPT-3 175B "
                   "layer's forward/backward ms, five recompute and sp settings, rms 0.6%; "
                   "examples/layer-profiles/korthikanti2022-table4.json); docs/cluster.md"),
    "h100": (True, "GEMM ceiling = the best measured matmul, 792.1 of 989 TFLOP/s (stas00/ml-engineering); "
                   "docs/cluster.md"),
    "h200": (True, "the h100's measured GEMM ceiling with HBM3e (docs/cluster.md)"),
    "ascend-910c": (False, "the vendor's nominal efficiencies (msmodeling), not a measurement"),
    "ascend-910b": (False, "the vendor's nominal efficiencies (msmodeling), not a measurement"),
}
CALIBRATE_COMMAND = "mpipe calibrate --log TRAIN.LOG -w WORKLOAD --term TERM --save NAME"
SHORT = {"gemm_efficiency": "gemm", "attention_efficiency": "attention", "hbm_efficiency": "hbm",
         "memory_efficiency": "memory", "flash_efficiency": "flash", "efficiency": "efficiency"}
FRACTIONS = ("gemm_efficiency", "attention_efficiency", "hbm_efficiency", "memory_efficiency", "flash_efficiency")
# analytic._device_model's defaults where a device leaves a fraction out
DEFAULTS = {"hbm_efficiency": 0.9, "flash_efficiency": 0.5}
# ... and the fractions that are another one's where a device leaves them out (no layer profile fitted them)
FOLLOWS = {"attention_efficiency": "gemm_efficiency", "memory_efficiency": "hbm_efficiency"}


@dataclass(frozen=True)
class DeviceSource:
    device: str  # the preset's name, or "custom"
    fractions: dict[str, float]  # as the step model prices them
    kind: str  # "preset", "calibrated", "uncalibrated" or "stated"
    source: str  # where the fractions came from, in words
    calibration: dict = field(default_factory=dict)  # device.calibration as written (calibrated only)
    follows: dict[str, str] = field(default_factory=dict)  # fraction -> the one it equals (stated by neither)

    @property
    def calibrated(self) -> bool:
        return self.kind != "uncalibrated"

    def text(self) -> str:
        figures = ", ".join(f"{SHORT[k]} = {SHORT[self.follows[k]]}" if k in self.follows else f"{SHORT[k]} {v:.3g}"
                            for k, v in self.fractions.items())
        if self.kind == "uncalibrated":
            return (f"{self.device} UNCALIBRATED: {figures} are {self.source}; calibrate it from a training log: "
                    f"{CALIBRATE_COMMAND}")
        if self.kind == "calibrated":
            return f"{self.device} calibrated from {self.source}: {figures}"
        if self.kind == "preset":
            return f"{self.device} preset: {figures} ({self.source})"
        return f"{self.device}: {figures} ({self.source})"

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "fractions": dict(self.fractions), "kind": self.kind,
                "calibrated": self.calibrated, "source": self.source, "calibration": dict(self.calibration),
                "follows": dict(self.follows),
                "text": self.text()}


def _calibration_source(cal: Mapping[str, Any]) -> str:
    date = cal.get("date", "an unrecorded date")
    if cal.get("from") == "log":
        lines = cal.get("lines")
        return (f"log {cal.get('log', '?')} ({cal.get('format', '?')}"
                + (f", {lines} steady lines" if lines is not None else "") + f", {date})")
    if cal.get("from") == "layer profile":
        cells = cal.get("cells")
        return (f"layer profile {cal.get('profile', '?')} (" + (f"{cells} cells, " if cells is not None else "")
                + f"{date})")
    if cal.get("from") == "run":
        return f"run {cal.get('run', '?')} ({date})"
    return f"{cal.get('from', 'an unnamed calibration')} ({date})"


def device_source(doc: Mapping[str, Any] | None) -> DeviceSource | None:
    """Where an analytic document's device figures come from (None: not an analytic document)."""
    if not isinstance(doc, Mapping) or "model" not in doc:
        return None
    device = doc.get("device")
    name = device if isinstance(device, str) else device.get("preset", "custom") if isinstance(device, dict) \
        else "custom"
    section = device if isinstance(device, dict) else {}
    preset = DEVICES.get(name, {}) if isinstance(name, str) else {}
    resolved = {**preset, **section}
    follows: dict[str, str] = {}
    if "cluster" in doc:
        base = {"gemm_efficiency": resolved.get("gemm_efficiency", resolved.get("efficiency", 0.5)),
                **{k: resolved.get(k, DEFAULTS[k]) for k in ("hbm_efficiency", "flash_efficiency")}}
        follows = {k: other for k, other in FOLLOWS.items() if k not in resolved}
        fractions = {k: base[k] if k in base else resolved.get(k, base[FOLLOWS[k]]) for k in FRACTIONS}
        keys = FRACTIONS
    else:  # no roofline: one efficiency
        fractions = {"efficiency": resolved.get("efficiency", 0.5)}
        keys = ("efficiency",)
    fractions = {k: float(v) for k, v in fractions.items()}
    cal = section.get("calibration")
    if isinstance(cal, Mapping):
        return DeviceSource(str(name), fractions, "calibrated", _calibration_source(cal), dict(cal), follows)
    overridden = sorted((k for k in keys if k in section), key=keys.index)
    if name in PRESET_SOURCES and not overridden:
        measured, source = PRESET_SOURCES[name]
        if measured and "cluster" not in doc:  # the one `efficiency` is a typical figure, not the measured ceiling
            source = "a typical achieved fraction of peak: without a cluster there is no roofline (docs/cluster.md)"
        return DeviceSource(name, fractions, "preset" if measured else "uncalibrated", source, follows=follows)
    if overridden:
        return DeviceSource(str(name), fractions, "stated",
                            f"the workload's own {', '.join(SHORT[k] for k in overridden)}; no calibration recorded",
                            follows=follows)
    return DeviceSource(str(name), fractions, "stated", "as the workload states them; no calibration recorded",
                        follows=follows)
