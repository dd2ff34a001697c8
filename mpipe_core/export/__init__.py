"""Interop: PyTorch pipelining CSV, Chrome/Perfetto traces, JSON.

`export_text(evaluation, format)` is what `mpipe export` writes and what the
app offers for download: one function, so the two never differ.
`refusal(evaluation, format)` is the reason a format cannot hold a schedule
(the very message `export_text` raises), so the app can say it beside the
button instead of failing when the button is pressed."""
from __future__ import annotations

import json
from typing import Any

# format -> (label, file suffix, MIME type)
FORMATS: dict[str, tuple[str, str, str]] = {
    "torch-csv": ("torch CSV", "csv", "text/csv"),
    "chrome-trace": ("Perfetto trace", "trace.json", "application/json"),
    "json": ("JSON", "json", "application/json"),
}


def refusal(ev: Any, fmt: str) -> str | None:
    """Why `fmt` cannot express the evaluation's schedule, or None when it can."""
    from .torch_csv import refusal as torch_csv_refusal

    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}")
    return torch_csv_refusal(ev.schedule) if fmt == "torch-csv" else None


def export_text(ev: Any, fmt: str) -> tuple[str, list[str]]:
    """(text, notes) of an `Evaluation` in `fmt` (a key of FORMATS); notes say
    what the format cannot express."""
    from .torch_csv import to_torch_csv
    from .trace import chrome_trace

    if fmt == "torch-csv":
        return to_torch_csv(ev.schedule)
    if fmt == "chrome-trace":
        return json.dumps(chrome_trace(ev.timeline_rows(), ev.schedule.devices, title=ev.term)) + "\n", []
    if fmt == "json":
        doc = ev.summary()
        doc["workload"] = ev.workload.to_dict()
        doc["orders"] = [[str(op) for op in order] for order in ev.schedule.orders]
        doc["timeline"] = ev.timeline_rows()
        return json.dumps(doc) + "\n", []
    raise ValueError(f"unknown export format {fmt!r}")
