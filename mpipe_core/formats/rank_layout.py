"""Where a global rank sits in a tp x cp x dp x pp world, and which ranks of
such a world make one pipeline (`mpipe import-trace --layout`).

The rank order is Megatron's (`RankGenerator`, default "tp-cp-ep-dp-pp"): the
first dimension named varies fastest, so with the default order

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).

One pipeline is the pp ranks that share their tp, cp and dp coordinates (a
slice, named like `tp0/dp1`); its stage s is the rank whose pp coordinate is
s.  `ep` may appear in an order, as in Megatron's: the dense ranks' generator
has ep = 1, so it changes nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from mpipe_core.errors import MpipeError

DIMS = ("tp", "cp", "dp", "pp")
ORDER_NAMES = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = ("tp", "cp", "dp", "pp")
_PAIR = re.compile(r"\s*([A-Za-z]+)\s*=\s*(\S+?)\s*\Z")
MAX_WORLD = 1 << 20


def parse_order(text: str, where: str = "--order") -> tuple[str, ...]:
    """The dimensions of a rank order such as `tp-cp-dp-pp`, fastest-varying first."""
    names = [n.strip().lower() for n in text.strip().split("-")]
    for name in names:
        if name not in ORDER_NAMES:
            shown = f"'{name[:20]}'" if name else "an empty name"
            raise MpipeError(f"{where} {text[:60]}: unknown dimension {shown} (name tp, cp, ep, dp, pp "
                             f"joined by '-', fastest-varying first, e.g. tp-cp-dp-pp)")
        if names.count(name) > 1:
            raise MpipeError(f"{where} {text[:60]}: {name} named twice")
    return tuple(n for n in names if n != "ep")


@dataclass(frozen=True)
class RankLayout:
    """A world's sizes and rank order; one of dp and pp may be None: the rest of the world."""
    tp: int = 1
    cp: int = 1
    dp: int | None = 1
    pp: int | None = None
    order: tuple[str, ...] = DEFAULT_ORDER
    source: str = "--layout"  # where it was declared, as messages name it

    def size(self, dim: str) -> int:
        value = getattr(self, dim)
        assert value is not None, "resolve the layout against the world size first"
        return value

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.size("dp") * self.size("pp")

    def _full_order(self) -> tuple[str, ...]:
        # Dimensions an order leaves out have size 1 (checked in `with_order`): any place will do.
        return self.order + tuple(d for d in DIMS if d not in self.order)

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for dim in self._full_order():
            rank, out[dim] = divmod(rank, self.size(dim))
        return out

    def rank_of(self, coords: Mapping[str, int]) -> int:
        rank, stride = 0, 1
        for dim in self._full_order():
            rank += coords.get(dim, 0) * stride
            stride *= self.size(dim)
        return rank

    def slice_name(self, coords: Mapping[str, int]) -> str:
        """`tp0/dp1`: the coordinates other than pp (of the dimensions wider than 1, if any is)."""
        dims = [d for d in ("tp", "cp", "dp") if getattr(self, d) > 1] or ["tp", "cp", "dp"]
        return "/".join(f"{d}{coords[d]}" for d in dims)

    def describe(self) -> str:
        sizes = [f"{d}={getattr(self, d)}" for d in ("tp", "cp") if getattr(self, d) > 1]
        sizes += [f"{d}={getattr(self, d) if getattr(self, d) is not None else 'the rest'}" for d in ("dp", "pp")
                  if getattr(self, d) != 1 or d == "pp"]
        return ", ".join(sizes) + f", order {'-'.join(self.order)}"

    def with_order(self, order: tuple[str, ...], where: str) -> RankLayout:
        for dim in DIMS:
            size = getattr(self, dim)
            if dim not in order and (size is None or size > 1):
                raise MpipeError(f"{where} {'-'.join(order)} leaves out {dim}"
                                 + (f" ({dim}={size})" if size is not None else "")
                                 + "; name every dimension wider than 1")
        return RankLayout(self.tp, self.cp, self.dp, self.pp, order, self.source)

    def resolved(self, world: int | None, world_from: str) -> RankLayout:
        """This layout with dp and pp known, checked against the traces' world size."""
        rest = "dp" if self.dp is None else "pp" if self.pp is None else None
        out = self
        if rest is not None:
            known = self.tp * self.cp * (self.dp or 1) * (self.pp or 1)
            if world is None:
                raise MpipeError(f"{self.source} gives no {rest} and the traces name no world size "
                                 f"(distributedInfo.world_size): give {rest} too")
            if world % known:
                given = "*".join(d for d in DIMS if d != rest)
                raise MpipeError(f"{self.source}: {given} = {known} does not divide the traces' world size "
                                 f"{world} ({world_from})")
            sizes = {"dp": self.dp, "pp": self.pp, rest: world // known}
            out = RankLayout(self.tp, self.cp, sizes["dp"], sizes["pp"], self.order, self.source)
        if world is not None and out.world != world:
            raise MpipeError(f"{self.source} makes {out.world} ranks, but the traces' world size is {world} "
                             f"({world_from})")
        return out


def parse_layout(text: str, order: str | None = None) -> RankLayout:
    """`tp=8,dp=4,pp=8`: any of tp, cp, dp, pp; tp and cp left out are 1, and the
    one of dp and pp left out is the rest of the world (as Megatron derives dp)."""
    where = f"--layout {text.strip()[:60]}"
    sizes: dict[str, int] = {}
    for part in text.split(","):
        m = _PAIR.match(part)
        if not m:
            raise MpipeError(f"{where}: expected NAME=N pairs joined by commas, such as tp=8,dp=4,pp=8, "
                             f"not '{part.strip()[:30]}'")
        name, value = m[1].lower(), m[2]
        if name not in DIMS:
            raise MpipeError(f"{where}: unknown dimension '{name[:20]}' (tp, cp, dp, pp)")
        if name in sizes:
            raise MpipeError(f"{where}: {name} given twice")
        if not value.isdigit() or not 0 < int(value) <= MAX_WORLD:
            raise MpipeError(f"{where}: {name}={value[:20]} is not a whole number from 1 to {MAX_WORLD}")
        sizes[name] = int(value)
    if "dp" not in sizes and "pp" not in sizes:
        raise MpipeError(f"{where}: give pp or dp (the one left out is the rest of the world size)")
    sizes.setdefault("dp", None)
    layout = RankLayout(**sizes, source=f"--layout {','.join(f'{k}={v}' for k, v in sizes.items() if v)}")
    if layout.tp * layout.cp * (layout.dp or 1) * (layout.pp or 1) > MAX_WORLD:
        raise MpipeError(f"{where}: more than {MAX_WORLD} ranks")
    return layout.with_order(parse_order(order) if order is not None else DEFAULT_ORDER, "--order")


def layout_from_parallel(parallel: Any, order: str | None = None, order_where: str = "--order") -> RankLayout | None:
    """The layout a workload's `parallel` section declares (tp, cp, dp and pp
    when it has them), or None when it declares no world beyond one pipeline."""
    if not isinstance(parallel, Mapping):
        return None
    # dp left out is 1, as the workload's memory model reads it; pp left out is the rest
    sizes = {d: parallel[d] for d in DIMS if isinstance(parallel.get(d), int)
             and not isinstance(parallel.get(d), bool) and parallel[d] >= 1}
    if all(sizes.get(d, 1) == 1 for d in ("tp", "cp", "dp")):
        return None
    shown = ", ".join(f"{d}={v}" for d, v in sizes.items() if d == "pp" or v > 1)
    layout = RankLayout(**sizes, source=f"the workload's parallel section ({shown})")
    return layout.with_order(parse_order(order, order_where) if order is not None else DEFAULT_ORDER, order_where)


@dataclass
class Pipeline:
    """The ranks of one slice of a world: stage s is global rank `ranks[s]`."""
    layout: RankLayout  # resolved: pp known
    slice: str
    ranks: list[int]
    ignored: list[int]  # the global ranks of files of other slices
    ignored_files: int = 0

    def note(self) -> str:
        kept = (f"kept pipeline {self.slice} ({self.layout.describe()}): ranks {', '.join(map(str, self.ranks))} "
                f"as stages 0..{len(self.ranks) - 1}")
        if not self.ignored:
            return kept
        shown = ", ".join(map(str, self.ignored[:8])) + (", ..." if len(self.ignored) > 8 else "")
        return kept + f"; {self.ignored_files} file(s) of other pipelines ignored (ranks {shown})"


def one_pipeline(ranks: Sequence[tuple[int, str]], layout: RankLayout, world: int | None,
                 world_from: str = "") -> Pipeline:
    """The pipeline of the lowest rank given; `ranks` are (global rank, file) pairs."""
    layout = layout.resolved(world, world_from)
    for rank, source in ranks:
        if rank >= layout.world:
            raise MpipeError(f"{source}: rank {rank} is outside the world of {layout.source} "
                             f"({layout.world} ranks)")
    first = layout.coords(min(r for r, _ in ranks))
    stages = [layout.rank_of({**first, "pp": s}) for s in range(layout.size("pp"))]
    kept = set(stages)
    others = [r for r, _ in ranks if r not in kept]
    return Pipeline(layout, layout.slice_name(first), stages, sorted(set(others)), len(others))
