"""Where a workload's ops run: the link between devices (latency, bandwidth), and
devices that share a host's cores (contention, the launch cost `dispatch`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.fields import MAX_DEVICES, check_keys, finite, integer, number, shown


@dataclass(frozen=True)
class Link:
    latency: float = 0.0
    bandwidth: float | None = None  # bytes per time unit; None = infinite

    def transfer(self, nbytes: float) -> float:
        if self.bandwidth is None or nbytes <= 0:
            return self.latency
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Host:
    """Devices that share one machine's cores and memory bandwidth slow each
    other down: with k of a host's devices computing at once, each runs at
    1 / (1 + contention * (k - 1)) of its own speed (processor sharing).
    `devices` per host (None: every device on one host); contention 0 (the
    default) is the plain model of independent devices.

    `pairs`: the slowdown by what runs where, overriding `contention` for the
    pairs it names: ((victim, other, c), ...) with victim and other op classes
    (`OP_CLASSES`: "llm" or "encoder").  An op of class A then runs at
    1 / (1 + sum of c(A, B) over the host's other busy devices, each running
    class B).  Measured here the pairs differ several-fold: an encoder streams
    its weights through the shared last-level cache, so a small LLM op beside
    it slows far more than it slows the encoder or than two encoders slow each
    other.

    `dispatch`: the fixed time of launching one op that every cost already
    includes (calibration folds the measured gap between ops into costs).  An
    encoder microbatch split into k shards pays it k times: each shard costs
    (cost - dispatch) / k + dispatch."""

    devices: int | None = None
    contention: float = 0.0
    dispatch: float = 0.0
    pairs: tuple[tuple[str, str, float], ...] = ()

    def host_of(self, device: int) -> int:
        return 0 if self.devices is None else device // self.devices

    @property
    def contends(self) -> bool:
        """Whether any busy device slows another (else the plain simulator is exact)."""
        return self.contention > 0 or any(c > 0 for _, _, c in self.pairs)

    def slowdown(self, victim: str, other: str) -> float:
        """c(victim, other): how much one busy device running `other` slows an op of class `victim`."""
        for a, b, c in self.pairs:
            if a == victim and b == other:
                return c
        return self.contention

    def pairs_doc(self) -> dict[str, dict[str, float]]:
        """`pairs` as the workload file writes it: {victim: {other: c}}."""
        doc: dict[str, dict[str, float]] = {}
        for a, b, c in self.pairs:
            doc.setdefault(a, {})[b] = c
        return doc


# The op classes host contention tells apart (`Host.pairs`).
OP_CLASSES = ("llm", "encoder")


def parse_host(doc: Any) -> Host:
    if doc is None:
        return Host()
    if not isinstance(doc, dict):
        raise WorkloadError("host: expected an object")
    check_keys(doc, {"devices", "contention", "dispatch", "pairs"}, "host")
    devices = doc.get("devices")
    if devices is not None:
        devices = integer(devices, "host.devices", 1, MAX_DEVICES)
    return Host(devices=devices, contention=number(doc, "contention", "host", 0.0),
                dispatch=number(doc, "dispatch", "host", 0.0), pairs=_parse_pairs(doc.get("pairs")))


def _parse_pairs(doc: Any) -> tuple[tuple[str, str, float], ...]:
    """host.pairs: {victim: {other: c}} over `OP_CLASSES`."""
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        raise WorkloadError("host.pairs: expected an object {op class: {op class: contention}}")
    out = []
    for victim, row in doc.items():
        if victim not in OP_CLASSES:
            raise WorkloadError(f"host.pairs: unknown op class {str(victim)[:40]!r} (known: {', '.join(OP_CLASSES)})")
        if not isinstance(row, dict):
            raise WorkloadError(f"host.pairs.{victim}: expected an object {{op class: contention}}")
        for other in row:
            if other not in OP_CLASSES:
                raise WorkloadError(f"host.pairs.{victim}: unknown op class {str(other)[:40]!r} "
                                    f"(known: {', '.join(OP_CLASSES)})")
            out.append((victim, other, finite(row[other], f"host.pairs.{victim}.{other}")))
    return tuple(out)


def parse_device(doc: Any) -> float | None:
    """device: {"memory": capacity} in the workload's memory unit (null: unknown)."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise WorkloadError('device: an explicit workload takes {"memory": capacity}; a device preset or '
                            'profile goes with a "model" (the analytic form)')
    check_keys(doc, {"memory"}, "device")
    value = doc.get("memory")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"device.memory: expected a number, got {shown(value)}")
    if value <= 0:
        raise WorkloadError(f"device.memory: must be > 0 or null, got {shown(value)}")
    return float(value)
