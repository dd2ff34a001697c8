"""Combinators: schedule -> schedule.  One small function each, registered with
its signature so the term language knows them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mpipe_core.algebra.combinators import (
    backward,
    colocated,
    disaggregate,
    encoders,
    partition,
    per_batch,
    recompute,
    structure,
    transpose,
)
from mpipe_core.algebra.signature import Param

CHOICE = "choice"


@dataclass(frozen=True)
class CombinatorSpec:
    name: str
    function: Callable
    params: tuple[Param, ...]
    description: str


def _term(name: str = "term") -> Param:
    return Param(name, "term")


COMBINATORS: dict[str, CombinatorSpec] = {
    spec.name: spec
    for spec in (
        CombinatorSpec("split_bw", backward.split_bw, (_term(),),
                       "split every fused backward BW into B (input gradient) then W (weight gradient)"),
        CombinatorSpec("defer_w", backward.defer_w, (_term(),),
                       "move each W into later idle time on its device (zero-bubble style)"),
        CombinatorSpec("repeat", structure.repeat, (_term(), Param("n", "int", minimum=1)),
                       "n training steps, separated by the optimizer update"),
        CombinatorSpec("seq", structure.seq, (_term("first"), _term("second")),
                       "one step of the first schedule, then one of the second"),
        CombinatorSpec("par", structure.par, (_term("left"), _term("right")),
                       "two pipelines side by side on disjoint device groups"),
        CombinatorSpec("mirror", structure.mirror, (_term(),),
                       "the same schedule with device order reversed"),
        CombinatorSpec("overlay", structure.overlay, (_term("first"), _term("second")),
                       "two pipelines sharing the same devices (bidirectional, Chimera-like)"),
        CombinatorSpec("partition", partition.partition,
                       (_term(), Param("layers", "ints", minimum=1, help="LLM layers of each chunk, in chunk order")),
                       "give LLM chunk c exactly layers[c] layers (an uneven static split)"),
        CombinatorSpec("balanced", partition.balanced, (_term(),),
                       "fold the encoder layers into the chain and split it over the chunks to balance the "
                       "most loaded device (exact)"),
        CombinatorSpec(
            "recompute", recompute.recompute,
            (
                _term(),
                Param("mode", CHOICE, "full", choices=("full", "selective"),
                      help="full: keep each layer's input only; selective: recompute the attention core"),
                Param("chunks", "ints", None, minimum=0, nullable=True,
                      help="the chunks to recompute (default: every chunk)"),
                Param("layers", "ints", None, minimum=0, nullable=True,
                      help="recompute the first layers[c] layers of chunk c, one count per chunk"),
                Param("encoders", CHOICE, "no", choices=("no", "yes", "only"),
                      help="trained encoders running as ops of their own (transpose, colocated, disaggregate) "
                           "recompute too (yes) or alone (only)"),
            ),
            "recompute the forward of chunks' layers just before their backward (less activation "
            "memory, longer backward)",
        ),
        CombinatorSpec("per_batch", per_batch.per_batch, (_term(),),
                       "re-plan the term for each drawn batch from that batch's costs (mpipe eval --batches); "
                       "alone, the term's plan for the mean batch"),
        CombinatorSpec("encoder_stage", encoders.encoder_stage, (_term(),),
                       "give the encoders their own extra device ahead of the LLM stages"),
        CombinatorSpec("colocated", colocated.colocated, (_term(),),
                       "Megatron MIMO's colocated schedule: every device runs the encoder forward of its share, "
                       "barrier, the LLM schedule, barrier, the encoder backward of its share, all-reduce"),
        CombinatorSpec("encoder_batch", encoders.encoder_batch,
                       (_term(), Param("k", "int", minimum=1, help="microbatches per encoder op")),
                       "one encoder op per k consecutive microbatches, wherever the term puts the encoders "
                       "(its fixed launch cost paid once per group)"),
        CombinatorSpec("disaggregate", disaggregate.disaggregate,
                       (_term(), Param("encoder_devices", "int", minimum=1,
                                       help="extra devices that run only the encoders")),
                       "the encoders on devices of their own after the LLM's (data parallel), features over "
                       "the link"),
        CombinatorSpec(
            "transpose", transpose.transpose,
            (
                _term(),
                Param("mode", CHOICE, "prefix", choices=("prefix", "dynamic"),
                      help="prefix: the reference; dynamic: earliest-finish placement"),
                Param("overflow", CHOICE, "full", choices=("full", "min"),
                      help="microbatches beyond P: round-robin (full) or inline on stage 0 (min)"),
                Param("backward", CHOICE, "auto", choices=("auto", "recompute", "owner"),
                      help="trainable encoder backward: recompute on stage 0, or on the owner + all-reduce; "
                           "auto: dynamic keeps the faster of the two, prefix recomputes (the reference)"),
                Param("shards", "int", 1, minimum=1, help="dynamic: split one microbatch's encoder work"),
                Param("memory_cap", "float", None, minimum=0, nullable=True,
                      help="dynamic: per-device memory cap (static + activations)"),
                Param("encoders", "names", "all",
                      help="which encoders to transpose (others stay where the input put them)"),
            ),
            "replicate the encoder on every device and run its work in idle time (Mpipe)",
        ),
    )
}
