"""Batches drawn in order from the packed stream (docs/data.md).

A step's global batch is `replicas` x `microbatches` packs, taken in
emission order.  Without balancing, replica r gets packs r*M .. r*M + M - 1
(each replica draws its own share, as a distributed sampler does).  With
``balance="tiles+tokens"`` the step's packs are dealt so that the replicas'
loads are even (OmniBal's and OrchMLLM's idea: balance vision and text work
across data-parallel ranks each step): heaviest first, each to the replica
with the least load that still has room for M packs (longest processing
time first, with a cardinality limit); a replica keeps its packs in draw
order.  The load of a pack is `weight(pack)`, by default its LLM tokens
plus its tiles at their tokens each; the workload supplies the real costs.

Every drawn sample carries its place in the stream as its `key` ("n"; a
piece cut by packing "n/k"), so a piece keeps its identity when `regroup`
moves it to another pack: a run seeds the piece's tensors by it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import islice
from typing import Callable, Iterable, Iterator

from mpipe_core.errors import WorkloadError
from mpipe_core.data.packing import Pack, pack
from mpipe_core.data.samples import Sample
from mpipe_core.data.spec import DataSpec

MAX_BATCHES = 100_000


@dataclass(frozen=True)
class Batch:
    """One step's packs: `packs` in draw order, `replicas[r]` the indices
    of replica r's microbatches, in the order its pipeline runs them."""

    index: int
    packs: tuple[Pack, ...]
    replicas: tuple[tuple[int, ...], ...]

    def of(self, replica: int) -> tuple[Pack, ...]:
        return tuple(self.packs[i] for i in self.replicas[replica])

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.packs)

    @property
    def tiles(self) -> int:
        return sum(p.tiles for p in self.packs)


def default_weight(spec: DataSpec) -> Callable[[Pack], float]:
    return lambda p: p.tokens + p.tiles * spec.tokens.per_tile


def deal(packs: tuple[Pack, ...], replicas: int, microbatches: int, balance: str,
         weight: Callable[[Pack], float]) -> tuple[tuple[int, ...], ...]:
    """Which packs each replica runs (indices into `packs`)."""
    if balance == "none" or replicas == 1:
        return tuple(tuple(range(r * microbatches, (r + 1) * microbatches)) for r in range(replicas))
    load = [0.0] * replicas
    mine: list[list[int]] = [[] for _ in range(replicas)]
    for i in sorted(range(len(packs)), key=lambda i: (-weight(packs[i]), i)):
        r = min((r for r in range(replicas) if len(mine[r]) < microbatches), key=lambda r: (load[r], r))
        mine[r].append(i)
        load[r] += weight(packs[i])
    return tuple(tuple(sorted(m)) for m in mine)


def keyed(samples: Iterable[Sample]) -> Iterator[Sample]:
    """Each sample with its place in the stream as its `key` ("0", "1", ...)."""
    for n, sample in enumerate(samples):
        yield replace(sample, key=str(n))


def draw_batches(spec: DataSpec, microbatches: int, count: int, replicas: int = 1,
                 balance: str | None = None, weight: Callable[[Pack], float] | None = None) -> list[Batch]:
    """The first `count` steps' batches (`balance`: the spec's when None)."""
    if not 1 <= count <= MAX_BATCHES:
        raise WorkloadError(f"batches: expected a whole number from 1 to {MAX_BATCHES}, got {count}")
    per_step = microbatches * replicas
    stream = pack(keyed(spec.stream()), spec.tokens, spec.packing)
    packs = list(islice(stream, per_step * count))
    if len(packs) < per_step * count:  # (only a finite stream can run out; ours never do)
        raise WorkloadError(f"data: only {len(packs)} packed samples, fewer than {per_step * count}")
    how = spec.balance if balance is None else balance
    weigh = weight or default_weight(spec)
    out = []
    for i in range(count):
        step = tuple(packs[i * per_step:(i + 1) * per_step])
        out.append(Batch(i, step, deal(step, replicas, microbatches, how, weigh)))
    return out
