"""One pipeline's view of the world's transport.

An execution plan names the term's devices 0..pp-1; in a world of several
pipelines (dp, tp, cp > 1) device s of this rank's pipeline is the global
rank `grid.pipeline(rank)[s]`.  This view translates every device index the
runtime passes (message peers, collective members, a broadcast's source) to
global ranks, so the runtime runs one pipeline exactly as it does alone.

Group creation is a collective call over the whole world (every rank, the
same groups in the same order), so `setup` creates the groups of *every*
pipeline, in the grid's order, not only this one's.
"""
from __future__ import annotations

from typing import Any

from .grid import ProcessGrid


class PipelineTransport:
    def __init__(self, inner: Any, grid: ProcessGrid, rank: int):
        self.inner = inner
        self.grid = grid
        self.ranks = grid.pipeline(rank)
        self.rank = self.ranks.index(rank)  # this rank's stage: its device in the plan
        self.world = len(self.ranks)

    def _g(self, device: int) -> int:
        return self.ranks[device]

    def _members(self, members) -> tuple[int, ...]:
        return tuple(self._g(d) for d in members)

    def setup(self, channels, groups, shaped: bool = False) -> None:
        all_channels, all_groups = [], []
        for line in self.grid.pipelines():
            all_channels += [(line[a], line[b]) for a, b in channels]
            all_groups += [tuple(line[d] for d in members) for members in groups]
        self.inner.setup(all_channels, all_groups, shaped=shaped)

    def post(self, sends, recvs):
        return self.inner.post([(self._g(d), t) for d, t in sends], [(self._g(s), t) for s, t in recvs])

    def wait(self, works) -> None:
        self.inner.wait(works)

    def post_shaped(self, sends):
        return self.inner.post_shaped([(self._g(d), t) for d, t in sends])

    def post_shaped_recv(self, src: int, device):
        return self.inner.post_shaped_recv(self._g(src), device)

    def wait_shaped(self, handle):
        return self.inner.wait_shaped(handle)

    def broadcast(self, tensor, src: int, members):
        return self.inner.broadcast(tensor, self._g(src), self._members(members))

    def all_reduce(self, tensor, members):
        return self.inner.all_reduce(tensor, self._members(members))
