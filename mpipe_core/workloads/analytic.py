"""Per-op costs and memory derived from model dimensions and a device profile.

Time unit: milliseconds.  Memory unit: GB (1e9 bytes).  Bandwidth: bytes/ms.
FLOPs per transformer layer, the LM head and the embedding: `transformer_cost`
(SwiGLU's three matrices, grouped-query attention, the attention core's
backward at twice its forward); the head's logits and loss sit on the last
chunk (`llm.head`), the embedding on the first (`llm.embed`), as their static
memory does.

The `parallel` section (`tp`, `sp`, `cp`, `flash_attention`, `dp`,
`distributed_optimizer`, `overlap_grad_reduce`, `tp_comm_overlap`,
`tp_backward_overlap`, ...) says how
each pipeline stage is sharded.  Without a `cluster`, a device of a tp x cp
group does 1/(t c) of its layers' FLOPs at the device's one `efficiency`
(no communication priced).  With a `cluster` (`workloads/cluster.py`), an
op's time is the roofline of its GEMMs after the split
(`transformer_cost.layer_times`) plus the layer's tensor- and
context-parallel communication on the link its group sits on (`layer_comm`;
the backward's tp collectives behind their partner GEMMs unless
`tp_backward_overlap` is off, all of tp behind compute with `tp_comm_overlap`); the pipeline's
sends, the data-parallel gradient sync and the optimizer step are priced
where the schedule puts them (`simulation/step_figures.py`).  Memory per
layer (activations per recompute mode, static bytes per parameter) comes
from `memory_model`, which states each formula and its source.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.fields import shown
from mpipe_core.workloads.memory_model import (
    activation_bytes,
    bytes_per_parameter,
    ENCODER_SHARDING,
    embedding_parameters,
    encoder_bytes_per_parameter,
    encoder_tensor_parallel,
    layer_parameters,
)
from mpipe_core.workloads.presets import DEVICES, LLMS, VITS
from mpipe_core.workloads import layer_comm
from mpipe_core.workloads.cluster import group_link, parse_cluster, place
from mpipe_core.workloads.collectives import all_gather
from mpipe_core.workloads.step_model import EncoderStep, StepModel, check_sequence
from mpipe_core.workloads.transformer_cost import (DeviceModel, LayerShape, attention_core_flops, embedding_times,
                                                   head_flops, head_times, layer_flops, layer_times)

GB = 1e9


def _get(doc: Mapping[str, Any], key: str, where: str, default: Any = None) -> Any:
    if key not in doc:
        if default is None:
            raise WorkloadError(f"{where}: missing required key '{key}'")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise WorkloadError(f"{where}.{key}: expected a positive finite number, got {shown(value)}")
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


ANALYTIC_KEYS = {"model", "device", "encoders", "name", "description", "parallel", "cluster", "data"}
PARALLEL_DEFAULTS = {"tp": 1, "sp": False, "cp": 1, "flash_attention": True, "dp": 1, "distributed_optimizer": False,
                     "overlap_grad_reduce": False, "tp_comm_overlap": False,
                     # Megatron-LM since 2022: the backward tp collectives run behind their partner
                     # GEMM (layer_comm); 2021's waited for each backward all-reduce.
                     "tp_backward_overlap": True,
                     # the weight gradient accumulated into fp32 by its GEMM (2022 on; 2021: a hook adds it)
                     "grad_accumulation_fusion": True,
                     # Megatron-LM today; Megatron-LM 2021 (fp16 runs) reduced 16-bit gradients and
                     # exchanged pipeline tensors synchronously (docs/cluster.md).
                     "grad_reduce_fp32": True, "p2p_overlap": True,
                     # A replicated trained encoder's state sharded over its copies (memory_model).
                     "encoder_shard": "none"}
PARALLEL_KEYS = set(PARALLEL_DEFAULTS)
MAX_DEGREE = 1_000_000


def _flag(doc: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise WorkloadError(f"{where}.{key}: expected true or false, got {shown(value)}")
    return value


def _degree(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
        raise WorkloadError(f"{where}: expected an integer from 1 to {MAX_DEGREE}, got {shown(value)}")
    return value


def parallel_section(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The document's `parallel` section, checked, with its defaults filled in."""
    section = doc.get("parallel", {})
    if not isinstance(section, dict):
        raise WorkloadError('parallel: expected {"tp": ..., "sp": ..., "cp": ..., "flash_attention": ..., '
                            '"dp": ..., "distributed_optimizer": ..., "overlap_grad_reduce": ..., '
                            '"tp_comm_overlap": ..., "tp_backward_overlap": ..., "grad_accumulation_fusion": ..., '
                            '"grad_reduce_fp32": ..., "p2p_overlap": ..., '
                            '"encoder_shard": ...}')
    unknown = sorted(set(section) - PARALLEL_KEYS)
    if unknown:
        raise WorkloadError(f"parallel: unknown key '{unknown[0]}' (known: {', '.join(sorted(PARALLEL_KEYS))})")
    out = {}
    for key, default in PARALLEL_DEFAULTS.items():
        if isinstance(default, bool):
            out[key] = _flag(section, key, "parallel", default)
        elif isinstance(default, str):
            value = section.get(key, default)
            if value not in ENCODER_SHARDING:
                raise WorkloadError(f"parallel.{key}: expected one of {', '.join(ENCODER_SHARDING)}, "
                                    f"got {shown(value)}")
            out[key] = value
        else:
            out[key] = _degree(section.get(key, default), f"parallel.{key}")
    return out


def analytic_to_explicit(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The explicit-cost form of an analytic document."""
    return analytic_workload(doc)[0]


def _device_model(device: Mapping[str, Any], peak: float) -> DeviceModel:
    tile = device.get("tile", [256, 128])
    if (not isinstance(tile, (list, tuple)) or len(tile) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in tile)):
        raise WorkloadError(f"device.tile: expected [rows, columns] of the GEMM output tile, got {tile!r}")
    fractions = {}
    for key, default in (("hbm_efficiency", 0.9), ("gemm_efficiency", None), ("flash_efficiency", 0.5),
                         ("memory_efficiency", None), ("attention_efficiency", None)):
        fallback = {"memory_efficiency": device.get("hbm_efficiency", 0.9),
                    "attention_efficiency": device.get("gemm_efficiency", device.get("efficiency", 0.5))}
        value = device.get(key, default if default is not None else fallback.get(key, device.get("efficiency", 0.5)))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise WorkloadError(f"device.{key}: expected a fraction in (0, 1], got {value!r}")
        fractions[key] = float(value)
    units = device.get("compute_units", 1)
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        raise WorkloadError(f"device.compute_units: expected a positive integer, got {units!r}")
    hbm = _get(device, "hbm_TBps", "device") * 1e12
    return DeviceModel(peak_flops=peak, hbm_bytes_per_s=hbm * fractions["hbm_efficiency"],
                       gemm_max_efficiency=fractions["gemm_efficiency"], compute_units=units, tile=(tile[0], tile[1]),
                       flash_efficiency=fractions["flash_efficiency"],
                       memory_bytes_per_s=hbm * fractions["memory_efficiency"],
                       attention_efficiency=fractions["attention_efficiency"])


def _exposed(comm: dict[str, float], compute: dict[str, float], overlap: bool) -> dict[str, float]:
    """Communication time that adds to each kind: all of it, or (overlapped) what outlasts the compute."""
    return {k: max(0.0, comm[k] - compute[k]) if overlap else comm[k] for k in comm}


def tp_exposed(tp_c: dict[str, tuple], shape: LayerShape, times, par: Mapping[str, Any]) -> dict[str, float]:
    """A layer's tensor-parallel seconds that add to each kind: with `tp_comm_overlap`
    what outlasts the kind's compute; else each collective beyond its partner GEMM
    (`layer_comm.tp_partners`; all of it without `tp_backward_overlap`)."""
    if par["tp_comm_overlap"]:
        return _exposed(layer_comm.seconds(tp_c), {"F": times.f, "B": times.b, "W": times.w}, True)
    partners = layer_comm.tp_partners(shape, times, par["tp_backward_overlap"])
    return {k: layer_comm.exposed_seconds(tp_c[k], partners[k]) for k in "FBW"}


def analytic_workload(doc: Mapping[str, Any]) -> tuple[dict[str, Any], StepModel]:
    """(the explicit-cost form, the step model) of an analytic document."""
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
    tied = _flag(model, "tied_embeddings", "model", False)
    mbs = _get(model, "microbatch_size", "model", default=1)
    peak = _get(device, "peak_tflops", "device") * 1e12
    efficiency = _get(device, "efficiency", "device", 0.5)
    flops_per_ms = peak * efficiency / 1e3
    bpe = _get(device, "bytes_per_element", "device", 2)
    bandwidth = _get(device, "link_gbps", "device") * GB / 1e3  # bytes per ms
    latency = _get(device, "link_latency_us", "device", 10) / 1e3
    t, sp, flash, cp, dp = par["tp"], par["sp"], par["flash_attention"], par["cp"], par["dp"]
    if heads % t:
        raise WorkloadError(f"parallel.tp: {t} does not divide the model's {heads:g} attention heads")
    if kv_heads % t:  # Megatron splits the key/value heads over the tp ranks too
        raise WorkloadError(f"parallel.tp: {t} does not divide the model's {kv_heads:g} key/value heads (kv_heads)")
    check_sequence(s, cp)
    cluster = None
    if "cluster" in doc:
        default = device.get("cluster")
        cluster = parse_cluster(doc["cluster"], default if isinstance(default, str) else None)

    shape = LayerShape(mbs, s, h, int(heads), int(kv_heads), ffn, gated, t, cp, sp, flash,
                       par["grad_accumulation_fusion"])
    fl = layer_flops(shape)
    core = attention_core_flops(shape)
    head_fl = head_flops(mbs, s / cp, h, vocab)
    notes: tuple[str, ...] = ()
    collectives: tuple = ()
    head_collectives: tuple = ()
    embed_collectives: tuple = ()
    zeros = {"F": 0.0, "B": 0.0, "W": 0.0}
    tp_e, cp_e, tp_head_e, tp_embed_e = zeros, zeros, zeros, zeros
    tp_link = None
    if cluster is None:
        per_device = t * cp * flops_per_ms  # a stage's FLOPs are shared by its t x c devices
        f, bi, w = (x / per_device for x in fl)
        head = {k: x / per_device for k, x in zip("FBW", head_fl)}
        embed: dict[str, float] = {}
        selective_f = core / per_device
        dev = None
    else:
        dev = _device_model(device, peak)
        placement = place(cluster, t, cp, dp, 1, check=False)
        tp_link, cp_link = group_link(cluster, placement, "tp"), group_link(cluster, placement, "cp")
        notes = placement.notes
        times = layer_times(shape, dev)
        compute = {"F": times.f, "B": times.b, "W": times.w}
        tp_c = layer_comm.tp_layer(shape, tp_link, par["tp_backward_overlap"])
        cp_c = layer_comm.cp_layer(shape, cp_link)
        collectives = tuple((kind, c) for kind in "FBW" for c in tp_c[kind] + cp_c[kind])
        tp_e = tp_exposed(tp_c, shape, times, par)
        # ring attention overlaps the K/V exchange with the attention core
        cp_e = _exposed(layer_comm.seconds(cp_c), {"F": times.core_f, "B": 2 * times.core_f, "W": 0.0}, True)
        f, bi, w = ((compute[k] + tp_e[k] + cp_e[k]) * 1e3 for k in "FBW")
        hf, hb, hw = head_times(mbs, s, h, vocab, t, cp, sp, dev, par["grad_accumulation_fusion"])
        head_c, embed_c = layer_comm.tp_head(shape, tp_link), layer_comm.tp_embedding(shape, tp_link)
        head_collectives = tuple((kind, c) for kind in "FBW" for c in head_c[kind])
        embed_collectives = tuple((kind, c) for kind in "FBW" for c in embed_c[kind])
        tp_head_e, tp_embed_e = layer_comm.seconds(head_c), layer_comm.seconds(embed_c)
        head = {"F": (hf + tp_head_e["F"]) * 1e3, "B": (hb + tp_head_e["B"]) * 1e3, "W": hw * 1e3}
        ef, ew = embedding_times(mbs, s, h, t, cp, sp, dev)
        embed = {"F": (ef + tp_embed_e["F"]) * 1e3, "W": ew * 1e3}
        selective_f = times.core_f * 1e3

    def act(mode: str) -> float:
        return activation_bytes(s / cp, mbs, h, heads, t, sp, flash, mode) / GB

    per_param = bytes_per_parameter(True, dp * cp, par["distributed_optimizer"])
    layer_params = layer_parameters(h, ffn, heads, kv_heads, gated) / t
    vocab_params = embedding_parameters(vocab, h) / t
    # Each tp rank sends 1/t of the hidden state between stages: split by sequence
    # parallelism, or (with a cluster) Megatron's scatter/gather optimization.
    split = t if (sp or cluster is not None) else 1
    boundary = s / cp * mbs * h * bpe
    gather = all_gather(t, boundary, tp_link) if cluster is not None and not sp and t > 1 else None
    gather_s = gather.seconds if gather is not None else 0.0
    llm: dict[str, Any] = {
        "layers": layers,
        "f": f,
        "b": bi,
        "w": w,
        "head": head,
        "activation": act("none"),
        "recompute": {"selective": {"activation": act("selective"), "f": selective_f},
                      "full": {"activation": act("full"), "f": f}},
        "static": {"layer": layer_params * per_param / GB, "embed": vocab_params * per_param / GB,
                   "head": vocab_params * per_param / GB},
        "boundary_bytes": boundary / split,
    }
    if embed:
        llm["embed"] = embed
    explicit: dict[str, Any] = {
        "name": doc.get("name", "analytic"),
        "llm": llm,
        "encoders": [],
        "link": {"latency": latency, "bandwidth": bandwidth},
        "units": {"time": "ms", "memory": "GB"},
    }
    if "memory" in device:  # checked by the explicit form's parser
        explicit["device"] = {"memory": device["memory"]}
    encoders = doc.get("encoders", []) or []
    if not isinstance(encoders, list):
        raise WorkloadError("encoders: expected a list")
    encoder_steps = []
    for i, enc in enumerate(encoders):
        out, step = _vit_encoder(enc, i, h, mbs, flops_per_ms, bpe, par, dev, tp_link)
        explicit["encoders"].append(out)
        if step is not None:
            encoder_steps.append(step)
    hbm = device.get("hbm_TBps")
    step = StepModel(
        tp=t, cp=cp, dp=dp, sp=sp, distributed_optimizer=par["distributed_optimizer"],
        overlap_grad_reduce=par["overlap_grad_reduce"], tp_comm_overlap=par["tp_comm_overlap"],
        grad_bytes=4.0 if par["grad_reduce_fp32"] else 2.0, p2p_overlap=par["p2p_overlap"],
        boundary_gather_s=gather_s, boundary_gather=gather,
        boundary_gather_link=tp_link if gather is not None else None,
        peak_flops=peak,
        hbm_bytes_per_s=(dev.memory_bytes_per_s if dev is not None else
                         _get(device, "hbm_TBps", "device") * 1e12 * 0.9 if hbm is not None else 0.0),
        seconds_per_unit=1e-3, microbatch_size=mbs, seq_len=s, layer_flops=fl, core_flops=core,
        head_flops=head_flops(mbs, s, h, vocab), layer_params=layer_params, embed_params=vocab_params,
        head_params=vocab_params, encoders=tuple(encoder_steps),
        tp_layer=tuple(tp_e[k] for k in "FBW"), cp_layer=tuple(cp_e[k] for k in "FBW"),
        tp_embed=tuple(tp_embed_e[k] for k in "FBW"), tp_head=tuple(tp_head_e[k] for k in "FBW"),
        layer_collectives=collectives, embed_collectives=embed_collectives, head_collectives=head_collectives,
        cluster=cluster, notes=notes, tied_embeddings=tied)
    return explicit, step


def _vit_encoder(enc: Any, index: int, llm_hidden: float, mbs: float, flops_per_ms: float,
                 bpe: float, par: Mapping[str, Any], dev: DeviceModel | None,
                 tp_link: Any) -> tuple[dict[str, Any], EncoderStep | None]:

    where = f"encoders[{index}]"
    if not isinstance(enc, dict) or "vit" not in enc:
        # Already explicit: pass through untouched.
        return enc, None
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
    shape = LayerShape(mbs, patches, h, int(heads), int(heads), ffn, False, et, 1, par["sp"],
                       par["flash_attention"], par["grad_accumulation_fusion"])
    fl = layer_flops(shape)  # per image
    if dev is None:
        per_device = et * flops_per_ms
        f, bi, w = (layers * x / per_device for x in fl)
        selective = layers * attention_core_flops(shape) / per_device
    else:
        times = layer_times(shape, dev)
        comm = tp_exposed(layer_comm.tp_layer(shape, tp_link, par["tp_backward_overlap"]), shape, times, par)
        f, bi, w = (layers * (x + comm[k]) * 1e3 for x, k in zip((times.f, times.b, times.w), "FBW"))
        selective = layers * times.core_f * 1e3

    def act(mode: str) -> float:
        return layers * activation_bytes(patches, mbs, h, heads, et, par["sp"], par["flash_attention"], mode) / GB

    trainable = bool(enc.get("trainable", False))
    params = layers * layer_parameters(h, ffn, int(heads)) / et  # per device of its group
    whole, sharded = encoder_bytes_per_parameter(trainable, par["dp"] * par["cp"], par["distributed_optimizer"],
                                                 par["encoder_shard"])
    out = {
        "name": enc.get("name", "vision"),
        "f": f,
        "b": bi,
        "w": w,
        "trainable": trainable,
        "output_bytes": mbs * patches / merge * llm_hidden * bpe,
        "input_bytes": mbs * 3 * image_size * image_size * bpe,
        "param_bytes": params * bpe,
        "grad_bytes": params * 4,  # fp32 gradients are what the replicas all-reduce
        "activation": act("none"),
        "recompute": {"selective": {"activation": act("selective"), "f": selective},
                      "full": {"activation": act("full"), "f": f}},
        "static": params * (whole + sharded) / GB,
        "replica_static": params * bytes_per_parameter(False) / GB,
        "layers": int(layers),
    }
    if sharded:
        out["sharded_static"] = params * sharded / GB
    if "images" in enc:
        out["images"] = enc["images"]
    step = EncoderStep(out["name"], tuple(layers * x for x in fl), trainable, params, int(layers),
                       sharded=bool(sharded))
    return out, step


def sequence_fractions(doc: Mapping[str, Any]) -> tuple[float, dict[str, tuple[float, float]]]:
    """(the model's sequence length s, per kind the (linear, quadratic) shares of
    one layer's FLOPs at s, `transformer_cost.layer_flops`): at n tokens a layer
    of kind k costs its time at s times lin * (n / s) + quad * (n / s)^2 (the
    dense GEMMs grow with n, the attention core with n^2; W has no core).  With
    a cluster (the roofline) this is the FLOPs' scaling, not the roofline's."""
    model = _resolve(doc.get("model"), LLMS, "model")
    h, s = _get(model, "hidden", "model"), _get(model, "seq_len", "model")
    heads = _get(model, "heads", "model", default=max(1, h // 128))
    kv_heads = _get(model, "kv_heads", "model", default=heads)
    shape = LayerShape(_get(model, "microbatch_size", "model", default=1), s, h, int(heads), int(kv_heads),
                       _get(model, "ffn", "model", default=4 * h), _flag(model, "gated_mlp", "model", False))
    core = attention_core_flops(shape)
    out = {}
    for kind, total, quad in zip("FBW", layer_flops(shape), (core, 2 * core, 0.0)):
        out[kind] = (1.0 - quad / total, quad / total)
    return float(s), out
