"""Per-op costs and memory derived from model dimensions and a device profile.

Time unit: milliseconds.  Memory unit: GB (1e9 bytes).  Bandwidth: bytes/ms.
FLOPs per transformer layer and microbatch (b samples, s tokens, hidden h,
FFN width f, multiply-add = 2 FLOPs):

    forward = 8bsh^2 + 4bsh*f + 4bs^2h   (QKV+out projections, MLP, attention scores)
    input-gradient (B) = forward; weight-gradient (W) = 8bsh^2 + 4bsh*f (no weights in scores)

The LM head's logits (2bshV) are spread over the layers' cost so every chunk
keeps layer-proportional costs.

The `parallel` section (`tp`, `sp`, `flash_attention`, `dp`,
`distributed_optimizer`) says how each pipeline stage is sharded.  With
tensor parallelism of degree t every device of a stage does 1/t of its
layers' FLOPs (the collectives inside a stage are not modelled); with sequence
parallelism the hidden state between stages is split t ways too.  Memory per
layer (activations per recompute mode, static bytes per parameter) comes from
`memory_model`, which states each formula and its source.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.memory_model import (
    activation_bytes,
    bytes_per_parameter,
    embedding_parameters,
    encoder_tensor_parallel,
    layer_parameters,
)
from mpipe_core.workloads.presets import DEVICES, LLMS, VITS

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


ANALYTIC_KEYS = {"model", "device", "encoders", "name", "description", "parallel"}
PARALLEL_KEYS = {"tp", "sp", "flash_attention", "dp", "distributed_optimizer"}
PARALLEL_DEFAULTS = {"tp": 1, "sp": False, "flash_attention": True, "dp": 1, "distributed_optimizer": False}
MAX_DEGREE = 1_000_000


def _flag(doc: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise WorkloadError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _degree(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
        raise WorkloadError(f"{where}: expected an integer from 1 to {MAX_DEGREE}, got {value!r}")
    return value


def parallel_section(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The document's `parallel` section, checked, with its defaults filled in."""
    section = doc.get("parallel", {})
    if not isinstance(section, dict):
        raise WorkloadError('parallel: expected {"tp": ..., "sp": ..., "flash_attention": ..., "dp": ..., '
                            '"distributed_optimizer": ...}')
    unknown = sorted(set(section) - PARALLEL_KEYS)
    if unknown:
        raise WorkloadError(f"parallel: unknown key '{unknown[0]}' (known: {', '.join(sorted(PARALLEL_KEYS))})")
    out = {}
    for key, default in PARALLEL_DEFAULTS.items():
        if isinstance(default, bool):
            out[key] = _flag(section, key, "parallel", default)
        else:
            out[key] = _degree(section.get(key, default), f"parallel.{key}")
    return out


def analytic_to_explicit(doc: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(doc) - ANALYTIC_KEYS)
    if unknown:
        raise WorkloadError(f"workload: unknown key '{unknown[0]}' in the analytic form "
                            f"(known: {', '.join(sorted(ANALYTIC_KEYS))})")
    model = _resolve(doc.get("model"), LLMS, "model")
    device = _resolve(doc.get("device"), DEVICES, "device")
    par = parallel_section(doc)
    h = _get(model, "hidden", "model")
    layers = int(_get(model, "layers", "model"))
    s = _get(model, "seq_len", "model")
    vocab = _get(model, "vocab", "model")
    heads = _get(model, "heads", "model", default=max(1, h // 128))
    kv_heads = _get(model, "kv_heads", "model", default=heads)
    ffn = _get(model, "ffn", "model", default=4 * h)
    gated = _flag(model, "gated_mlp", "model", False)
    mbs = _get(model, "microbatch_size", "model", default=1)
    flops_per_ms = _get(device, "peak_tflops", "device") * 1e12 * _get(device, "efficiency", "device", 0.5) / 1e3
    bpe = _get(device, "bytes_per_element", "device", 2)
    bandwidth = _get(device, "link_gbps", "device") * GB / 1e3  # bytes per ms
    latency = _get(device, "link_latency_us", "device", 10) / 1e3
    t, sp, flash = par["tp"], par["sp"], par["flash_attention"]
    if heads % t:
        raise WorkloadError(f"parallel.tp: {t} does not divide the model's {heads:g} attention heads")
    if kv_heads % t:  # Megatron splits the key/value heads over the tp ranks too
        raise WorkloadError(f"parallel.tp: {t} does not divide the model's {kv_heads:g} key/value heads (kv_heads)")

    f, bi, w = layer_flops(mbs, s, h, ffn)
    head = 2 * mbs * s * h * vocab / layers  # logits spread over the layers
    per_device = t * flops_per_ms  # a stage's FLOPs are shared by its t devices
    scores = 4 * mbs * s * s * h  # the attention core: what selective recompute redoes

    def act(mode: str) -> float:
        return activation_bytes(s, mbs, h, heads, t, sp, flash, mode) / GB

    per_param = bytes_per_parameter(True, par["dp"], par["distributed_optimizer"])
    layer_static = layer_parameters(h, ffn, heads, kv_heads, gated) / t * per_param / GB
    vocab_static = embedding_parameters(vocab, h) / t * per_param / GB
    explicit: dict[str, Any] = {
        "name": doc.get("name", "analytic"),
        "llm": {
            "layers": layers,
            "f": (f + head) / per_device,
            "b": (bi + head) / per_device,
            "w": (w + head) / per_device,
            "activation": act("none"),
            "recompute": {"selective": {"activation": act("selective"), "f": scores / per_device},
                          "full": {"activation": act("full"), "f": f / per_device}},
            "static": {"layer": layer_static, "embed": vocab_static, "head": vocab_static},
            "boundary_bytes": s * mbs * h * bpe / (t if sp else 1),
        },
        "encoders": [],
        "link": {"latency": latency, "bandwidth": bandwidth},
        "units": {"time": "ms", "memory": "GB"},
    }
    if "memory" in device:  # checked by the explicit form's parser
        explicit["device"] = {"memory": device["memory"]}
    encoders = doc.get("encoders", []) or []
    if not isinstance(encoders, list):
        raise WorkloadError("encoders: expected a list")
    for i, enc in enumerate(encoders):
        explicit["encoders"].append(_vit_encoder(enc, i, h, mbs, flops_per_ms, bpe, par))
    return explicit


def _vit_encoder(enc: Any, index: int, llm_hidden: float, mbs: float, flops_per_ms: float,
                 bpe: float, par: Mapping[str, Any]) -> dict[str, Any]:

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
    t = par["tp"]
    override = enc.get("tp")
    if override is not None:
        override = _degree(override, f"{where}.tp")
        if heads % override:
            raise WorkloadError(f"{where}.tp: {override} does not divide the encoder's {heads:g} attention heads")
        if t % override:
            raise WorkloadError(f"{where}.tp: {override} does not divide parallel.tp ({t})")
    et = encoder_tensor_parallel(t, int(heads), override)
    f, bi, w = layer_flops(mbs, patches, h, ffn)  # per image
    per_device = et * flops_per_ms
    scores = 4 * mbs * patches * patches * h  # the attention core (selective recompute)

    def act(mode: str) -> float:
        return layers * activation_bytes(patches, mbs, h, heads, et, par["sp"], par["flash_attention"], mode) / GB

    trainable = bool(enc.get("trainable", False))
    params = layers * layer_parameters(h, ffn, int(heads)) / et  # per device of its group
    per_param = bytes_per_parameter(trainable, par["dp"], par["distributed_optimizer"])
    out = {
        "name": enc.get("name", "vision"),
        "f": layers * f / per_device,
        "b": layers * bi / per_device,
        "w": layers * w / per_device,
        "trainable": trainable,
        "output_bytes": mbs * patches / merge * llm_hidden * bpe,
        "input_bytes": mbs * 3 * image_size * image_size * bpe,
        "param_bytes": params * bpe,
        "activation": act("none"),
        "recompute": {"selective": {"activation": act("selective"), "f": layers * scores / per_device},
                      "full": {"activation": act("full"), "f": layers * f / per_device}},
        "static": params * per_param / GB,
        "replica_static": params * bytes_per_parameter(False) / GB,
        "layers": int(layers),
    }
    if "images" in enc:
        out["images"] = enc["images"]
    return out
