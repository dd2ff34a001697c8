"""The communication inside one transformer layer, per microbatch and device.

Tensor parallelism (Megatron's column- then row-parallel linears, twice per
layer: attention and MLP): forward two all-reduces of the layer's activation
(b * s/c tokens x h, 16-bit), backward two more (the input gradients); with
sequence parallelism each all-reduce becomes an all-gather before the
column-parallel GEMM and a reduce-scatter after the row-parallel one (the same
bytes per rank, twice the steps).  The weight gradient moves nothing.

Context parallelism (ring attention over c ranks): forward c - 1 sends of the
rank's K and V blocks (2 x b * s/c x h*kv/a / t, 16-bit); backward K and V
again plus their gradients (twice the bytes).  The exchange runs beside the
attention core's compute, so only what is longer than the core counts
(`exposed`).

The embedding (vocab-parallel) all-reduces its output (reduce-scatter with
sequence parallelism); the head all-gathers its input with sequence
parallelism and reduces its input gradient backward.
"""
from __future__ import annotations

from mpipe_core.workloads.cluster import LinkClass
from mpipe_core.workloads.collectives import Collective, all_gather, all_reduce, reduce_scatter, send
from mpipe_core.workloads.transformer_cost import BYTES, LayerShape


def activation_bytes(shape: LayerShape) -> float:
    """The layer's activation on one rank of a cp group, in bytes (the TP collectives' buffer)."""
    return shape.b * shape.s / shape.cp * shape.h * BYTES


def tp_layer(shape: LayerShape, link: LinkClass | None) -> dict[str, tuple[Collective, ...]]:
    """A layer's tensor-parallel collectives per kind (F, B, W)."""
    t, size = shape.tp, activation_bytes(shape)
    if shape.sp:
        one = (all_gather(t, size, link), reduce_scatter(t, size, link))
        both = one + one
    else:
        both = (all_reduce(t, size, link), all_reduce(t, size, link))
    return {"F": both, "B": both, "W": ()}


def cp_layer(shape: LayerShape, link: LinkClass | None) -> dict[str, tuple[Collective, ...]]:
    """A layer's context-parallel K/V exchange per kind (F, B, W)."""
    c = shape.cp
    block = 2 * shape.b * shape.s / c * shape.kv_width / shape.tp * BYTES
    return {"F": tuple(send(block, link) for _ in range(c - 1)),
            "B": tuple(send(2 * block, link) for _ in range(c - 1)), "W": ()}


def tp_embedding(shape: LayerShape, link: LinkClass | None) -> dict[str, tuple[Collective, ...]]:
    """The vocab-parallel embedding's collective (forward only)."""
    size = activation_bytes(shape)
    first = reduce_scatter(shape.tp, size, link) if shape.sp else all_reduce(shape.tp, size, link)
    return {"F": (first,), "B": (), "W": ()}


def tp_head(shape: LayerShape, link: LinkClass | None) -> dict[str, tuple[Collective, ...]]:
    """The column-parallel head's collectives: its input gathered (sp) and its input gradient reduced."""
    size = activation_bytes(shape)
    if shape.sp:
        return {"F": (all_gather(shape.tp, size, link),), "B": (reduce_scatter(shape.tp, size, link),), "W": ()}
    return {"F": (), "B": (all_reduce(shape.tp, size, link),), "W": ()}


def seconds(collectives: dict[str, tuple[Collective, ...]]) -> dict[str, float]:
    return {kind: sum(c.seconds for c in ops) for kind, ops in collectives.items()}
