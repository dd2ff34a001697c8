"""`encoder_shard`: a replicated trainable encoder's state sharded over its copies.

A term may train several copies of the tower in one pipeline (transpose's
copies under `backward=owner`, colocated's shares: the plan's `AR` group), and
every dp x cp replica of the pipeline holds them again: N = k x dp x cp
copies in all (k = 1 where one device of the pipeline trains it).  Without
sharding each copy all-reduces its gradient in the pipeline (`AR`), the dp
reduction sums it over dp x cp, and every copy steps the whole tower.  With
`encoder_shard` those two reductions become one collective over the N copies'
ranks (`copy_members`), launched where the plan's `AR` op is (at the end of
the step where it has none), and each copy updates 1/N of the tower:

* ``optimizer`` (ZeRO-1 over the copies): the gradient is all-reduced over
  the N copies, so each keeps it whole; each copy steps only its slice of
  the tower's elements (the optimizer's state exists for that slice only),
  then the updated slices are all-gathered into every copy's parameters;
* ``gradients`` (ZeRO-2): the gradient is reduce-scattered instead, each copy
  keeping only its slice of it, then the same sharded step and all-gather.

The machinery is `data_parallel.GradientSync`'s ZeRO path (flat fp32 buckets,
one flag per parameter, fp32 master slices that are views of fp32 parameters,
the sharded step and the gather), run over the copies' group instead of the
dp group; the runtime leaves the encoder's parameters out of its own dp
reduction and optimizer.  The plan's `BCAST` still broadcasts the owner's
parameters to the forward-only replicas in the pipeline (the copies already
agree after the gather).

Memory each copy keeps, as `memory_meter` counts a rank's static bytes:
its parameters whole; the gradient whole under ``optimizer``, its slice under
``gradients`` (the copy's own gradient is summed over its microbatches before
the reduce-scatter: that working buffer is freed by it, as ZeRO-2's buckets
are, and is not state the copy keeps); the optimizer's state of its slice.
`executor.analysis.layout_memory.sharded_profile` turns a profiled workload's
encoder figures into the simulator's `sharded_static` form for a layout, so
the two meet.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mpipe_core.ir.ops import BW, B, W

from .data_parallel import DataParallel, GradientSync
from .tensor_parallel import local_tensor

MODES = ("optimizer", "gradients")
_AT_AR = 0  # the key its one bucket group is launched by (`GradientSync.after_op`)


def trained_copies(plan) -> tuple[int, ...]:
    """The pipeline devices that train a copy of the encoder: the `AR` group, or the
    one device that runs its backward (none: a frozen encoder, or one folded into chunks)."""
    if plan.ar_group:
        return tuple(plan.ar_group)
    if plan.encoder is None or not plan.trainable:
        return ()
    return tuple(sorted({d for d, rp in enumerate(plan.ranks) for p in rp.ops
                         if p.op.module == plan.encoder and p.op.kind in (B, W, BW)}))


def copy_members(grid: Any, plan, rank: int) -> tuple[int, ...]:
    """The global ranks of `rank`'s N copies (its tp coordinate; every trained copy's
    stage, dp and cp coordinate), in rank order."""
    tp = grid.coords(rank)["tp"]
    return tuple(sorted(grid.rank_of({"tp": tp, "cp": c, "dp": d, "pp": s}) for s in trained_copies(plan)
                        for d in range(grid.size("dp")) for c in range(grid.size("cp"))))


def copy_groups(grid: Any, plan) -> list[tuple[int, ...]]:
    """Every tp coordinate's group of copies (what each rank must create, in one order)."""
    if not trained_copies(plan):
        return []
    firsts = [grid.rank_of({"tp": t, "cp": 0, "dp": 0, "pp": trained_copies(plan)[0]}) for t in range(grid.size("tp"))]
    return [copy_members(grid, plan, r) for r in firsts]


@dataclass
class EncoderCopies:
    """This rank's place among the encoder's copies: whom it shards the tower's state with."""

    mode: str  # optimizer | gradients
    transport: Any  # the world's transport (global ranks)
    members: tuple[int, ...]  # the N copies' global ranks, in rank order
    global_rank: int
    # {"kind": "skip_encoder_gather", "global_rank": r}: that rank takes only its own slices
    # after the step, as if it had skipped the all-gather (a mutation the check must catch).
    fault: dict | None = None

    @property
    def index(self) -> int:
        return self.members.index(self.global_rank)


def encoder_copies(grid: Any, plan, rank: int, transport: Any, mode: str, fault: dict | None = None
                   ) -> EncoderCopies | None:
    """Create the copies' groups (a collective call: every rank, same order) and return
    `rank`'s place, or None where nothing is sharded (mode none, no trained copy here,
    or a single copy in all)."""
    if mode == "none":
        return None
    groups = [g for g in copy_groups(grid, plan) if len(g) > 1]
    if groups:
        transport.setup([], groups)
    members = copy_members(grid, plan, rank) if trained_copies(plan) else ()
    if rank not in members or len(members) < 2:
        return None
    return EncoderCopies(mode, transport, members, rank, fault)


class _WholeGradient(GradientSync):
    """``optimizer``: the gradient all-reduced whole (each copy keeps it), each copy's
    slices stepped from their views of it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.pieces = self._pieces()

    def finish_step(self) -> None:
        super().finish_step()
        for piece in self.pieces:
            g = piece.param.grad
            # (a tp-sharded tower's gradient is a DTensor: its slices are of the local shard)
            piece.master.grad = None if g is None else local_tensor(g).detach().view(-1)[piece.a:piece.b].float()


class EncoderShard:
    """One copy's side of the sharded encoder: reduce, step its slice, gather; timed as
    the dp reduction's rows (`dp_comm`, `optimizer`, `dp_gather`, chunk -1)."""

    def __init__(self, copies: EncoderCopies, params: list[tuple[str, torch.nn.Parameter]], optimizer, device):
        if copies.mode not in MODES:
            raise ValueError(f"unknown encoder_shard {copies.mode!r} (known: none, {', '.join(MODES)})")
        fault = copies.fault
        mutation = ({"kind": "skip_zero_gather", "global_rank": fault.get("global_rank")}
                    if fault and fault.get("kind") == "skip_encoder_gather" else None)
        dp = DataParallel(copies.transport, copies.members, copies.index, copies.global_rank,
                          zero=copies.mode == "gradients", fault=mutation)
        kind = GradientSync if copies.mode == "gradients" else _WholeGradient
        self.params, self.copies = params, copies
        self.ids = {id(p) for _, p in params}
        self.sync = kind(dp, {}, params, {_AT_AR: -1}, device)
        self.opt = optimizer.build(self.sync.masters())

    def launch(self) -> None:
        """Launch the reduction over the copies (the plan's `AR` op; else `finish_step` does)."""
        self.sync.after_op(_AT_AR)

    def finish_step(self) -> None:
        """Wait for the reduction; each copy now holds its gradient slices (and, under
        ``optimizer``, the whole reduced gradient)."""
        self.sync.finish_step()

    def kept_gradients(self) -> list[torch.Tensor]:
        """The gradient this copy keeps for its step: whole, or its slices."""
        if self.sync.dp.zero:
            return [m.grad for m in self.sync.masters() if m.grad is not None]
        return [p.grad for _, p in self.params if p.grad is not None]

    def step(self, skip: bool = False) -> None:
        """Step this copy's slices (not with `skip`: a mutation), gather every copy's."""
        self.sync.sharded_step(None if skip else self.opt)
        if skip and self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        for _, p in self.params:
            p.grad = None

    def gradient_pieces(self) -> dict[str, list]:
        return self.sync.gradient_pieces()

    @property
    def reduced(self) -> set[str]:
        return self.sync.reduced

    def take_rows(self) -> list[tuple[str, int, float, float]]:
        return self.sync.take_rows()
