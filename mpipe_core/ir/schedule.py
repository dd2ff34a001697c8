"""A schedule: a placement of ops on devices plus a total order per device."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator

import numpy as np

from mpipe_core.ir.ops import LLM, Op, with_replica


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
    # `recompute`: per chunk (full, selective), the chunk's first `full`
    # layers are fully recomputed before their backward and the next
    # `selective` ones selectively (a chunk's layers: the encoder layers
    # `balanced` folded into it, then its LLM layers); None: nothing is.
    recompute: tuple[tuple[int, int], ...] | None = None
    # `recompute(..., encoders=yes|only)`: the mode ("full" or "selective") in
    # which trained encoders that run as ops of their own (transpose's copies,
    # colocated's shares, disaggregate's devices) recompute their forward
    # before their backward; None: they keep their activations.
    encoder_recompute: str | None = None
    # Microbatches one encoder op serves (`encoder_batch`): group g holds
    # microbatches g*k .. g*k+k-1 (the last may hold fewer), and its encoder
    # ops carry the group's first microbatch.  1: one op per microbatch.
    encoder_batch: int = 1
    # Devices that run only this copy's encoders (`disaggregate`), after its
    # LLM devices; 0: none.
    encoder_devices: int = 0

    @property
    def module(self) -> str:
        return with_replica(LLM, self.replica)

    def group_of(self, mb: int) -> int:
        """The first microbatch of the encoder group that serves `mb`."""
        return mb - mb % self.encoder_batch

    def groups(self) -> list[tuple[int, int]]:
        """(first microbatch, size) of every encoder group, in microbatch order."""
        k, M = self.encoder_batch, self.microbatches
        return [(g, min(k, M - g)) for g in range(0, M, k)]


@dataclass(frozen=True, eq=False)
class LlmColumns:
    """A one-pipeline LLM schedule's ops as integer columns, row for row as
    `Schedule.ops()` yields them: kind (an index into `ops.COMPUTE_KINDS`),
    chunk and microbatch; every op is of module `llm`, step 0.  A generator
    that builds its ops from such columns hands them over, so the simulator's
    fast path need not unzip 100k+ op tuples again."""

    kind: np.ndarray
    chunk: np.ndarray
    mb: np.ndarray


@dataclass(frozen=True)
class Schedule:
    orders: tuple[tuple[Op, ...], ...]
    pipelines: tuple[Pipeline, ...]
    # Encoder names whose ops this schedule has placed (empty: LLM only).
    encoders: tuple[str, ...] = ()
    # `orders` as columns, when the generator built them (None otherwise; any
    # new orders drop them, see `with_orders`).
    llm_columns: LlmColumns | None = field(default=None, compare=False, repr=False)

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
        return replace(self, orders=tuple(tuple(o) for o in orders), **{"llm_columns": None, **changes})

    def llm_only(self) -> "Schedule":
        """The same schedule with every encoder op removed (transpose's invariant)."""
        from mpipe_core.ir.ops import is_llm

        return self.with_orders(
            ([op for op in order if is_llm(op)] for order in self.orders), encoders=()
        )


def single_pipeline(orders: list[list[Op]], chunks: int, microbatches: int,
                    columns: LlmColumns | None = None) -> Schedule:
    """Wrap a generator's per-device orders of the one LLM copy (and the same
    ops as columns, if it built them)."""
    return Schedule(
        orders=tuple(tuple(o) for o in orders),
        pipelines=(Pipeline(replica=0, chunks=chunks, microbatches=microbatches),),
        llm_columns=columns,
    )
