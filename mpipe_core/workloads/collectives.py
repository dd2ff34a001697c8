"""Alpha-beta costs of ring collectives and point-to-point sends, in seconds.

For a group of n ranks and a buffer of S bytes (the whole buffer, as
nccl-tests `doc/PERFORMANCE.md` counts it), each rank moves

    all-reduce                   2 (n - 1) / n * S
    all-gather, reduce-scatter   (n - 1) / n * S

over its link, in 2 (n - 1) resp. (n - 1) ring steps that each pay the link's
latency: time = steps * latency + moved / achieved bandwidth.  A send moves S
once.  A group of one costs nothing.  The link is the slowest class the group
crosses (`cluster.Placement`).
"""
from __future__ import annotations

from dataclasses import dataclass

from mpipe_core.workloads.cluster import LinkClass

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, SEND = "all-reduce", "all-gather", "reduce-scatter", "send"


@dataclass(frozen=True)
class Collective:
    """One priced collective: what it is, over how many ranks, its buffer and
    the bytes each rank moves, the link class, and its time in seconds."""

    kind: str
    ranks: int
    buffer_bytes: float
    moved_bytes: float
    link: str
    seconds: float

    def as_dict(self) -> dict:
        return {"kind": self.kind, "ranks": self.ranks, "buffer_bytes": self.buffer_bytes,
                "moved_bytes": self.moved_bytes, "link": self.link, "seconds": self.seconds}


def _ring(kind: str, steps_per_rank: int, n: int, nbytes: float, link: LinkClass | None) -> Collective:
    if n <= 1 or link is None or nbytes <= 0:
        return Collective(kind, n, nbytes, 0.0, link.name if link else "", 0.0)
    steps = steps_per_rank * (n - 1)
    moved = steps * nbytes / n
    outer = steps if link.nodes <= 1 and link.inner_latency_us is None else steps_per_rank * (max(link.nodes, 1) - 1)
    latency = link.base_latency_us * 1e-6 + (steps - outer) * link.inner_latency_s + outer * link.latency_s
    return Collective(kind, n, nbytes, moved, link.name, latency + moved / link.bytes_per_s)


def all_reduce(n: int, nbytes: float, link: LinkClass | None) -> Collective:
    """Ring all-reduce: 2(n-1) steps of S/n each."""
    return _ring(ALL_REDUCE, 2, n, nbytes, link)


def all_gather(n: int, nbytes: float, link: LinkClass | None) -> Collective:
    """Ring all-gather of a buffer of S bytes in all (S/n from each rank): n-1 steps."""
    return _ring(ALL_GATHER, 1, n, nbytes, link)


def reduce_scatter(n: int, nbytes: float, link: LinkClass | None) -> Collective:
    """Ring reduce-scatter of S bytes (S/n left on each rank): n-1 steps."""
    return _ring(REDUCE_SCATTER, 1, n, nbytes, link)


def send(nbytes: float, link: LinkClass | None) -> Collective:
    """One point-to-point send of S bytes."""
    if link is None:
        return Collective(SEND, 2, nbytes, 0.0, "", 0.0)
    return Collective(SEND, 2, nbytes, nbytes, link.name, link.latency_s + nbytes / link.bytes_per_s)


def total_seconds(collectives) -> float:
    return sum(c.seconds for c in collectives)
