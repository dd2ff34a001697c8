"""A schedule: a placement of ops on devices plus a total order per device."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Iterator

from .ops import LLM, Op, with_replica


@dataclass(frozen=True)
class Pipeline:
    """One copy of the LLM that a schedule trains: its chunk count and microbatches.

    `par` and `overlay` put a second copy (replica 1, module `llm@1`) beside the
    first; `repeat`/`seq` add training steps.
    """

    replica: int
    chunks: int
    microbatches: int
    steps: int = 1
    # LLM layers per chunk (`partition`, `balanced`); None: split evenly.
    layers: tuple[int, ...] | None = None
    # Encoder layers per chunk once `balanced` folded the encoders into the
    # chain (they then run inside the chunks' F/B/W ops); None: separate ops.
    encoder_layers: tuple[int, ...] | None = None

    @property
    def module(self) -> str:
        return with_replica(LLM, self.replica)


@dataclass(frozen=True)
class Schedule:
    orders: tuple[tuple[Op, ...], ...]
    pipelines: tuple[Pipeline, ...]
    # Encoder names whose ops this schedule has placed (empty: LLM only).
    encoders: tuple[str, ...] = ()

    @property
    def devices(self) -> int:
        return len(self.orders)

    @property
    def num_ops(self) -> int:
        return sum(len(order) for order in self.orders)

    def ops(self) -> Iterator[Op]:
        for order in self.orders:
            yield from order

    def placement(self) -> dict[Op, int]:
        return {op: d for d, order in enumerate(self.orders) for op in order}

    def pipeline(self, module: str) -> Pipeline:
        for p in self.pipelines:
            if p.module == module:
                return p
        raise KeyError(module)

    def with_orders(self, orders: Iterable[Iterable[Op]], **changes) -> "Schedule":
        return replace(self, orders=tuple(tuple(o) for o in orders), **changes)

    def llm_only(self) -> "Schedule":
        """The same schedule with every encoder op removed (transpose's invariant)."""
        from .ops import is_llm

        return self.with_orders(
            ([op for op in order if is_llm(op)] for order in self.orders), encoders=()
        )


def single_pipeline(orders: list[list[Op]], chunks: int, microbatches: int) -> Schedule:
    """Wrap a generator's per-device orders of the one LLM copy."""
    return Schedule(
        orders=tuple(tuple(o) for o in orders),
        pipelines=(Pipeline(replica=0, chunks=chunks, microbatches=microbatches),),
    )
