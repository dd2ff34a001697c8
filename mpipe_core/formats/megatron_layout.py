"""A schedule's layer split as Megatron-LM's `--pipeline-model-parallel-layout`.

The grammar (Megatron's `PipelineParallelLayerLayout.parse_str_to_list`):
stages are separated by `|` and listed in virtual-stage order (stage
`vpp_rank * P + pp_rank`, i.e. Mpipe's chunk order for a looped placement);
inside a stage `E` is the embedding, `t` a transformer (decoder) layer, `m` an
MTP layer, `L` the loss (the output layer); `x*n` repeats `x` n times,
`(...)*n` repeats a group, commas are cosmetic.  E.g. `Et*3|(tt|)*29,m|L`.

What Mpipe writes: stage 0 starts with `E`, the last stage ends with `,L`;
each stage's decoder layers as `t` (one) or `t*k`; a run of n >= 2 equal
middle stages as `(t*k|)*n` followed by a comma.  Megatron's flexible layout
has no encoder layers (it refuses them), and places chunks looped, so a term
with encoder ops or folded encoder layers, or a V placement, is refused.  The
layout carries the split; Megatron runs its own 1F1B / interleaved order, so
any other order is refused too (`stack_orders`), and the notes say the rest
of what to pass for the order Mpipe simulated: the pipeline size, the
microbatch group of an interleaved order and the microbatches per step.
A `recompute(...)` comes back as a note with Megatron's `--recompute-*`
options, or is refused where they cannot say it (different layers per chunk).
"""
from __future__ import annotations

from typing import Any

from mpipe_core.formats.layer_split import LOOP, megatron_recompute, need_layers, refuse, split_of
from mpipe_core.formats.stack_orders import MEGATRON_ORDERS, MEGATRON_WHY, microbatch_group, require_order

FORMAT = "megatron-layout"


def _stage(k: int) -> str:
    return "" if k == 0 else ("t" if k == 1 else f"t*{k}")


def layout_string(layers: list[int]) -> str:
    """The layout of LLM chunks holding `layers[c]` decoder layers each."""
    if len(layers) == 1:
        return "E" + _stage(layers[0]) + ",L"
    text = "E" + _stage(layers[0]) + "|"
    middle, i = layers[1:-1], 0
    while i < len(middle):
        j = i
        while j < len(middle) and middle[j] == middle[i]:
            j += 1
        text += f"({_stage(middle[i])}|)*{j - i}," if j - i >= 2 else _stage(middle[i]) + "|"
        i = j
    last = _stage(layers[-1])
    return text + (last + ",L" if last else "L")


def megatron_layout(ev: Any) -> tuple[str, list[str]]:
    split = split_of(ev, FORMAT)
    if split.fused_encoders or split.encoder is not None:
        names = split.fused_encoders or list(split.encoder_layers)
        raise refuse(FORMAT, f"the {', '.join(names)} encoder",
                     "Megatron's flexible layout has no encoder layers (it refuses them)")
    if split.placement != LOOP:
        raise refuse(FORMAT, f"{split.generator}'s V placement", "Megatron places chunk c on rank c mod P")
    require_order(ev, split, FORMAT, MEGATRON_ORDERS, MEGATRON_WHY)
    layers = need_layers(split, FORMAT)
    recompute = megatron_recompute(split, FORMAT)
    p, v, m = split.devices, split.chunks // split.devices, ev.schedule.pipelines[0].microbatches
    vpp = (f" and {v} virtual stages per rank (--microbatch-group-size-per-virtual-pipeline-stage "
           f"{microbatch_group(ev, split, FORMAT)})" if v > 1 else "")
    notes = [f"pass it with --pipeline-model-parallel-size {p}{vpp}; {m} microbatches per step: "
             f"--global-batch-size {m} x --micro-batch-size x the data-parallel size"]
    return layout_string(layers) + "\n", notes + recompute


def parse_layout(text: str) -> list[list[str]]:
    """The stages of a layout string, each a list of layer letters (Megatron's own
    unrolling, written again here so tests can read back what we print)."""
    import re

    text = text.strip().replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    return [list(stage) for stage in text.split("|")]
