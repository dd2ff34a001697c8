"""partition and balanced: how many layers each chunk of a schedule holds.

* `partition(t, [k0, k1, ...])` gives LLM chunk c exactly k_c layers.
* `balanced(t)` is the static split practitioners hand-tune (Megatron's
  `--decoder-first-pipeline-num-layers`, uneven splits): the encoders' layers
  become the first layers of the chain, followed by the LLM's, and the chain is
  cut contiguously over t's chunks so that the most loaded device does the
  least work per microbatch (F+B+W; a frozen encoder's layers count F only).
  Encoder layers then run inside their chunk's F/B/W ops on its device.

The split is exact: the optimal bottleneck is one of the O(L^2) contiguous
range sums, and "can the chain be cut into at most C pieces of at most X"
is answered exactly by a greedy sweep, so a binary search over the sorted
range sums finds the optimum; a DP over split points then picks, among the
optimal splits, the most even one.  When a device holds several chunks
(interleaved, V schedules) the same search minimises the most loaded chunk.
"""
from __future__ import annotations

from dataclasses import replace

from mpipe_core.algebra.combinators.common import CombineError
from mpipe_core.errors import ArgumentError
from mpipe_core.ir.ops import LLM, F
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.chunks import encoder_chain, folds_encoders
from mpipe_core.workloads.workload import Workload

EPS = 1e-9


def partition(schedule: Schedule, workload: Workload, layers: tuple[int, ...]) -> Schedule:
    if folds_encoders(schedule.pipelines):
        raise CombineError("partition cannot re-split a balanced(...) schedule (write one or the other)")
    _refuse_recompute(schedule, "partition")
    if workload.llm.chunk_costs is not None:
        raise CombineError("partition needs per-layer LLM costs (this workload has measured chunk_costs)")
    pipelines = []
    for pipe in schedule.pipelines:
        if len(layers) != pipe.chunks:
            raise ArgumentError("layers", f"{len(layers)} layer counts for {pipe.chunks} chunks "
                                          f"(give one per chunk, in chunk order)")
        total = workload.llm.layers
        if total is not None and sum(layers) != total:
            raise ArgumentError("layers", f"the counts add up to {sum(layers)} but the LLM has {total} layers")
        pipelines.append(replace(pipe, layers=tuple(layers)))
    # Same ops, same rows: the generator's columns still describe them.
    return schedule.with_orders(schedule.orders, pipelines=tuple(pipelines), llm_columns=schedule.llm_columns)


def balanced(schedule: Schedule, workload: Workload) -> Schedule:
    if len(schedule.pipelines) != 1:
        raise CombineError("balanced works on a single pipeline (not par/overlay)")
    pipe = schedule.pipelines[0]
    if folds_encoders(schedule.pipelines) or pipe.layers is not None:
        raise CombineError("the input already has a layer split (partition or balanced)")
    _refuse_recompute(schedule, "balanced")
    if workload.llm.chunk_costs is not None:
        raise CombineError("balanced needs per-layer LLM costs (this workload has measured chunk_costs)")
    devices = chunk_devices(schedule, pipe.module, pipe.chunks)
    first = devices[0]
    if any(op.module != pipe.module and d != first for d, order in enumerate(schedule.orders) for op in order):
        raise CombineError("balanced folds the encoders into the first chunks: give it a schedule with the "
                           "encoders fused on the first stage (put transpose/encoder_stage outside, not inside)")
    weights = layer_weights(workload, pipe.chunks, pipe.microbatches)
    chain_enc = len(encoder_chain(workload))
    if len(weights) < pipe.chunks:
        raise CombineError(f"the chain has {len(weights)} layers ({chain_enc} encoder + "
                           f"{len(weights) - chain_enc} LLM) but the schedule has {pipe.chunks} chunks "
                           f"(each chunk needs at least one layer)")
    sizes = split_min_max(weights, pipe.chunks)
    enc_layers, llm_layers, position = [], [], 0
    for size in sizes:
        enc = max(0, min(chain_enc, position + size) - position)
        enc_layers.append(enc)
        llm_layers.append(size - enc)
        position += size
    new = replace(pipe, layers=tuple(llm_layers),
                  encoder_layers=tuple(enc_layers) if workload.encoders else None)
    body = schedule.llm_only()
    # Columns exist only for LLM-only ops, which `llm_only` leaves as they were.
    return body.with_orders(body.orders, pipelines=(new,), llm_columns=schedule.llm_columns)


def _refuse_recompute(schedule: Schedule, name: str) -> None:
    """A recompute names layers of the split it was given: re-splitting under it would move them."""
    if any(p.recompute is not None for p in schedule.pipelines):
        raise CombineError(f"{name} cannot re-split a recompute(...) schedule (put {name} inside recompute)")


def chunk_devices(schedule: Schedule, module: str = LLM, chunks: int | None = None) -> list[int]:
    """The device of each LLM chunk (where its first forward runs)."""
    found: dict[int, int] = {}
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op.module == module and op.kind == F and op.chunk not in found:
                found[op.chunk] = d
    count = chunks if chunks is not None else len(found)
    return [found.get(c, 0) for c in range(count)]


def folded_encoder_layers(schedule: Schedule) -> list[int] | None:
    """Encoder layers per device that `balanced` folded into the LLM chunks there (they
    run inside those chunks' ops, so no encoder op shows them); None when nothing is folded."""
    pipe = schedule.pipelines[0] if schedule.pipelines else None
    if pipe is None or not pipe.encoder_layers:
        return None
    out = [0] * schedule.devices
    for chunk, device in enumerate(chunk_devices(schedule, LLM, pipe.chunks)):
        out[device] += pipe.encoder_layers[chunk]
    return out


def layer_weights(workload: Workload, chunks: int, microbatches: int) -> list[float]:
    """Per-microbatch work (F+B+W; frozen: F) of each layer of the chain:
    encoder layers first (their mean over the microbatches), then the LLM's."""
    out: list[float] = []
    for e in workload.encoders:
        f = e.costs("F", microbatches)
        total = sum(f) + (sum(e.costs("BW", microbatches)) if e.trainable else 0.0)
        out += [total / microbatches / e.layers] * e.layers
    llm = workload.llm
    n = chunks if llm.layers is None else llm.layers
    return out + [llm.f + llm.b + llm.w] * n


def split_min_max(weights: list[float], parts: int) -> list[int]:
    """Sizes of `parts` non-empty contiguous pieces of `weights` whose largest
    sum is minimal (exact), the others as even as that allows."""
    n = len(weights)
    prefix = [0.0]
    for x in weights:
        prefix.append(prefix[-1] + x)
    candidates = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    lo, hi = 0, len(candidates) - 1
    while lo < hi:  # the smallest candidate the greedy sweep can meet
        mid = (lo + hi) // 2
        if _pieces_needed(weights, candidates[mid]) <= parts:
            hi = mid
        else:
            lo = mid + 1
    bound = candidates[lo] + EPS * max(1.0, candidates[lo])
    return _most_even(prefix, parts, bound)


def _most_even(prefix: list[float], parts: int, bound: float) -> list[int]:
    """Among the splits whose pieces all stay within `bound`, the one with the
    smallest sum of squared piece sums (the rest as even as the bottleneck
    allows, not one piece left to take the slack).  DP over split points; a
    piece spans few layers when the bound is tight, so this is cheap."""
    n = len(prefix) - 1
    inf = float("inf")
    cost = [[inf] * (n + 1) for _ in range(parts + 1)]
    back = [[0] * (n + 1) for _ in range(parts + 1)]
    cost[0][0] = 0.0
    for c in range(1, parts + 1):
        # piece c covers layers j..i-1; leave at least one layer per later piece
        for i in range(c, n - (parts - c) + 1):
            best, arg = inf, 0
            j = i - 1
            while j >= c - 1:
                load = prefix[i] - prefix[j]
                if load > bound:
                    break
                total = cost[c - 1][j] + load * load
                if total < best:
                    best, arg = total, j
                j -= 1
            cost[c][i], back[c][i] = best, arg
    sizes, i = [], n
    for c in range(parts, 0, -1):
        j = back[c][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def _pieces_needed(weights: list[float], bound: float) -> int:
    """Fewest contiguous pieces with sums <= bound (greedy is optimal here)."""
    bound += EPS * max(1.0, bound)
    pieces, total = 1, 0.0
    for x in weights:
        if x > bound:
            return len(weights) + 1
        if total + x > bound:
            pieces += 1
            total = x
        else:
            total += x
    return pieces
