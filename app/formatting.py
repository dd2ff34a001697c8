"""Figures and text as the app shows them: the core's human numbers with the
workload's units, percentages that never show a non-zero value as 0, times of day,
and user text made plain for elements that render Markdown."""
from __future__ import annotations

import re
from typing import Any

from mpipe_core.workloads.units import human, percent, quantity

UNITLESS = "units"  # what an axis or column says for a workload without a declared time unit


_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def plain(text: Any) -> str:
    """`text` for an element that renders Markdown (captions, alerts, headers), shown
    as typed: every ASCII punctuation mark is escaped, so user text (names, authors,
    descriptions, messages in errors) can never become a link, an image or markup."""
    return _PUNCTUATION.sub(r"\\\1", str(text))


def fmt(value: Any, unit: str = "") -> str:
    """A number for people (no exponents), with `unit` if given."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return quantity(value, unit)
    return "–"


def pct(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return percent(value)
    return "–"


def signed(value: Any, unit: str = "") -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "–"
    text = fmt(value, unit)
    return ("+" if value > 0 and not text.startswith("0") else "") + text


# Tune's baselines (`TuneResult.baselines()`), in the words `mpipe tune` prints them with.
BASELINE_NAMES = {"fused": "fused", "balanced": "balanced", "colocated": "colocated (Megatron MIMO)",
                  "disaggregated": "disaggregated (best)", "transpose": "transpose (best)"}
FITS_WORD = {True: "yes", False: "no", None: "unknown"}  # a schedule against its device's memory
OVER_LISTED = 4  # devices over their memory a table cell names one by one


def over_text(over: dict[int, float], devices: int, unit: str = "", listed: int = OVER_LISTED) -> str:
    """Devices over their memory and by how much (`MemoryFit.over`), the worst
    first, `listed` of them one by one."""
    if not over:
        return ""
    worst = sorted(over, key=lambda d: (-over[d], d))
    text = ", ".join(f"dev {d} +{fmt(over[d], unit)}" for d in worst[:listed])
    return text + (f", … ({len(over)} of {devices} devices)" if len(over) > listed else "")


def fit_verdict(term: str, peaks: list[float], capacity: float | None, unit: str = "") -> tuple[bool | None, str]:
    """Whether `term` (its peak memory per device) fits the device's memory, in one
    line that names what it needs and the capacity: (fits, text); fits is None when
    the capacity is unknown."""
    from mpipe_core.simulation.metrics import memory_fit

    fit = memory_fit(peaks, capacity)
    if fit is None:
        return None, (f"{term}: the device's memory is unknown (the workload states none), so whether it "
                      f"fits is not checked")
    return fit.fits, f"{term} {fit.text(unit)}"


# The degrees that multiply a pipeline's devices, in the order they are named.
DEGREES = ("tp", "cp", "dp")


def devices_total(pipeline: int, degrees: dict[str, int] | None = None) -> int:
    """Devices in all: each of the pipeline's devices is tp x cp devices, the pipeline replicated dp times."""
    total = pipeline
    for name in DEGREES:
        total *= (degrees or {}).get(name, 1)
    return total


def device_count(pipeline: int, degrees: dict[str, int] | None = None, dies_per_npu: int = 1) -> str:
    """Devices in all, with the parts: "64 (tp 8 × pp 8)", "8" without tp, cp or dp; where
    a device is one die of an NPU, the NPUs too: "512 (tp 8 × pp 64; 256 NPUs, 2 dies each)"."""
    parts = device_parts(pipeline, degrees)
    count = devices_total(pipeline, degrees)
    shown = [] if parts == f"pp {pipeline:,}" else [parts]
    if dies_per_npu > 1:
        shown.append(npus_text(count, dies_per_npu))
    return f"{count:,}" + (f" ({'; '.join(shown)})" if shown else "")


def npus_text(devices: int, dies_per_npu: int) -> str:
    """ "256 NPUs, 2 dies each" for 512 devices that are dies of 2-die NPUs ("" for 1 die each)."""
    from mpipe_core.workloads.cluster import devices_text

    text = devices_text(devices, dies_per_npu)
    return text[text.index("(") + 1:-1] if "(" in text else ""


def device_parts(pipeline: int, degrees: dict[str, int] | None = None) -> str:
    """What `device_count` multiplies: "tp 8 × pp 8 × dp 4" (a degree of 1 left out, pp always there)."""
    degrees = degrees or {}
    parts = [f"{name} {degrees[name]}" for name in ("tp", "cp") if degrees.get(name, 1) > 1]
    parts.append(f"pp {pipeline:,}")
    if degrees.get("dp", 1) > 1:
        parts.append(f"dp {degrees['dp']}")
    return " × ".join(parts)


def steps_text(steps) -> str:
    """Step numbers, runs of three or more as ranges: "1–149", "1, 2", "1–3, 7"."""
    steps, parts, i = list(steps), [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        parts += [f"{steps[i]}–{steps[j]}"] if j - i >= 2 else [str(x) for x in steps[i:j + 1]]
        i = j + 1
    return ", ".join(parts)


def axis_unit(unit: str) -> str:
    """What an axis title says: the unit, or 'units' for unitless workloads."""
    return unit or UNITLESS


def when(value) -> str:
    """A time of day with its date, short enough for a table column (local time)."""
    return value.astimezone().strftime("%b %d %H:%M:%S") if value else "–"


__all__ = ["BASELINE_NAMES", "DEGREES", "FITS_WORD", "UNITLESS", "axis_unit", "device_count", "device_parts",
           "devices_total", "fit_verdict", "fmt", "human", "npus_text", "over_text", "pct", "percent", "plain", "signed",
           "steps_text", "when"]
