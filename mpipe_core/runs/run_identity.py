"""What a run ran, against what its workload describes: which model, on which
devices, and what of the workload's layout the run did not execute.

A saved version's workload may describe a model the executor never runs (an
analytic InternVL-26B on 512 Ascend dies, tp=8, dp=16); the executor then runs
its small built-in model, sized from that workload's structure, on the
schedule's pipeline devices.  Its timings and memory are then not a test of a
prediction on that workload: a comparison with it is across models, and is
labelled so (`same_model`).  Pure functions of documents: the CLI, the worker,
the queue's summary and the app (which never imports torch) share them.
"""
from __future__ import annotations

from typing import Any, Mapping

# Parallel settings a run of this executor does not execute (it runs the schedule's pipeline
# devices, one replica, unsharded layers); each with the value that means "none".
_NOT_RUN = {"tp": 1, "cp": 1, "dp": 1, "sp": False, "encoder_shard": "none"}


def workload_model(doc: Mapping[str, Any] | None) -> str:
    """The model a workload document describes, in words: an analytic one's model
    (and device), a profile's measured model, a structural one's model, else its name."""
    if not doc:
        return "the default (uniform) workload"
    origin = doc.get("origin") if isinstance(doc.get("origin"), Mapping) else None
    if origin and isinstance(origin.get("model"), Mapping):
        m = origin["model"]
        config = f" ({m['config']})" if m.get("config") else ""
        return f"{m.get('model', '?')}{config} as profiled on {origin.get('device', '?')}"
    if "model" in doc:
        device = f" on {doc['device']}" if doc.get("device") else ""
        return f"{doc.get('name') or doc['model']} (model {doc['model']}{device})"
    return str(doc.get("name") or "an explicit workload")


def same_model(doc: Mapping[str, Any] | None, ran_model: str) -> bool:
    """Whether a prediction on workload `doc` is one of the model that ran (`ran_model`:
    the model option, "hf:llava", "tiny", ...; "" for the built-in sized from the
    workload): its profile, its structural workload (`model:NAME`), or, for the built-in
    model sized from it, a workload of costs only (no model, no device, no time unit),
    whose structure is what ran.  An analytic workload (it names a model) or one
    profiled from another model is another model."""
    if not doc:
        return True  # the uniform default: structure only
    origin = doc.get("origin") if isinstance(doc.get("origin"), Mapping) else None
    if origin and isinstance(origin.get("model"), Mapping):
        return origin["model"].get("model") == (ran_model or "tiny")
    name = str(doc.get("name") or "")
    if name.startswith("model:"):
        return name[len("model:"):] == (ran_model or "tiny")
    if "model" in doc or "device" in doc:
        return False
    return True  # hand-written costs: written for the model that runs (the built-in one is sized from them)


def dropped_layout(doc: Mapping[str, Any] | None) -> list[str]:
    """The parts of the workload's layout the run did not execute: its parallel
    settings beyond the pipeline (`tp=8`, `dp=16`, `sp`, ...), each as `key=value`."""
    section = (doc or {}).get("parallel")
    if not isinstance(section, Mapping):
        return []
    out = []
    for key, none in _NOT_RUN.items():
        value = section.get(key, none)
        if value != none:
            out.append(key if value is True else f"{key}={value}")
    return out


def workload_devices(doc: Mapping[str, Any] | None, pipeline_devices: int) -> int:
    """The devices the workload's layout spans: the pipeline's times tp x cp x dp."""
    section = (doc or {}).get("parallel")
    if not isinstance(section, Mapping):
        return pipeline_devices
    n = pipeline_devices
    for key in ("tp", "cp", "dp"):
        value = section.get(key, 1)
        n *= value if isinstance(value, int) and not isinstance(value, bool) else 1
    return n


def identity_lines(doc: Mapping[str, Any] | None, ran_model: str, model_text: str, ranks: int,
                   backend: str, executed: Mapping[str, Any] | None = None, pipeline: int | None = None) -> list[str]:
    """What ran and how it relates to the workload, in lines for a run's output and summary.
    `executed`: the layout the run executed (`RunLayout.to_dict()`; None: one pipeline), whose
    parts are not dropped; `pipeline`: the term's devices (default `ranks`)."""
    pipeline = ranks if pipeline is None else pipeline
    lines = [f"ran: {model_text} on {ranks} rank{'s' if ranks != 1 else ''} ({backend})"]
    if not same_model(doc, ran_model):
        lines.append(f"workload: {workload_model(doc)}, another model: a comparison with it is across "
                     f"models, not a prediction of this run")
    kept = set(dropped_layout({"parallel": dict(executed)})) if executed else set()
    dropped = [part for part in dropped_layout(doc) if part not in kept]
    if dropped:
        ran = (f"the {pipeline}-device pipeline" if ranks == pipeline else
               f"{ranks} ranks ({', '.join(sorted(kept))} of it)")
        lines.append(f"dropped from the workload's layout: {', '.join(dropped)} (it spans "
                     f"{workload_devices(doc, pipeline)} devices; this run executed {ran})")
    return lines
