"""A schedule's layer split as MindSpeed-MM's `layer_placement` (what its
auto-parallel search writes into `auto_parallel_search_optimal_config.json`):

    {"layer_placement": {"vit_layer_placement": [32, 0, ...],   # ViT layers per PP stage
                         "llm_layer_placement": [5, 11, ...]}}  # LLM layers per PP stage

One entry per pipeline stage, one stage per rank.  `balanced(...)` gives each
stage its folded encoder layers; a fused encoder (the generators' default)
holds all its layers on stage 0.  A term with several chunks per rank, more
than one encoder, or encoder work away from stage 0 is refused, and so is any
order but Megatron's 1F1B, which MindSpeed-MM runs with a layer_placement
(`stack_orders`).  A `recompute(...)` of the LLM comes back as a note with
Megatron's `--recompute-*` options (MindSpeed-MM takes them),
`encoder_batch(..., k)` as one with `--hetero-encoder-mbs-scale k`, and a note
gives the pipeline size and the microbatches per step.

`stage_layers` is the per-chunk split that MindSpeed-MM's model config
(`pipeline_num_layers`, `launch_config.mindspeed_mm`) also writes.
"""
from __future__ import annotations

import json
from typing import Any

from mpipe_core.formats.layer_split import Split, megatron_recompute, need_layers, refuse, split_of
from mpipe_core.formats.stack_orders import MINDSPEED_DEFAULT_WHY, MINDSPEED_WHY, require_order

FORMAT = "mindspeed-placement"


def stage_layers(split: Split, fmt: str) -> tuple[list[int], list[int], list[str]]:
    """(ViT layers per chunk, LLM layers per chunk, notes) in chunk order, refusing
    what MindSpeed-MM's model config cannot hold."""
    if len(split.encoder_layers) > 1:
        raise refuse(fmt, f"the encoders {', '.join(split.encoder_layers)}", "layer_placement holds one ViT")
    llm = need_layers(split, fmt)
    if split.encoder_recompute:
        raise refuse(fmt, "recompute of the folded encoder layers",
                     "the --recompute-* options recompute the LLM's layers only")
    notes = megatron_recompute(split, fmt)
    if split.encoder_batch > 1:
        notes.append(f"encoder_batch: pass --hetero-parallel --hetero-encoder-mbs-scale {split.encoder_batch}")
    if split.encoder is not None:
        vit = list(split.encoder)
    else:
        vit = [0] * split.chunks
        if split.fused_encoders:
            vit[0] = split.encoder_layers[split.fused_encoders[0]]
        elif split.encoder_layers:
            vit[0] = next(iter(split.encoder_layers.values()))
        else:
            notes.append("the workload has no encoder: vit_layer_placement is all zeros")
    return vit, llm, notes


def mindspeed_placement(ev: Any) -> tuple[str, list[str]]:
    split = split_of(ev, FORMAT)
    if split.chunks != split.devices:
        raise refuse(FORMAT, f"{split.generator}'s {split.chunks // split.devices} chunks per rank",
                     "layer_placement has one stage per rank")
    require_order(ev, split, FORMAT, ("1f1b",), MINDSPEED_WHY, MINDSPEED_DEFAULT_WHY)
    vit, llm, notes = stage_layers(split, FORMAT)
    m = ev.schedule.pipelines[0].microbatches
    notes.insert(0, f"pass it with PP={split.devices}; {m} microbatches per step: GBS = {m} x MBS x DP")
    doc = {"layer_placement": {"vit_layer_placement": vit, "llm_layer_placement": llm}}
    return json.dumps(doc) + "\n", notes
