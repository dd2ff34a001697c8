"""Re-composing a step's microbatches: the same samples, dealt again (docs/data.md).

The packs of a step are drawn in order, so one microbatch may carry four
times the tiles of another.  `regroup` deals the step's pieces (its samples,
or the cut parts of one, as packed) into as many microbatches again, each
within the packing limits, so that every microbatch's tiles and tokens are
near the step's mean (OmniBal's idea, ICML'25: balance vision and text work
across the mini-batches of a step).  The step's samples, so its gradient
(a sum over its tokens over their count), are those of the packs it was
given; only which microbatch carries which sample changes.

The rule: pieces in decreasing order of their larger share of a mean
microbatch (tiles / mean tiles or tokens / mean tokens; ties in draw order),
each to the microbatch that, with it, has the smallest larger share, among
those it fits (ties: the lighter, then the first).  Where one device runs the
encoder work of several microbatches (`shares`: `colocated`'s), it is the
device's tiles that count against their mean (tiles / (mean tiles x its
microbatches)), beside the microbatch's tokens: the device's encoder phase
and the microbatch's LLM work even out.  A microbatch keeps its
pieces in draw order.  None when a piece fits nowhere or a microbatch would
be empty (the drawn packs stay).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mpipe_core.data.packing import Pack, Packing, Tokens, single


def regroup(packs: Sequence[Pack], tokens: Tokens, packing: Packing,
            shares: Sequence[Sequence[int]] | None = None) -> tuple[Pack, ...] | None:
    """`packs`' pieces dealt again into len(packs) balanced microbatches (see the module);
    with `shares` (slots whose encoder work one device runs, as `colocated` splits it),
    the tiles are evened over the shares instead of over each microbatch."""
    M = len(packs)
    pieces = [piece for p in packs for piece in p.pieces]
    if M < 2 or len(pieces) <= M:
        return None
    tiles = np.array([sum(p.tiles) + p.frames for p in pieces], dtype=float)
    toks = np.array([tokens.of(p) for p in pieces], dtype=float)
    mean_tiles = max(tiles.sum() / M, 1e-9)
    mean_toks = max(toks.sum() / M, 1e-9)
    share = np.maximum(tiles / mean_tiles, toks / mean_toks)
    # each slot's group: its share (with `shares`), else itself; a group's tiles against its slots' mean
    group = np.arange(M)
    for g, slots in enumerate(shares or ()):
        group[list(slots)] = M + g
    _, group = np.unique(group, return_inverse=True)
    group_mean_tiles = np.bincount(group).astype(float)[group] * mean_tiles
    group_tiles = np.zeros(group.max() + 1)
    bin_tiles = np.zeros(M)
    bin_toks = np.zeros(M)
    members: list[list[int]] = [[] for _ in range(M)]
    cap_tiles, cap_toks = packing.max_tiles, packing.max_tokens
    for i in sorted(range(len(pieces)), key=lambda i: (-share[i], i)):
        after_tiles = bin_tiles + tiles[i]
        after_toks = bin_toks + toks[i]
        after = np.maximum((group_tiles[group] + tiles[i]) / group_mean_tiles, after_toks / mean_toks)
        # ties: the lighter (the bins' summed shares, scaled far below a share's steps)
        after += 1e-9 * (bin_tiles / mean_tiles + bin_toks / mean_toks)
        after[(after_tiles > cap_tiles) | (after_toks > cap_toks)] = np.inf
        pick = int(after.argmin())
        if after[pick] == np.inf:
            return None
        bin_tiles[pick] = after_tiles[pick]
        group_tiles[group[pick]] += tiles[i]
        bin_toks[pick] = after_toks[pick]
        members[pick].append(i)
    if any(not m for m in members):
        return None
    out = []
    for m in members:
        m.sort()
        p = single(pieces[m[0]], tokens)
        for i in m[1:]:
            p = p.join(pieces[i], tokens)
        out.append(p)
    return tuple(out)
