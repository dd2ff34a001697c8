"""Interop: formats in and out.

Out: PyTorch pipelining CSV, Chrome/Perfetto traces, JSON (`FORMATS`, what the
app offers for download), and the training stacks' configs (`STACK_FORMATS`:
torchtitan's CSV + TOML, Megatron's layout string, MindSpeed's
layer_placement).  `export_text(evaluation, format)` is what `mpipe export`
writes: one function, so the CLI and the app never differ.

In: torch CSVs (`torch_csv`), per-rank Kineto traces (`kineto`, with
`pp_actions` and `label_pattern`), Megatron's simulator output
(`megatron_sim`), read from files by `trace_files` and assembled into one
run's `TimelineRecord`s by `trace_import`.
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
# The stacks' own configs: refused, naming the part, when a term cannot be expressed.
STACK_FORMATS = ("torchtitan", "megatron-layout", "mindspeed-placement")
# A whole layout's launch configuration (parallel degrees, batch sizes, recompute): `launch_config`.
LAUNCH_FORMATS = ("megatron", "mindspeed-mm")


def refusal(ev: Any, fmt: str) -> str | None:
    """Why `fmt` cannot express the evaluation's schedule, or None when it can."""
    from mpipe_core.formats.torch_csv import refusal as torch_csv_refusal

    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}")
    return torch_csv_refusal(ev.schedule) if fmt == "torch-csv" else None


def export_text(ev: Any, fmt: str) -> tuple[str, list[str]]:
    """(text, notes) of an `Evaluation` in `fmt` (a key of FORMATS); notes say
    what the format cannot express."""
    from mpipe_core.formats.chrome_trace import chrome_trace
    from mpipe_core.formats.torch_csv import to_torch_csv

    if fmt == "torch-csv":
        return to_torch_csv(ev.schedule)
    if fmt == "chrome-trace":
        comm = [c.as_dict() for c in ev.comm]  # an analytic workload on a cluster: its communication
        return json.dumps(chrome_trace(ev.timeline_rows(), ev.schedule.devices, title=ev.term, comm=comm)) + "\n", []
    if fmt == "megatron-layout":
        from mpipe_core.formats.megatron_layout import megatron_layout

        return megatron_layout(ev)
    if fmt == "mindspeed-placement":
        from mpipe_core.formats.mindspeed import mindspeed_placement

        return mindspeed_placement(ev)
    if fmt == "json":
        doc = ev.summary()
        doc["workload"] = ev.workload.to_dict()
        doc["orders"] = [[str(op) for op in order] for order in ev.schedule.orders]
        doc["timeline"] = ev.timeline_rows()
        return json.dumps(doc) + "\n", []
    raise ValueError(f"unknown export format {fmt!r}")
