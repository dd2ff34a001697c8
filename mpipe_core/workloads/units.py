"""Units and numbers: the units a workload's figures are in (`TIME_UNITS`,
`MEMORY_UNITS`, bytes per memory unit), and numbers written for people: `115,312`,
`27.81`, `0.00012`, never `1.153e+05`; a percentage that would round to 0 keeps
enough digits to show it is not.

Used by the core's own texts (the transpose verdict) and by the app, so a
figure reads the same on a terminal and in the browser.
"""
from __future__ import annotations

import math

SIGNIFICANT = 4
_SECONDS_FROM_MS = 10_000  # at or above 10,000 ms a time reads better in seconds

# The units a workload's numbers are in, declared by the workload ("units":
# {"time": "ms", "memory": "GB"}); "" means unitless (abstract units).
TIME_UNITS = ("", "us", "ms", "s")
MEMORY_UNITS = ("", "bytes", "KB", "MB", "GB", "KiB", "MiB", "GiB")
# Milliseconds in one of each declared time unit (a unitless workload has none).
MS_PER_TIME_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1000.0}
BYTES_PER_UNIT = {"bytes": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2.0 ** 10, "MiB": 2.0 ** 20,
                  "GiB": 2.0 ** 30}


def bytes_per_memory_unit(unit: str) -> float | None:
    """Bytes in one `unit` of memory; None for a unitless workload (abstract units)."""
    return BYTES_PER_UNIT.get(unit)


def human(value: float | int | None, significant: int = SIGNIFICANT) -> str:
    """`value` in plain decimal notation with thousands separators: all integer
    digits, and decimals up to `significant` significant digits, trailing
    zeros dropped."""
    if value is None or isinstance(value, bool):
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    # At most 6 decimals: float noise (5e-12 left by a subtraction) reads as 0.
    decimals = min(6, max(0, significant - 1 - magnitude))
    text = f"{value:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def quantity(value: float | int | None, unit: str) -> str:
    """A number with its unit (`""`: unitless, no suffix); large millisecond
    figures are given in seconds."""
    if value is None or isinstance(value, bool):
        return "–"
    if unit == "ms" and abs(value) >= _SECONDS_FROM_MS:
        return f"{human(value / 1000.0)} s"
    return f"{human(value)} {unit}" if unit else human(value)


def seconds(value: float | None, signed: bool = False, significant: int = SIGNIFICANT) -> str:
    """A duration given in seconds, for people: "5.052 s", "11,270 s", under a second
    in milliseconds ("18.54 ms", never "0.01854 s"); `signed`: with its sign ("+917.5 ms")."""
    if value is None or isinstance(value, bool):
        return "–"
    sign = "+" if signed and value > 0 else ""
    if value != 0 and abs(value) < 1.0:
        return f"{sign}{human(value * 1000.0, significant)} ms"
    return f"{sign}{human(value, significant)} s"


def percent(fraction: float | None, decimals: int = 1) -> str:
    """`fraction` as a percentage with `decimals` decimals, or with two
    significant digits when those decimals would show a non-zero value as 0."""
    if fraction is None or not math.isfinite(fraction):
        return "–"
    pct = 100.0 * fraction
    if pct != 0 and round(abs(pct), decimals) == 0:
        decimals = min(12, 1 - math.floor(math.log10(abs(pct))))
    return f"{pct:.{decimals}f}%"
