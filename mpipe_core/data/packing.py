"""Packing samples into microbatches, by the rule of InternVL's PackedDataset.

The rule, in our words (InternVL's `internvl_chat/internvl/train/dataset_packed.py`,
`PackedDataset`, with `allow_overflow` off; docs/data.md):

* A packed sample holds at most `max_tiles` tiles (InternVL's
  `num_images_expected`: it counts rows of pixel values, one per tile or
  video frame) and at most `max_tokens` LLM tokens (`max_packed_tokens`).
* Open packs wait in a buffer list kept in descending order of tiles (a new
  one goes before the first pack with fewer tiles, so after its equals).
* Each incoming sample joins the first open pack in that order that stays
  within both limits with it, else it opens a pack of its own.
* A sample over either limit on its own is cut, only at image boundaries
  (the images come first, then the text): a piece takes whole images while
  they fit and the text goes with the last piece, cut at `max_tokens` (what
  is cut off is dropped, as InternVL drops the tokens past the cut).  Each
  piece enters the buffer list alone; it never joins an open pack.
* A pack that reaches `max_tokens` tokens or `max_tiles` tiles is emitted
  at once; while more than `buffer` packs are open the one with the most
  tiles is emitted (InternVL's `max_buffer_size`, 100 by default).

Emitted packs, in emission order, are the microbatches of the stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from mpipe_core.errors import WorkloadError
from mpipe_core.data.samples import Sample

DEFAULT_BUFFER = 100


@dataclass(frozen=True)
class Tokens:
    """What one tile and one video frame cost in LLM tokens."""

    per_tile: int = 256
    per_frame: int = 256

    def of(self, sample: Sample) -> int:
        return self.visual(sample) + sample.text_tokens

    def visual(self, sample: Sample) -> int:
        return sum(sample.tiles) * self.per_tile + sample.frames * self.per_frame


@dataclass(frozen=True)
class Packing:
    max_tiles: int
    max_tokens: int
    buffer: int = DEFAULT_BUFFER


@dataclass(frozen=True)
class Pack:
    """One packed sample: what it holds (each piece a sample or a cut part of
    one) and its totals.  `tiles` counts video frames too (one each)."""

    pieces: tuple[Sample, ...]
    tiles: int
    tokens: int

    @property
    def images(self) -> int:
        return sum(p.images for p in self.pieces)

    @property
    def frames(self) -> int:
        return sum(p.frames for p in self.pieces)

    def join(self, piece: Sample, tokens: Tokens) -> "Pack":
        return Pack(self.pieces + (piece,), self.tiles + sum(piece.tiles) + piece.frames,
                    self.tokens + tokens.of(piece))


def single(piece: Sample, tokens: Tokens) -> Pack:
    return Pack((piece,), sum(piece.tiles) + piece.frames, tokens.of(piece))


def check_fits(largest_tiles: int, frames: bool, tokens: Tokens, packing: Packing, where: str) -> None:
    """Refuse packing limits smaller than one image (or one video frame)."""
    if largest_tiles > packing.max_tiles:
        raise WorkloadError(f"data.packing.max_tiles: {packing.max_tiles} is smaller than one image "
                            f"({largest_tiles} tiles, {where})")
    need = largest_tiles * tokens.per_tile
    if need > packing.max_tokens:
        raise WorkloadError(f"data.packing.max_tokens: {packing.max_tokens} is smaller than one image "
                            f"({largest_tiles} tiles, {need} tokens, {where})")
    if frames and tokens.per_frame > packing.max_tokens:
        raise WorkloadError(f"data.packing.max_tokens: {packing.max_tokens} is smaller than one video frame "
                            f"({tokens.per_frame} tokens, {where})")


def cut(sample: Sample, tokens: Tokens, packing: Packing) -> list[Sample]:
    """A sample over a limit, cut at image boundaries (frames are images of one
    tile); the text goes with the last piece, cut at `max_tokens`."""
    units = [(t, t * tokens.per_tile, False) for t in sample.tiles] + \
            [(1, tokens.per_frame, True)] * sample.frames
    pieces: list[list[tuple[int, int, bool]]] = [[]]
    used_tiles = used_tokens = 0
    for unit in units:
        t, n, _ = unit
        if pieces[-1] and (used_tiles + t > packing.max_tiles or used_tokens + n > packing.max_tokens):
            pieces.append([])
            used_tiles = used_tokens = 0
        pieces[-1].append(unit)
        used_tiles += t
        used_tokens += n
    text = min(sample.text_tokens, packing.max_tokens - used_tokens)
    out = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        out.append(Sample(tuple(t for t, _, video in piece if not video), text if last else 0,
                          sum(1 for _, _, video in piece if video), f"{sample.origin} (part {i + 1})",
                          f"{sample.key}/{i + 1}" if sample.key else ""))
    return out


def pack(samples: Iterable[Sample], tokens: Tokens, packing: Packing) -> Iterator[Pack]:
    """The packed stream (see the module's rule); ends when `samples` does,
    emitting the packs still open, most tiles first."""
    open_packs: list[Pack] = []

    def insert(p: Pack) -> Iterator[Pack]:
        if p.tokens >= packing.max_tokens or p.tiles >= packing.max_tiles:
            yield p
            return
        at = next((i for i, q in enumerate(open_packs) if q.tiles < p.tiles), len(open_packs))
        open_packs.insert(at, p)

    for sample in samples:
        size = sum(sample.tiles) + sample.frames
        if size > packing.max_tiles or tokens.of(sample) > packing.max_tokens:
            for piece in cut(sample, tokens, packing):
                yield from insert(single(piece, tokens))
        else:
            n = tokens.of(sample)
            at = next((i for i, q in enumerate(open_packs)
                       if q.tiles + size <= packing.max_tiles and q.tokens + n <= packing.max_tokens), None)
            merged = single(sample, tokens) if at is None else open_packs.pop(at).join(sample, tokens)
            yield from insert(merged)
        while len(open_packs) > packing.buffer:
            yield open_packs.pop(0)
    yield from open_packs
