"""A layer profile: one transformer layer's measured forward and backward times at
a stated shape, under one or more parallel settings and recompute modes, and
the model's prediction of each (`predict`), from the same roofline and
collectives that price a whole step (`transformer_cost`, `layer_comm`,
`analytic.tp_exposed`).

The document (JSON):

    {"source": "...", "device": "a100" | {...}, "cluster": "dgx-a100" | {...},
     "model": {"hidden": 6144, "heads": 64, "seq_len": 2048, "microbatch_size": 4, ...},
     "layers": [{"parallel": {"tp": 8, "sp": false, "flash_attention": false},
                 "recompute": "none" | "selective" | "full",
                 "forward_ms": 7.7, "backward_ms": 11.9}, ...]}

A backward time with recompute includes the recomputed forward (the whole
layer's with its tp collectives, or the attention core's), as Korthikanti et
al. 2022 (Table 4) measured it.  Time one layer under the stack you train with
on one node (`mpipe profile` times its own models' layers, tp 1, but does not
write this format yet); `mpipe calibrate --device --layer-profile FILE` fits a
device to it
(`executor/analysis/layer_fit.py`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mpipe_core.errors import WorkloadError
from mpipe_core.workloads import layer_comm
from mpipe_core.workloads.analytic import _device_model, _get, _resolve, parallel_section, tp_exposed
from mpipe_core.workloads.cluster import group_link, parse_cluster, place
from mpipe_core.workloads.fields import shown
from mpipe_core.workloads.presets import DEVICES
from mpipe_core.workloads.transformer_cost import LayerShape, layer_times

RECOMPUTE = ("none", "selective", "full")
PROFILE_KEYS = {"source", "device", "cluster", "model", "layers"}
ROW_KEYS = {"parallel", "recompute", "forward_ms", "backward_ms", "label"}
MODEL_KEYS = {"hidden", "heads", "kv_heads", "ffn", "gated_mlp", "seq_len", "microbatch_size"}


@dataclass(frozen=True)
class ProfileRow:
    label: str
    parallel: dict
    recompute: str
    forward_ms: float
    backward_ms: float


@dataclass(frozen=True)
class LayerProfile:
    source: str
    device: Any  # a preset name or a device section, as written
    cluster: Any
    model: dict
    rows: tuple[ProfileRow, ...]


def _positive(doc: Mapping[str, Any], key: str, where: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise WorkloadError(f"{where}.{key}: expected a positive finite number, got {shown(value)}")
    return float(value)


def parse_profile(doc: Any) -> LayerProfile:
    """A layer profile document, checked (each error names its place)."""
    if not isinstance(doc, dict):
        raise WorkloadError('layer profile: expected {"device": ..., "cluster": ..., "model": {...}, "layers": [...]}')
    unknown = sorted(set(doc) - PROFILE_KEYS)
    if unknown:
        raise WorkloadError(f"layer profile: unknown key '{unknown[0]}' (known: {', '.join(sorted(PROFILE_KEYS))})")
    for key in ("device", "cluster", "model", "layers"):
        if key not in doc:
            raise WorkloadError(f"layer profile: missing required key '{key}'")
    model = doc["model"]
    if not isinstance(model, dict):
        raise WorkloadError("layer profile.model: expected an object")
    unknown = sorted(set(model) - MODEL_KEYS)
    if unknown:
        raise WorkloadError(f"layer profile.model: unknown key '{unknown[0]}' (known: {', '.join(sorted(MODEL_KEYS))})")
    for key in ("hidden", "heads", "seq_len"):
        _positive(model, key, "layer profile.model")
    for key in ("kv_heads", "ffn", "microbatch_size"):
        if key in model:
            _positive(model, key, "layer profile.model")
    rows = doc["layers"]
    if not isinstance(rows, list) or not rows:
        raise WorkloadError("layer profile.layers: expected a non-empty list of measured layers")
    out = []
    for i, row in enumerate(rows):
        where = f"layer profile.layers[{i}]"
        if not isinstance(row, dict):
            raise WorkloadError(f"{where}: expected an object")
        unknown = sorted(set(row) - ROW_KEYS)
        if unknown:
            raise WorkloadError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(ROW_KEYS))})")
        recompute = row.get("recompute", "none")
        if recompute not in RECOMPUTE:
            raise WorkloadError(f"{where}.recompute: expected one of {', '.join(RECOMPUTE)}, got {shown(recompute)}")
        parallel = row.get("parallel", {})
        if not isinstance(parallel, dict):
            raise WorkloadError(f"{where}.parallel: expected an object")
        par = parallel_section({"parallel": parallel})
        heads = int(model["heads"])
        if heads % par["tp"] or int(model.get("kv_heads", heads)) % par["tp"]:
            raise WorkloadError(f"{where}.parallel.tp: {par['tp']} does not divide the layer's attention "
                                f"(or key/value) heads")
        label = row.get("label", f"{recompute}, tp={par['tp']}{' sp' if par['sp'] else ''}")
        out.append(ProfileRow(str(label), par, recompute, _positive(row, "forward_ms", where),
                              _positive(row, "backward_ms", where)))
    return LayerProfile(str(doc.get("source", "")), doc["device"], doc["cluster"], dict(model), tuple(out))


def load_profile(path: str | Path) -> LayerProfile:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise WorkloadError(f"layer profile {path}: cannot read it ({e.strerror})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"layer profile {path}: not JSON (line {e.lineno}: {e.msg})") from None
    return parse_profile(doc)


def resolved_device(device: Any) -> dict:
    """A device section (a preset name, {"preset": NAME, ...overrides} or a full object) as a dict."""
    return dict(_resolve(device, DEVICES, "device"))


def predict(profile: LayerProfile, row: ProfileRow, device: Mapping[str, Any]) -> tuple[float, float]:
    """(forward ms, backward ms) of the profile's layer under `row` on `device` (a resolved section)."""
    m = profile.model
    h, heads = m["hidden"], int(m["heads"])
    par = row.parallel
    shape = LayerShape(m.get("microbatch_size", 1), m["seq_len"], h, heads, int(m.get("kv_heads", heads)),
                       m.get("ffn", 4 * h), bool(m.get("gated_mlp", False)), par["tp"], par["cp"], par["sp"],
                       par["flash_attention"], par["grad_accumulation_fusion"])
    dev = _device_model(device, _get(device, "peak_tflops", "device") * 1e12)
    default = device.get("cluster")
    cluster = parse_cluster(profile.cluster, default if isinstance(default, str) else None)
    placement = place(cluster, par["tp"], par["cp"], 1, 1, check=False)
    tp_link, cp_link = group_link(cluster, placement, "tp"), group_link(cluster, placement, "cp")
    times = layer_times(shape, dev)
    tp_e = tp_exposed(layer_comm.tp_layer(shape, tp_link, par["tp_backward_overlap"]), shape, times, par)
    cp_c = layer_comm.seconds(layer_comm.cp_layer(shape, cp_link))
    cp_e = {"F": max(0.0, cp_c["F"] - times.core_f), "B": max(0.0, cp_c["B"] - 2 * times.core_f)}
    forward = times.f + tp_e["F"] + cp_e["F"]
    backward = times.b + times.w + tp_e["B"] + tp_e["W"] + cp_e["B"]
    if row.recompute == "full":
        backward += forward
    elif row.recompute == "selective":
        backward += times.core_f
    return forward * 1e3, backward * 1e3
