"""Which images an encoder op runs on, and which rows of its features each
LLM microbatch receives, under shards (`transpose(..., shards=n)`) and groups
(`encoder_batch(t, k)`).

An encoder op is shard s of the group whose first microbatch is g (a group
of one without `encoder_batch`).  The group's images are its microbatches'
images concatenated in microbatch order; the op runs the encoder on the
contiguous range `shard_bounds` gives shard s of them.  Microbatch m's
features are the rows of that concatenation its images occupy, so the op
sends m the intersection of the two ranges (and m's chunk 0 sends the
feature gradient of the same rows back).  With shards and groups together
that intersection may be empty: such a message carries no rows.
"""
from __future__ import annotations

from mpipe_core.ir.schedule import Pipeline

from .model import shard_bounds


class EncoderRows:
    def __init__(self, image_counts: list[int], shards: dict[int, int], batch: int = 1):
        self.counts = image_counts
        self.shards = shards  # group's first microbatch -> its shard count
        self.batch = batch
        self.microbatches = len(image_counts)
        # The groups are the schedule's (`Pipeline.group_of`, `Pipeline.groups`); chunks play no part.
        self._pipe = Pipeline(replica=0, chunks=1, microbatches=self.microbatches, encoder_batch=batch)
        self._sizes = dict(self._pipe.groups())

    def group_of(self, m: int) -> int:
        return self._pipe.group_of(m)

    def members(self, g: int) -> range:
        """The microbatches group g (its first microbatch) serves (the last group may be smaller)."""
        return range(g, g + self._sizes[g])

    def rows(self, m: int) -> tuple[int, int]:
        """Microbatch m's rows in its group's concatenated images."""
        g = self.group_of(m)
        start = sum(self.counts[g:m])
        return start, start + self.counts[m]

    def shard(self, k: int, g: int) -> tuple[int, int]:
        """The group rows shard k of group g runs the encoder on."""
        return shard_bounds(sum(self.counts[i] for i in self.members(g)), self.shards[g])[k]

    def piece(self, k: int, m: int) -> tuple[int, int]:
        """The group rows of microbatch m that shard k of its group computes (lo >= hi: none)."""
        lo, hi = self.shard(k, self.group_of(m))
        a, b = self.rows(m)
        lo, hi = max(lo, a), min(hi, b)
        return lo, max(lo, hi)
