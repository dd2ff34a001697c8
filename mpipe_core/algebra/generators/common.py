"""Building blocks the LLM schedule generators share.

A generator is a few independent choices (minPP-style): which chunks a rank
holds, the stream of forwards and backwards it runs, and a rule that merges
them (a warm-up count, or a fixed lag between the streams).  This module holds
the argument checks and the two merge rules; every step is O(ops).
"""
from __future__ import annotations

from typing import Iterable, Sequence

from mpipe_core.errors import ArgumentError
from mpipe_core.ir.ops import LLM, Op


def require_at_least(name: str, value: int, minimum: int = 1) -> None:
    """Raise `ArgumentError(name, ...)` unless `value >= minimum`."""
    if value < minimum:
        raise ArgumentError(name, f"{name} must be >= {minimum} (got {value})")


def require_sizes(p: int, m: int, v: int = 1) -> None:
    """The rules every generator shares: p, m, v are all at least 1."""
    require_at_least("p", p)
    require_at_least("m", m)
    require_at_least("v", v)


def check_rounds(schedule: str, p: int, m: int) -> int:
    """Microbatches per round, the way torch's interleaved schedules split them.

    torch runs `max(1, m // p)` rounds of equal size and rejects an `m` that
    they do not divide (p=4: m=9 and m=11 are rejected, m=6 and m=10 are not).
    """
    rounds = max(1, m // p)
    if m % rounds:
        raise ArgumentError(
            "m",
            f"{schedule} needs m to be a multiple of its round count max(1, m // p) "
            f"(got m={m}, p={p}: {rounds} rounds)",
        )
    return m // rounds


def warmup_then_alternate(forwards: Sequence[Op], backwards: Sequence[Op], warmup: int) -> list[Op]:
    """The 1F1B merge: `warmup` forwards, then forward/backward pairs, then the rest.

    Both streams have the same length; the backwards left after the last pair
    form the cool-down.
    """
    steady = len(forwards) - warmup
    order = list(forwards[:warmup])
    for forward, backward in zip(forwards[warmup:], backwards):
        order.append(forward)
        order.append(backward)
    order.extend(backwards[steady:])
    return order


def lockstep(chunk: int, m: int, lanes: Iterable[tuple[str, int]]) -> list[Op]:
    """One chunk's ops when each kind trails the forward by a fixed lag.

    At step `x = 0, 1, 2, ...` the rank runs, for each `(kind, lag)` lane in
    turn, that kind on microbatch `x - lag`; microbatches outside `0..m-1` are
    skipped.  With lanes `(F, 0), (BW, p-1-r)` this is textbook 1F1B on rank
    r; adding a W lane gives the zero-bubble schedules.  Warm-up and
    cool-down fall out of the skipping, for any m.
    """
    lanes = tuple(lanes)
    steps = m + max(lag for _, lag in lanes)
    return [
        Op(LLM, kind, chunk, x - lag)
        for x in range(steps)
        for kind, lag in lanes
        if 0 <= x - lag < m
    ]
