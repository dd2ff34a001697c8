"""The communication inside one transformer layer, per microbatch and device.

Tensor parallelism (Megatron's column- then row-parallel linears, twice per
layer: attention and MLP), each collective of the layer's activation
(b * s/c tokens x h, 16-bit):

* without sequence parallelism: forward an all-reduce after each row-parallel
  GEMM; backward an all-reduce of each column-parallel GEMM's input gradient,
  which Megatron-LM (since 2022: `--async-tensor-model-parallel-allreduce`,
  `LinearWithGradAccumulationAndAsyncCommunication`) launches before that
  GEMM's weight gradient and waits for after it: it overlaps the weight-
  gradient GEMM (its partner);
* with sequence parallelism: forward an all-gather before each column-parallel
  GEMM and a reduce-scatter after each row-parallel one; backward an all-gather
  of the row-parallel GEMM's output gradient (exposed: its input gradient needs
  it), a re-gather of the column-parallel GEMM's saved input (only 1/t of it is
  kept) for its weight gradient, overlapping that GEMM's input gradient, and a
  reduce-scatter of that input gradient, overlapping the weight gradient.

`tp_partners` names each backward collective's partner GEMM (None: exposed),
and the collective is counted in its partner's kind (B or W: the time of
a kind never grows when another shrinks, whatever the schedule does with
them); with `parallel.tp_backward_overlap: false` (Megatron-LM of 2021, whose
backward all-reduce was synchronous) every collective is exposed, in B.  A
schedule that runs the weight gradient apart from the input gradient
(zero-bubble) is priced as if it still overlapped them.

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
from mpipe_core.workloads.transformer_cost import BYTES, LayerShape, LayerTimes


def activation_bytes(shape: LayerShape) -> float:
    """The layer's activation on one rank of a cp group, in bytes (the TP collectives' buffer)."""
    return shape.b * shape.s / shape.cp * shape.h * BYTES


def tp_layer(shape: LayerShape, link: LinkClass | None, overlap: bool = True) -> dict[str, tuple[Collective, ...]]:
    """A layer's tensor-parallel collectives per kind (F, B, W), in `tp_partners`' order.

    A backward collective that overlaps a GEMM belongs to that GEMM's kind (the input
    gradient's B, the weight gradient's W), so that a kind's time never grows when
    another kind's shrinks; without `overlap` all sit in B, where they are issued."""
    t, size = shape.tp, activation_bytes(shape)
    if shape.sp:
        forward = (all_gather(t, size, link), reduce_scatter(t, size, link)) * 2
        # per block: dY gathered (B, exposed), the saved input re-gathered (behind the input
        # gradient: B), dX reduce-scattered (behind the weight gradient: W)
        gather, scatter = all_gather(t, size, link), reduce_scatter(t, size, link)
        if not overlap:
            return {"F": forward, "B": (gather, gather, scatter) * 2, "W": ()}
        return {"F": forward, "B": (gather, gather) * 2, "W": (scatter, scatter)}
    reduce = all_reduce(t, size, link)
    forward = (reduce, reduce)
    return {"F": forward, "B": forward if not overlap else (), "W": () if not overlap else forward}


def tp_partners(shape: LayerShape, times: LayerTimes, overlap: bool = True) -> dict[str, tuple[float | None, ...]]:
    """Per kind, each `tp_layer` collective's partner GEMM seconds (None: nothing hides it)."""
    if not overlap:
        return {k: (None,) * n for k, n in (("F", 4 if shape.sp else 2), ("B", 6 if shape.sp else 2), ("W", 0))}
    if shape.sp:
        return {"F": (None,) * 4, "B": (None, times.col_dgrad[0], None, times.col_dgrad[1]), "W": times.col_wgrad}
    return {"F": (None, None), "B": (), "W": times.col_wgrad}


def exposed_seconds(collectives: tuple[Collective, ...], partners: tuple[float | None, ...]) -> float:
    """What the collectives add to their op: each one's time beyond its partner GEMM's,
    max(0, collective - partner), or all of it without a partner."""
    return sum(c.seconds if p is None else max(0.0, c.seconds - p) for c, p in zip(collectives, partners))


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
