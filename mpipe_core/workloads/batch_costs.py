"""What one drawn batch's microbatches cost (docs/data.md).

With a `data` section an encoder's f/b/w (and activation) are per tile (a
video frame counts as a tile), and microbatch m of a batch costs them times
its tiles.  The LLM's costs are those of a microbatch of the reference
length R, and a microbatch of n tokens costs, per kind, lin * (n / R) +
quad * (n / R)^2 times that:

* explicit form: R = `data.packing.max_tokens` (a full pack), lin = 1,
  quad = 0: the stated costs grow linearly with tokens;
* analytic form: R = the model's `seq_len`, and lin/quad are the dense and
  attention-score shares of a layer at R (`analytic.sequence_fractions`), so
  a microbatch costs what the model's dimensions give at its own length.

Memory and transfers follow the microbatch too.  An encoder's activation,
the features it ships to the LLM (`output_bytes`, and their gradient back)
and the raw input a recompute elsewhere needs (`input_bytes`) are per tile.
The LLM's activation (its layers', the embedding's and the head's) and the
hidden state shipped between chunks (`boundary_bytes`) are those of R
tokens, and a microbatch of n tokens holds and ships n / R times them
(`LLM.token_ratio`): linear in tokens, as activations are with flash
attention (without it the attention scores add a part quadratic in n,
left out here).
`microbatch_workload` gives the workload of one pipeline's microbatches;
`mean_workload` the one every microbatch at the mean (what a static plan is
made for).
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Callable, Sequence

from mpipe_core.data.draw import Batch, draw_batches
from mpipe_core.data.packing import Pack
from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.analytic import parallel_section, sequence_fractions
from mpipe_core.workloads.workload import Workload

KINDS = ("F", "B", "W")
# The static plan is made for the mean microbatch of this many first batches.
MEAN_BATCHES = 32


def replicas(wl: Workload) -> int:
    """Data-parallel replicas: `data.dp` (explicit form), `parallel.dp` (analytic), else 1."""
    if wl.data is not None and wl.data.dp is not None:
        return wl.data.dp
    if wl.source is not None and "model" in wl.source:
        return parallel_section(wl.source)["dp"]
    return 1


def token_model(wl: Workload) -> tuple[float, dict[str, tuple[float, float]]]:
    """(R, {kind: (lin, quad)}): see the module's docstring."""
    if wl.data is None:
        raise WorkloadError(f"workload '{wl.name}' has no data section (docs/data.md)")
    if wl.source is not None and "model" in wl.source:
        return sequence_fractions(wl.source)
    return float(wl.data.packing.max_tokens), {k: (1.0, 0.0) for k in KINDS}


def _scale(n: float, reference: float, shares: tuple[float, float]) -> float:
    x = n / reference
    return shares[0] * x + shares[1] * x * x


def microbatch_workload(wl: Workload, packs: Sequence[Pack]) -> Workload:
    """The workload whose microbatch m holds `packs[m]`."""
    reference, shares = token_model(wl)
    counts = tuple(float(p.tiles) for p in packs)
    scale = {k: tuple(_scale(p.tokens, reference, shares[k]) for p in packs) for k in KINDS}
    return _with(wl, counts, scale, tuple(p.tokens / reference for p in packs))


def _with(wl: Workload, counts: tuple[float, ...], scale: dict[str, tuple[float, ...]],
          ratio: tuple[float, ...]) -> Workload:
    encoders = tuple(replace(e, counts=counts) for e in wl.encoders)
    return replace(wl, encoders=encoders, llm=replace(wl.llm, token_scale=scale, token_ratio=ratio))


def permuted(wl: Workload, order: Sequence[int]) -> Workload:
    """The same batch with its microbatches run in `order` (slot s runs the
    microbatch drawn at order[s])."""
    scale = wl.llm.token_scale
    if scale is None:
        return wl
    encoders = tuple(e if e.counts is None else replace(e, counts=tuple(e.counts[i] for i in order))
                     for e in wl.encoders)
    ratio = wl.llm.token_ratio
    llm = replace(wl.llm, token_scale={k: tuple(v[i] for i in order) for k, v in scale.items()},
                  token_ratio=None if ratio is None else tuple(ratio[i] for i in order))
    return replace(wl, encoders=encoders, llm=llm)


def evened(wl: Workload) -> Workload:
    """A batch's costs with every microbatch at the batch's own mean tiles and LLM
    scale: what no re-composition of its samples can beat with the same op orders
    (pieces are whole), the benchmark's ceiling for it."""
    scale = wl.llm.token_scale
    if scale is None:
        return wl
    M = len(scale["F"])
    counts = next((e.counts for e in wl.encoders if e.counts is not None), None)
    tiles = (_mean(list(counts)),) * M if counts is not None else None
    even = {k: (_mean(list(v)),) * M for k, v in scale.items()}
    ratio = wl.llm.token_ratio
    encoders = tuple(e if e.counts is None else replace(e, counts=tiles) for e in wl.encoders)
    return replace(wl, encoders=encoders, llm=replace(
        wl.llm, token_scale=even, token_ratio=None if ratio is None else (_mean(list(ratio)),) * M))


def _mean(values: list[float]) -> float:
    """The mean; exactly the value when all are equal (constant data gives the batch's own costs)."""
    if min(values) == max(values):
        return values[0]
    return math.fsum(values) / len(values)


def mean_workload(wl: Workload, microbatches: int, batches: int = MEAN_BATCHES) -> Workload:
    """Every microbatch at the mean tiles and the mean LLM time of the first
    `batches` batches (every replica's share), for a pipeline of `microbatches`."""
    drawn = drawn_batches(wl, microbatches, batches)
    packs = [p for b in drawn for p in b.packs]
    reference, shares = token_model(wl)
    tiles = _mean([float(p.tiles) for p in packs])
    scale = {k: (_mean([_scale(p.tokens, reference, shares[k]) for p in packs]),) * microbatches for k in KINDS}
    ratio = _mean([p.tokens / reference for p in packs])
    return _with(wl, (tiles,) * microbatches, scale, (ratio,) * microbatches)


def pack_weight(wl: Workload) -> Callable[[Pack], float]:
    """A pack's work on its replica, all layers and kinds (what `balance` evens out)."""
    reference, shares = token_model(wl)
    layers = wl.llm.layers or 1
    per_tile = sum(e.costs("F", 1)[0] + (e.costs("BW", 1)[0] if e.trainable else 0.0) for e in wl.encoders)
    nominal = {"F": wl.llm.f, "B": wl.llm.b, "W": wl.llm.w}

    def weight(p: Pack) -> float:
        llm = sum(layers * nominal[k] * _scale(p.tokens, reference, shares[k]) for k in KINDS)
        return llm + per_tile * p.tiles

    return weight


def drawn_batches(wl: Workload, microbatches: int, count: int, balance: str | None = None) -> list[Batch]:
    """The first `count` batches of `wl`'s data for a pipeline of `microbatches`
    per replica (`balance`: the data section's when None)."""
    if wl.data is None:
        raise WorkloadError(f"workload '{wl.name}' has no data section: give one to draw batches (docs/data.md)")
    return _drawn(wl, microbatches, count, balance)


def _drawn(wl: Workload, microbatches: int, count: int, balance: str | None) -> list[Batch]:
    key = (id(wl.data), microbatches, count, balance, replicas(wl))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is wl.data:
        return hit[1]
    out = draw_batches(wl.data, microbatches, count, replicas(wl), balance, pack_weight(wl))
    _CACHE[key] = (wl.data, out)
    while len(_CACHE) > 8:
        _CACHE.pop(next(iter(_CACHE)))
    return out


_CACHE: dict = {}
