"""Predicted memory against what a run measured, per device.

The prediction is the simulator's (`mpipe_core.simulation.metrics`): per device the peak
of activations and the static memory, in the workload's memory unit.  The
measurement is each rank's (`executor.runtime.memory_meter`, in bytes): the
most bytes autograd held saved for backward at once, and the bytes of the
parameters, gradients and optimizer state it holds.  The two meet when the
workload's memory unit is a byte unit (`mpipe profile` writes bytes); a
unitless workload's figures are shown as they are, without a ratio.

`TOLERANCE` is the rule the memory benchmark and its test hold the profiled
workload to: predicted peak activation memory within 10% of the measured one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mpipe_core.workloads.units import bytes_per_memory_unit, human

TOLERANCE = 0.10


@dataclass
class DeviceMemory:
    device: int
    measured_activation: int  # bytes
    peak_op: str  # the op running when the measured activation peaked
    predicted_activation: float | None  # in the workload's unit
    predicted_static: float | None
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0

    @property
    def measured_static(self) -> int:
        """Bytes: parameters + gradients + optimizer state."""
        return self.parameters + self.gradients + self.optimizer

    def as_dict(self) -> dict[str, Any]:
        """Its fields, `measured_static` after `measured_activation`."""
        fields = asdict(self)
        head = {k: fields.pop(k) for k in ("device", "measured_activation")}
        return {**head, "measured_static": self.measured_static, **fields}


@dataclass
class MemoryComparison:
    """Per device, predicted (in `unit`; bytes when `to_bytes` is known) and measured (bytes)."""

    workload: str
    unit: str  # the workload's memory unit ("" unitless)
    devices: list[DeviceMemory]

    @property
    def to_bytes(self) -> float | None:
        return bytes_per_memory_unit(self.unit)

    def predicted_bytes(self, value: float | None) -> float | None:
        scale = self.to_bytes
        return None if value is None or scale is None else value * scale

    def activation_ratio(self, d: DeviceMemory) -> float | None:
        return _ratio(self.predicted_bytes(d.predicted_activation), d.measured_activation)

    def static_ratio(self, d: DeviceMemory) -> float | None:
        return _ratio(self.predicted_bytes(d.predicted_static), d.measured_static)

    def within(self, tolerance: float = TOLERANCE) -> bool | None:
        """Every device's predicted peak activation within `tolerance` of the measured one
        (None when the prediction is not in bytes)."""
        ratios = [self.activation_ratio(d) for d in self.devices]
        if not ratios or any(r is None for r in ratios):
            return None
        return all(abs(r - 1.0) <= tolerance for r in ratios)

    def as_dict(self) -> dict[str, Any]:
        rows = []
        for d in self.devices:
            rows.append({**d.as_dict(), "predicted_activation_bytes": self.predicted_bytes(d.predicted_activation),
                         "predicted_static_bytes": self.predicted_bytes(d.predicted_static),
                         "activation_ratio": self.activation_ratio(d), "static_ratio": self.static_ratio(d)})
        return {"workload": self.workload, "unit": self.unit, "devices": rows, "tolerance": TOLERANCE,
                "within_tolerance": self.within()}

    def rows(self) -> list[list[str]]:
        """Table cells: device, activation predicted / measured / ratio, static likewise, peak op."""
        out = []
        for d in self.devices:
            out.append([str(d.device), _figure(self.predicted_bytes(d.predicted_activation), d.predicted_activation),
                        human(d.measured_activation), _times(self.activation_ratio(d)),
                        _figure(self.predicted_bytes(d.predicted_static), d.predicted_static),
                        human(d.measured_static), _times(self.static_ratio(d)), d.peak_op])
        return out

    HEADERS = ["device", "activation predicted", "measured", "ratio", "static predicted", "measured", "ratio",
               "peak in"]

    def caption(self) -> str:
        if self.to_bytes is None:
            return (f"memory: measured in bytes; workload {self.workload} predicts it in units of its own "
                    "(no memory unit), so no ratio (mpipe profile writes a workload in bytes)")
        return (f"memory in bytes: predicted by workload {self.workload}, measured (activations: the peak of "
                "what autograd keeps saved for backward; static: parameters, gradients, optimizer state)")


    def lines(self) -> list[str]:
        """The caption and the table, for a terminal."""
        from .calibrate import _table

        return [self.caption()] + _table(self.rows(), self.HEADERS)


def compare_memory(metrics, memory_unit: str, measured: list[dict[str, Any]], workload: str) -> MemoryComparison:
    """`metrics` (a core `Metrics`) against the ranks' measured memory
    (`memory_meter.RankMemory.as_dict()` per rank, or the stored rows)."""
    devices = []
    for row in sorted(measured, key=lambda r: r["rank"]):
        d = row["rank"]
        devices.append(DeviceMemory(
            device=d, measured_activation=int(row["activation_peak"]),
            peak_op=row.get("activation_peak_op") or "",
            predicted_activation=_at(metrics.peak_activation_memory, d), predicted_static=_at(metrics.static_memory, d),
            parameters=int(row["parameters"]), gradients=int(row["gradients"]), optimizer=int(row["optimizer"])))
    return MemoryComparison(workload, memory_unit, devices)


def _at(values, d: int) -> float | None:
    return values[d] if values is not None and d < len(values) else None


def _ratio(predicted: float | None, measured: int) -> float | None:
    if predicted is None or measured <= 0:
        return None
    return predicted / measured


def _figure(in_bytes: float | None, raw: float | None) -> str:
    if in_bytes is not None:
        return human(round(in_bytes))
    return human(raw)


def _times(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.3f}"
