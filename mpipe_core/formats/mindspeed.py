"""A schedule's layer split as MindSpeed-MM's `layer_placement` (what its
auto-parallel search writes into `auto_parallel_search_optimal_config.json`):

    {"layer_placement": {"vit_layer_placement": [32, 0, ...],   # ViT layers per PP stage
                         "llm_layer_placement": [5, 11, ...]}}  # LLM layers per PP stage

One entry per pipeline stage, one stage per rank.  `balanced(...)` gives each
stage its folded encoder layers; a fused encoder (the generators' default)
holds all its layers on stage 0.  A term with several chunks per rank, more
than one encoder, or encoder work away from stage 0 is refused.  A
`recompute(...)` of the LLM comes back as a note with Megatron's
`--recompute-*` options (MindSpeed-MM takes them), `encoder_batch(..., k)` as
one with `--hetero-encoder-mbs-scale k`.
"""
from __future__ import annotations

import json
from typing import Any

from mpipe_core.formats.layer_split import megatron_recompute, need_layers, refuse, split_of

FORMAT = "mindspeed-placement"


def mindspeed_placement(ev: Any) -> tuple[str, list[str]]:
    split = split_of(ev, FORMAT)
    if split.chunks != split.devices:
        raise refuse(FORMAT, f"{split.generator}'s {split.chunks // split.devices} chunks per rank",
                     "layer_placement has one stage per rank")
    if len(split.encoder_layers) > 1:
        raise refuse(FORMAT, f"the encoders {', '.join(split.encoder_layers)}",
                     "layer_placement holds one ViT")
    llm = need_layers(split, FORMAT)
    if split.encoder_recompute:
        raise refuse(FORMAT, "recompute of the folded encoder layers",
                     "the --recompute-* options recompute the LLM's layers only")
    notes = megatron_recompute(split, FORMAT)
    if split.encoder_batch > 1:
        notes.append(f"encoder_batch: pass --hetero-parallel --hetero-encoder-mbs-scale {split.encoder_batch}")
    if split.encoder is not None:
        vit = list(split.encoder)
    else:
        vit = [0] * split.devices
        if split.fused_encoders:
            vit[0] = split.encoder_layers[split.fused_encoders[0]]
        elif split.encoder_layers:
            vit[0] = next(iter(split.encoder_layers.values()))
        else:
            notes.append("the workload has no encoder: vit_layer_placement is all zeros")
    doc = {"layer_placement": {"vit_layer_placement": vit, "llm_layer_placement": llm}}
    return json.dumps(doc) + "\n", notes
