"""Data parallelism: each rank's gradients reduced over its dp group, explicitly.

Why not DDP's hooks or FSDP2's reduction: a split backward computes weight
gradients in `W` ops with `torch.autograd.grad` (`autograd_split`), which
DDP's hooks never see (pytorch#144530), and a pipeline must not reduce once
per microbatch anyway.  So, as torch pipelining's `REDUCE_GRAD` action and
Megatron's `finish_grad_sync` do, the reduction is explicit and happens once
per chunk per step:

* a chunk's parameters are packed into buckets (`bucket_elements` fp32
  elements at most); right after the chunk's last weight-gradient op of the
  step (its last `W`, or `BW`), its buckets are copied into fp32 buffers and
  their reductions launched asynchronously, so they overlap the rest of the
  backward;
* parameters whose gradient is only complete at the end of the step (the
  encoder's, after its replicas' all-reduce; parameters several parts share,
  after `models.sharing`'s sum) go in one last bucket, launched then;
* with each bucket goes a flag per parameter (does any replica have a
  gradient?), so a parameter no replica has a gradient for stays without one,
  as training alone leaves it.

The loss of each microbatch is normalised by the *global* batch's target
count (every rank can count it: batches are seeded), so the replicas'
gradients *sum* to the single-process gradient of the global batch (Megatron's
per-token loss form; with equal token counts per replica it is the mean of
per-replica means).  Reductions are SUM, in fp32.

ZeRO-1 (`distributed_optimizer`): each bucket is reduce-scattered instead;
this rank keeps the reduced slice `[index * shard, (index + 1) * shard)` of
the bucket's flat buffer, steps exactly those parameter elements (views of
fp32 parameters, fp32 copies of others; the optimizer is elementwise, so its
state is sharded with them), then all-gathers the updated slices into every
replica's parameters.

Every launch and the optimizer step are timed (`rows`): from the launch to
the reduction's completion (its future's callback where the backend gives
one, else the wait that saw it done).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .tensor_parallel import local_tensor as _local

DP_REDUCE, DP_GATHER, OPTIMIZER = "dp_comm", "dp_gather", "optimizer"


@dataclass
class DataParallel:
    """A rank's place in its dp group: who it reduces with, and how."""

    transport: Any  # the world's transport (global ranks)
    members: tuple[int, ...]  # the dp group, global ranks in dp order
    index: int  # this rank's dp coordinate
    global_rank: int
    zero: bool = False  # ZeRO-1: reduce-scatter, sharded optimizer step, all-gather
    # Which share of the global batch this rank trains on, of how many: its dp coordinate
    # and dp, where the group is wider than dp (context parallelism reduces over dp x cp:
    # the cp ranks of a replica hold blocks of the same microbatches).  None: index, size.
    data_replica: int | None = None
    data_replicas: int | None = None
    bucket_elements: int = 1 << 22  # 16 MiB of fp32 per bucket at most
    # Test hooks (mutations the gradient check must catch): {"kind": "drop_dp_grad" |
    # "skip_zero_gather", "global_rank": r}.
    fault: dict | None = None

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def replica(self) -> int:
        return self.index if self.data_replica is None else self.data_replica

    @property
    def replicas(self) -> int:
        return self.size if self.data_replicas is None else self.data_replicas

    def _fault(self, kind: str) -> bool:
        f = self.fault
        return bool(f) and f.get("kind") == kind and f.get("global_rank") == self.global_rank


@dataclass
class _Bucket:
    chunk: int  # -1: the end-of-step bucket
    params: list[tuple[str, torch.nn.Parameter]]
    offsets: list[int]
    numel: int
    shard: int  # elements per dp rank (the buffer is padded to size * shard)
    buf: torch.Tensor | None = None
    flags: torch.Tensor | None = None
    out: torch.Tensor | None = None  # ZeRO: this rank's reduced slice
    works: list = field(default_factory=list)
    start: float = 0.0
    end: float | None = None


@dataclass
class _Piece:
    """ZeRO: the elements [a, b) of a parameter (flattened) that this rank's shard holds."""

    bucket: _Bucket
    name: str
    param: torch.nn.Parameter
    a: int
    b: int
    at: int  # where they start in the shard
    j: int  # the parameter's place in its bucket
    master: torch.nn.Parameter  # what the optimizer steps: the fp32 slice (a view of an fp32 parameter)


def _split(params: list[tuple[str, torch.nn.Parameter]], limit: int) -> list[list]:
    groups, current, size = [], [], 0
    for name, p in params:
        if current and size + p.numel() > limit:
            groups.append(current)
            current, size = [], 0
        current.append((name, p))
        size += p.numel()
    return groups + ([current] if current else [])


class GradientSync:
    """The reduction of one rank's gradients over dp, step by step."""

    def __init__(self, dp: DataParallel, chunk_params: dict[int, list[tuple[str, torch.nn.Parameter]]],
                 rest: list[tuple[str, torch.nn.Parameter]], last_weight_op: dict[int, int], device):
        self.dp = dp
        self.device = device
        self.last_weight_op = last_weight_op  # op index -> the chunk whose last weight-gradient op it is
        self.buckets: list[_Bucket] = []
        for chunk in sorted(chunk_params):
            self.buckets += [self._bucket(chunk, g) for g in _split(chunk_params[chunk], dp.bucket_elements)]
        self.buckets += [self._bucket(-1, g) for g in _split(rest, dp.bucket_elements)]
        self.pieces: list[_Piece] = self._pieces() if dp.zero else []
        self.rows: list[tuple[str, int, float, float]] = []  # (kind, chunk, start, end) of this step
        self.reduced: set[str] = set()  # parameters some replica had a gradient for, in any step so far

    def _bucket(self, chunk: int, params) -> _Bucket:
        offsets, n = [], 0
        for _, p in params:
            offsets.append(n)
            n += _local(p).numel()  # a tp-sharded parameter: its local shard (same tp coordinate)
        shard = -(-n // self.dp.size)
        return _Bucket(chunk, params, offsets, n, shard)

    def _pieces(self) -> list[_Piece]:
        out = []
        for b in self.buckets:
            lo, hi = self.dp.index * b.shard, (self.dp.index + 1) * b.shard
            for j, ((name, p), o) in enumerate(zip(b.params, b.offsets)):
                a, z = max(lo, o), min(hi, o + _local(p).numel())
                if a < z:
                    # fp32 parameters: the slice itself (a view: no second copy, stepped in place);
                    # others get an fp32 master copy.
                    flat = _local(p.detach()).view(-1)[a - o:z - o]
                    master = torch.nn.Parameter(flat if p.dtype == torch.float32 else flat.float().clone())
                    out.append(_Piece(b, name, p, a - o, z - o, a - lo, j, master))
        return out

    def masters(self) -> list[torch.nn.Parameter]:
        """What a ZeRO optimizer steps: this rank's fp32 slices."""
        return [piece.master for piece in self.pieces]

    # ------------------------------------------------------------------ the step

    def after_op(self, index: int) -> None:
        """Called after op `index` of the rank's plan: launch the chunk's buckets if it was its last W."""
        chunk = self.last_weight_op.get(index)
        if chunk is not None:
            for b in self.buckets:
                if b.chunk == chunk:
                    self._launch(b)

    def finish_step(self) -> None:
        """Launch what is left (the end-of-step bucket), wait for every reduction and
        hand out the results: reduced gradients, or with ZeRO this rank's slices."""
        for b in self.buckets:
            if b.buf is None:
                self._launch(b)
        for b in self.buckets:
            self.dp.transport.wait(b.works)
            end = b.end if b.end is not None else time.perf_counter()
            self.rows.append((DP_REDUCE, b.chunk, b.start, end))
            self.reduced.update(name for (name, _), flag in zip(b.params, b.flags.tolist()) if flag > 0)
            if not self.dp.zero:
                self._write_back(b)
        if self.dp.zero:
            for piece in self.pieces:
                b = piece.bucket
                have = b.flags[piece.j] > 0
                piece.master.grad = b.out[piece.at:piece.at + piece.b - piece.a].clone() if have else None
            for b in self.buckets:
                for _, p in b.params:
                    p.grad = None  # the reduced gradient lives in this rank's slices only
        for b in self.buckets:
            b.buf = b.flags = None
            b.works = []
            b.end = None

    def _launch(self, b: _Bucket) -> None:
        dp = self.dp
        b.start = time.perf_counter()
        b.buf = torch.zeros(b.shard * dp.size, dtype=torch.float32, device=self.device)
        b.flags = torch.zeros(len(b.params), dtype=torch.float32, device=self.device)
        for j, ((_, p), o) in enumerate(zip(b.params, b.offsets)):
            if p.grad is not None:
                g = _local(p.grad.detach())
                b.buf[o:o + g.numel()].copy_(g.reshape(-1))
                b.flags[j] = 1.0
        if dp._fault("drop_dp_grad"):  # a mutation: this replica's gradient never arrives
            b.buf.zero_()
        b.works = list(dp.transport.all_reduce(b.flags, dp.members))
        if dp.zero:
            b.out = torch.empty(b.shard, dtype=torch.float32, device=self.device)
            b.works += dp.transport.reduce_scatter(b.out, b.buf, dp.members)
        else:
            b.works += dp.transport.all_reduce(b.buf, dp.members)
        last = b.works[-1] if b.works else None
        if last is not None and hasattr(last, "get_future"):
            def done(_fut, bucket=b):
                bucket.end = time.perf_counter()
            try:
                last.get_future().add_done_callback(done)
            except RuntimeError:  # gloo's emulated reduce-scatter has no future: timed to its wait
                pass

    def _write_back(self, b: _Bucket) -> None:
        for j, ((_, p), o) in enumerate(zip(b.params, b.offsets)):
            if b.flags[j] > 0 and p.grad is not None and p.grad is not _local(p.grad):  # a DTensor: its shard
                g = _local(p.grad)
                g.copy_(b.buf[o:o + g.numel()].view_as(g))
            elif b.flags[j] > 0:
                p.grad = b.buf[o:o + p.numel()].view_as(p).to(p.dtype).clone()
            else:
                p.grad = None

    # ------------------------------------------------------------------ ZeRO-1

    def gradient_pieces(self) -> dict[str, list]:
        """ZeRO: name -> [(a, b, reduced gradient elements [a, b) of the flattened parameter)]."""
        out: dict[str, list] = {}
        for piece in self.pieces:
            if piece.master.grad is not None:
                out.setdefault(piece.name, []).append(
                    (piece.a, piece.b, piece.master.grad.detach().to("cpu").clone()))
        return out

    def sharded_step(self, optimizer) -> None:
        """ZeRO: step this rank's slices, then all-gather every replica's updated slices
        into the parameters (timed: the step as `optimizer`, the gather as `dp_gather`)."""
        t0 = time.perf_counter()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        self.rows.append((OPTIMIZER, -1, t0, time.perf_counter()))
        for b in self.buckets:
            t0 = time.perf_counter()
            mine = [piece for piece in self.pieces if piece.bucket is b]
            with torch.no_grad():
                shard = torch.zeros(b.shard, dtype=torch.float32, device=self.device)
                for piece in mine:
                    shard[piece.at:piece.at + piece.b - piece.a].copy_(piece.master)
                full = torch.empty(b.shard * self.dp.size, dtype=torch.float32, device=self.device)
                self.dp.transport.wait(self.dp.transport.all_gather(full, shard, self.dp.members))
                if self.dp._fault("skip_zero_gather"):
                    # A mutation: this rank takes only its own slices, as if it had skipped the
                    # gather (it still joins the collective, so the others do not hang).
                    lo = self.dp.index * b.shard
                    full = full.clone()
                    for (_, p), o in zip(b.params, b.offsets):
                        q = _local(p.detach())
                        outside = torch.ones(q.numel(), dtype=torch.bool, device=self.device)
                        outside[max(lo - o, 0):max(min(lo + b.shard - o, q.numel()), 0)] = False
                        full[o:o + q.numel()][outside] = q.reshape(-1).float()[outside]
                for (_, p), o in zip(b.params, b.offsets):
                    q = _local(p.detach())
                    q.view(-1).copy_(full[o:o + q.numel()].to(q.dtype))
            self.rows.append((DP_GATHER, b.chunk, t0, time.perf_counter()))

    def take_rows(self) -> list[tuple[str, int, float, float]]:
        rows, self.rows = self.rows, []
        return rows


def last_weight_ops(ops, module: str, kinds: tuple[str, ...]) -> dict[int, int]:
    """op index -> chunk, for each chunk's last op of `kinds` on `module` in a rank's op list."""
    last: dict[int, int] = {}
    for i, p in enumerate(ops):
        if p.op.module == module and p.op.kind in kinds:
            last[p.op.chunk] = i
    return {i: c for c, i in last.items()}
