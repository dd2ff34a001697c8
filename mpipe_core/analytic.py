"""Per-op costs derived from model dimensions and a device profile.

Time unit: milliseconds.  Memory unit: GB (1e9 bytes).  Bandwidth: bytes/ms.
FLOPs per transformer layer and microbatch (b samples, s tokens, hidden h,
FFN width f, multiply-add = 2 FLOPs):

    forward = 8bsh^2 + 4bsh*f + 4bs^2h   (QKV+out projections, MLP, attention scores)
    input-gradient (B) = forward; weight-gradient (W) = 8bsh^2 + 4bsh*f (no weights in scores)

Activation memory per layer (16-bit, no recompute; Korthikanti et al. 2022):
s*b*h*(34 + 5*a*s/h) bytes.  The LM head's logits (2bshV) are spread over the
layers' cost so every chunk keeps layer-proportional costs.
"""
from __future__ import annotations

import math

from typing import Any, Mapping

from .errors import WorkloadError
from .presets import DEVICES, LLMS, VITS

GB = 1e9


def _get(doc: Mapping[str, Any], key: str, where: str, default: Any = None) -> Any:
    if key not in doc:
        if default is None:
            raise WorkloadError(f"{where}: missing required key '{key}'")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise WorkloadError(f"{where}.{key}: expected a positive finite number, got {value!r}")
    return value


def _resolve(doc: Any, table: Mapping[str, Mapping[str, Any]], where: str) -> Mapping[str, Any]:
    if isinstance(doc, str):
        if doc not in table:
            raise WorkloadError(f"{where}: unknown preset '{doc}' (known: {', '.join(sorted(table))})")
        return table[doc]
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: expected an object or a preset name")
    if "preset" in doc:
        base = dict(_resolve(doc["preset"], table, where))
        base.update({k: v for k, v in doc.items() if k != "preset"})
        return base
    return doc


def layer_flops(b: float, s: float, h: float, ffn: float) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) FLOPs of one transformer layer."""
    dense = 8 * b * s * h * h + 4 * b * s * h * ffn
    scores = 4 * b * s * s * h
    return dense + scores, dense + scores, dense


def analytic_to_explicit(doc: Mapping[str, Any]) -> dict[str, Any]:

    model = _resolve(doc.get("model"), LLMS, "model")
    device = _resolve(doc.get("device"), DEVICES, "device")
    h = _get(model, "hidden", "model")
    layers = int(_get(model, "layers", "model"))
    s = _get(model, "seq_len", "model")
    vocab = _get(model, "vocab", "model")
    heads = _get(model, "heads", "model", default=max(1, h // 128))
    ffn = _get(model, "ffn", "model", default=4 * h)
    mbs = _get(model, "microbatch_size", "model", default=1)
    flops_per_ms = _get(device, "peak_tflops", "device") * 1e12 * _get(device, "efficiency", "device", 0.5) / 1e3
    bpe = _get(device, "bytes_per_element", "device", 2)
    bandwidth = _get(device, "link_gbps", "device") * GB / 1e3  # bytes per ms
    latency = _get(device, "link_latency_us", "device", 10) / 1e3

    f, bi, w = layer_flops(mbs, s, h, ffn)
    head = 2 * mbs * s * h * vocab / layers  # logits spread over the layers
    activation = s * mbs * h * (34 + 5 * heads * s / h) / GB
    explicit: dict[str, Any] = {
        "name": doc.get("name", "analytic"),
        "llm": {
            "layers": layers,
            "f": (f + head) / flops_per_ms,
            "b": (bi + head) / flops_per_ms,
            "w": (w + head) / flops_per_ms,
            "activation": activation,
            "boundary_bytes": s * mbs * h * bpe,
        },
        "encoders": [],
        "link": {"latency": latency, "bandwidth": bandwidth},
        "units": {"time": "ms", "memory": "GB"},
    }
    for i, enc in enumerate(doc.get("encoders", []) or []):
        explicit["encoders"].append(_vit_encoder(enc, i, h, mbs, flops_per_ms, bpe))
    return explicit


def _vit_encoder(enc: Any, index: int, llm_hidden: float, mbs: float, flops_per_ms: float,
                 bpe: float) -> dict[str, Any]:

    where = f"encoders[{index}]"
    if not isinstance(enc, dict) or "vit" not in enc:
        # Already explicit: pass through untouched.
        return enc
    vit = _resolve(enc["vit"], VITS, f"{where}.vit")
    h = _get(vit, "hidden", f"{where}.vit")
    layers = _get(vit, "layers", f"{where}.vit")
    patches = _get(vit, "patches_per_image", f"{where}.vit")
    heads = _get(vit, "heads", f"{where}.vit", default=max(1, h // 64))
    ffn = _get(vit, "ffn", f"{where}.vit", default=4 * h)
    image_size = _get(vit, "image_size", f"{where}.vit", default=336)
    merge = _get(vit, "token_merge", f"{where}.vit", default=1)  # e.g. pixel shuffle 4 -> 1/4 tokens
    f, bi, w = layer_flops(mbs, patches, h, ffn)  # per image
    trainable = bool(enc.get("trainable", False))
    out = {
        "name": enc.get("name", "vision"),
        "f": layers * f / flops_per_ms,
        "b": layers * bi / flops_per_ms,
        "w": layers * w / flops_per_ms,
        "trainable": trainable,
        "output_bytes": mbs * patches / merge * llm_hidden * bpe,
        "input_bytes": mbs * 3 * image_size * image_size * bpe,
        "param_bytes": layers * (4 * h * h + 2 * h * ffn) * bpe,
        "activation": layers * patches * mbs * h * (34 + 5 * heads * patches / h) / GB,
        "layers": int(layers),
    }
    if "images" in enc:
        out["images"] = enc["images"]
    return out
