"""The headline of an evaluation whose workload has a step model (an analytic
workload: model, device, cluster): its step time in seconds and its MFU, the
figures `mpipe plan` ranks by.  An explicit workload has neither and shows nothing."""
from __future__ import annotations

import streamlit as st


def step_text(summary: dict) -> tuple[str, str] | None:
    """("12.3 s", "41.2%"; under a second in ms), or None when the evaluation has no step figures."""
    if summary.get("step_time_s") is None or summary.get("mfu") is None:
        return None
    from mpipe_core.workloads.units import seconds

    return seconds(summary["step_time_s"]), f"{summary['mfu']:.1%}"


def device_text(summary: dict, document: dict | None = None) -> str | None:
    """What the step time rests on: the device's efficiencies and their source (a preset,
    a calibration with its log or run and date, or uncalibrated with the command that
    would calibrate it), from the summary's `device_source` or the workload `document`."""
    source = summary.get("device_source")
    if source is not None:
        return source["text"]
    from mpipe_core.workloads.device_source import device_source

    found = device_source(document)
    return None if found is None else found.text()


def step_cards(summary: dict, degrees: dict[str, int] | None = None, dies_per_npu: int = 1,
               document: dict | None = None) -> None:
    """Step time and MFU as two cards (with devices in all and throughput), when
    the evaluation has them; the devices card names its parts (`degrees`: the
    workload's tp, cp and dp times the schedule's devices, "tp 8 × pp 8") and,
    where a device is one die of an NPU, the NPUs; under them, what the figures
    rest on (`device_text`)."""
    from .formatting import device_parts, npus_text, plain

    shown = step_text(summary)
    if shown is None:
        return
    cols = st.columns(4)
    cols[0].metric("Step time", shown[0], help="one optimizer step: the pipeline, its data-parallel gradient "
                                               "sync and the optimizer (the cluster model's seconds)")
    cols[1].metric("MFU", shown[1], help="model FLOPs per second / (devices in all × the device's peak)")
    parts = device_parts(summary["devices"], degrees) if "devices" in summary else ""
    shown_parts = [parts] if parts and "×" in parts else []
    npus = npus_text(summary.get("devices_total", 0), dies_per_npu)
    label = "Devices in all" + (f" ({'; '.join(shown_parts + ([npus] if npus else []))})"
                                if shown_parts or npus else "")
    cols[2].metric(label, f"{summary.get('devices_total', 0):,}",
                   help="each pipeline device is tp × cp devices, the pipeline replicated dp times")
    cols[3].metric("Tokens / s", f"{summary.get('tokens_per_s', 0):,.0f}")
    text = device_text(summary, document)
    if text is not None:
        st.caption(plain(f"Device: {text}"))


def step_columns(summary: dict | None) -> dict[str, str]:
    """A table row's "step time" and "MFU" cells when the evaluation has them, else none."""
    shown = step_text(summary or {})
    return {} if shown is None else {"step time": shown[0], "MFU": shown[1]}
