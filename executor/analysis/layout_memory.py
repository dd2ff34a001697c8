"""What a profiled workload's static memory becomes under a run's layout.

`mpipe profile` measures each part's static memory whole (parameters, the
gradient, the optimizer's state after a step), as one unsharded replica holds
it.  A layout shards some of it, and the memory check compares a rank's
measured bytes with the prediction for *that* layout:

* ZeRO-1 (`distributed_optimizer`): the dp reduction's group (dp x cp ranks,
  `data_parallel.GradientSync`) shards the optimizer's state; parameters and
  the gradient stay whole (Megatron's distributed optimizer: the grad buffer
  is whole, the master weights and moments are sharded).  So each part keeps
  parameters + gradient + state / (dp x cp).  The trainable encoder's
  parameters ride in the same reduction unless `encoder_shard` takes them;
* `encoder_shard`: the tower's state over its N copies
  (`sharded_profile`);
* tensor parallelism (`tp_profile`): what the model's tp plan shards (the
  linears the plan splits column- or row-wise; `llm.tp_sharded`, measured by
  `mpipe profile`) is 1/tp on each rank, the rest (norms, the embedding, a
  row-wise linear's bias, a tower the plan leaves whole) is whole.

An analytic workload prices all of this from its own `parallel` section, so
its evaluation is used as it is.  Torch-free; `mpipe run`'s memory table uses
it (`compare-run` of a stored run does not yet: the run does not keep the
layout it executed).
"""
from __future__ import annotations

from typing import Any

from mpipe_core.runs.layout import ENCODER_SHARDS

PARTS = ("layer", "embed", "head")


def tp_profile(doc: dict, tp: int) -> dict:
    """`doc` (a profiled workload) as each of `tp` ranks holds it: the part of every static
    figure that the model's tp plan shards (`tp_sharded`, written by `mpipe profile`) divided
    by tp, the rest (norms, embedding, a row-wise linear's bias, an unsharded tower) whole.
    A profile without `tp_sharded` (older, or a model without a plan) is left whole.  The
    result has no `tp_sharded`: it is applied (at tp 1, nothing is divided)."""
    out = dict(doc)
    llm = dict(doc.get("llm") or {})
    share = llm.pop("tp_sharded", None)
    if isinstance(share, dict):
        for key, parts in share.items():
            if isinstance(llm.get(key), dict):
                llm[key] = {part: value - parts.get(part, 0.0) * (1 - 1 / tp) for part, value in llm[key].items()}
        out["llm"] = llm
    encoders = []
    for enc in doc.get("encoders", []):
        enc = dict(enc)
        share = enc.pop("tp_sharded", None)
        if isinstance(share, dict):
            for key, value in share.items():
                if enc.get(key) is not None:
                    enc[key] = enc[key] - value * (1 - 1 / tp)
        encoders.append(enc)
    out["encoders"] = encoders
    return out


def zero_profile(doc: dict, replicas: int, encoder_in_reduction: bool) -> dict:
    """`doc` (a profiled workload) with the optimizer state of the LLM's parts, and of a
    trainable encoder in the dp reduction, divided over `replicas` ZeRO-1 shards.  A part
    whose static memory the profile did not split (older profiles) is left whole."""
    if replicas <= 1:
        return doc
    out = dict(doc)
    llm = dict(doc.get("llm") or {})
    params, grads = llm.get("param_bytes"), llm.get("grad_bytes")
    if isinstance(params, dict) and isinstance(grads, dict) and isinstance(llm.get("static"), dict):
        static = dict(llm["static"])
        for part in PARTS:
            if part in static and part in params and part in grads:
                whole = params[part] + grads[part]
                static[part] = whole + (static[part] - whole) / replicas
        llm["static"] = static
        out["llm"] = llm
    if encoder_in_reduction:
        encoders = []
        for enc in doc.get("encoders", []):
            enc = dict(enc)
            if enc.get("trainable") and enc.get("grad_bytes") is not None and enc.get("replica_static") is not None:
                whole = enc["replica_static"] + enc["grad_bytes"]
                enc["static"] = whole + (enc["static"] - whole) / replicas
            encoders.append(enc)
        out["encoders"] = encoders
    return out


def sharded_profile(doc: dict, mode: str, replicas: int) -> dict:
    """A profiled workload (`mpipe profile`: bytes) with its trainable encoders' static
    memory as the executor keeps it under `encoder_shard=mode`, over `replicas` = dp x cp
    replicas of the pipeline: `static` the copy's whole part plus the sharded part / replicas,
    `sharded_static` that sharded part (the simulator divides it by the pipeline's k copies,
    `Encoder.static_of_copy`).  The encoder's `grad_bytes` (its trained gradient) splits the
    profiled `static` = parameters (`replica_static`) + gradient + optimizer state."""
    if mode == "none":
        return doc
    if mode not in ENCODER_SHARDS:
        raise ValueError(f"unknown encoder_shard {mode!r} (known: {', '.join(ENCODER_SHARDS)})")
    out = dict(doc)
    encoders = []
    for enc in doc.get("encoders", []):
        enc = dict(enc)
        if enc.get("trainable") and enc.get("grad_bytes") is not None and enc.get("replica_static") is not None:
            params, grads = enc["replica_static"], enc["grad_bytes"]
            state = enc["static"] - params - grads
            whole, sharded = (params + grads, state) if mode == "optimizer" else (params, grads + state)
            enc["static"] = whole + sharded / replicas
            enc["sharded_static"] = sharded / replicas
        encoders.append(enc)
    out["encoders"] = encoders
    return out


def profile_under_layout(doc: dict, layout: Any) -> dict:
    """A profiled workload's static memory as `layout` shards it (tp, ZeRO-1, `encoder_shard`):
    tp first (ZeRO-1 and `encoder_shard` shard what a tp rank holds)."""
    tp, zero = getattr(layout, "tp", 1), getattr(layout, "distributed_optimizer", False)
    replicas = layout.dp * layout.cp
    shard = getattr(layout, "encoder_shard", "none")
    if tp <= 1 and not (zero and replicas > 1) and shard == "none":
        return doc  # shards nothing
    # (tp's share applied even at tp 1, where it divides nothing: it describes the whole
    # figures that ZeRO-1 and encoder_shard change)
    doc = tp_profile(doc, tp)
    if zero:
        doc = zero_profile(doc, replicas, encoder_in_reduction=shard == "none")
    if shard != "none":
        doc = sharded_profile(doc, shard, replicas)
    return doc


def layout_metrics(evaluation: Any, layout: Any):
    """The evaluation's metrics with a profiled workload's static memory sharded as the run's
    `layout` shards it; the evaluation's own for an analytic workload or a layout that
    shards nothing."""
    source = getattr(evaluation.workload, "source", None)
    if not isinstance(source, dict) or "parallel" in source:
        return evaluation.metrics
    doc = profile_under_layout(source, layout)
    if doc is source:
        return evaluation.metrics
    from mpipe_core.api import evaluate_once
    from mpipe_core.workloads.workload import load_workload

    return evaluate_once(evaluation.term, load_workload(doc)).metrics
