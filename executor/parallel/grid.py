"""The process grid: where each rank sits in a tp x cp x dp x pp world, and its groups.

The one place that knows the rank order (`mpipe_core.runs.layout.RunLayout`,
the exports' and `import-trace --order`'s tp-cp-dp-pp, tp fastest; the
arithmetic itself is `formats.rank_layout.RankLayout`'s).  Everything else
asks the grid: a rank's coordinates, the global ranks of its pipeline, the
members of its group along a dimension.

Under torch.distributed the groups are a `DeviceMesh`'s, with named
dimensions (`pp`, `dp`, `cp`, `tp`, slowest first); a dimension of size 1 is
left out of the mesh, so it creates no process group.  torchtitan's
`parallel_dims.py` is the pattern.  Threads in one process
(`rank.run_local`) use the same grid without a mesh.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpipe_core.runs.layout import RunLayout

MESH_ORDER = ("pp", "dp", "cp", "tp")  # slowest-varying first: the mesh tensor's row-major order is the rank order


@dataclass(frozen=True)
class ProcessGrid:
    layout: RunLayout

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ranks", self.layout.rank_layout())

    @property
    def world(self) -> int:
        return self.layout.world

    def size(self, dim: str) -> int:
        return getattr(self.layout, dim)

    def coords(self, rank: int) -> dict[str, int]:
        """{"tp", "cp", "dp", "pp"} coordinates of a global rank."""
        return self._ranks.coords(rank)

    def rank_of(self, coords: dict[str, int]) -> int:
        return self._ranks.rank_of(coords)

    def members(self, dim: str, rank: int) -> tuple[int, ...]:
        """The ranks that differ from `rank` only along `dim`, in that dimension's order."""
        here = self.coords(rank)
        return tuple(self.rank_of({**here, dim: i}) for i in range(self.size(dim)))

    def pipeline(self, rank: int) -> tuple[int, ...]:
        """The global ranks of `rank`'s pipeline: stage (term device) s is element s."""
        return self.members("pp", rank)

    def pipelines(self) -> list[tuple[int, ...]]:
        """Every pipeline of the world, in rank order of their first stage."""
        return [self.pipeline(r) for r in range(self.world) if self.coords(r)["pp"] == 0]

    def is_first_pipeline(self, rank: int) -> bool:
        """The pipeline at tp = cp = dp = 0: the one a run's timeline shows (as `import-trace` keeps one)."""
        c = self.coords(rank)
        return c["tp"] == c["cp"] == c["dp"] == 0

    def mesh_dims(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(names, sizes) of the mesh: the dimensions wider than 1, slowest first."""
        dims = [d for d in MESH_ORDER if self.size(d) > 1]
        return tuple(dims), tuple(self.size(d) for d in dims)

    def build_mesh(self, device_type: str) -> Any | None:
        """The world's `DeviceMesh` (a collective call: every rank, same order), or None for
        a world of one rank.  Needs an initialised default process group."""
        names, sizes = self.mesh_dims()
        if not names:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, sizes, mesh_dim_names=names)

    def adopt_groups(self, mesh: Any, transport: Any, rank: int) -> None:
        """Hand the mesh's groups of `rank` to the transport (its collectives over those members)."""
        if mesh is None:
            return
        for dim in mesh.mesh_dim_names:
            transport.adopt_group(self.members(dim, rank), mesh.get_group(dim))
