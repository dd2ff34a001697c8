"""Context parallelism on any device: the sequence split over the cp ranks.

Each of a pipeline's cp copies holds the contiguous block
`[index * s, (index + 1) * s)` of every microbatch's sequence (s = T / cp):

* the embedding runs on the whole microbatch (it is cheap, and the image
  features land at their positions) and keeps this rank's block; every
  activation and gradient the pipeline sends is that block
  (`ContextParallelModel.hidden_shape`);
* attention (Llama 3's all-gather form): each layer all-gathers K and V (one
  collective, K and V stacked, sequence first) over the cp group with an
  autograd-aware collective, whose backward reduce-scatters the K/V gradient
  back to the block that produced it; the queries stay local and the causal
  mask is offset by the block's start (query i sees keys j <= index * s + i;
  keys after the block's last query are not used at all);
* the head and the loss see this block's targets; the loss stays divided by
  the target count of the whole sequence (of the global batch), so the cp
  ranks' losses and gradients *sum* to the unsplit ones, and the
  data-parallel reduction runs over dp x cp (`run_job` builds that group).

On torch.distributed the all-gather is
`torch.distributed._functional_collectives.all_gather_single_autograd` (the
2.13 name of `all_gather_tensor_autograd`) on the mesh's `cp` group; ranks as
threads of one process use the transport's all-gather and reduce-scatter in an
autograd function of the same shape.  torch's own `context_parallel` swaps GPU
attention kernels only, so it cannot serve the CPU path.

Blocks are contiguous, not Llama 3's load-balanced halves: the last block
does cp x the first one's attention work.  Every gather and its backward is
timed (`CP_COMM` rows: (kind, chunk, start, end), perf_counter seconds; the
backward's is from the gathered gradient's arrival to the local one's).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

CP_COMM = "cp_comm"


@dataclass
class ContextParallel:
    """A rank's place in its cp group and how it gathers along the sequence."""

    index: int  # this rank's cp coordinate: which block of the sequence it holds
    size: int
    # Autograd-aware all-gather along dim 0 over the cp group, blocks in cp order.
    gather: Callable[[torch.Tensor], torch.Tensor]
    global_rank: int = 0
    # Test hook (a mutation the gradient check must catch): {"kind": "cp_mask_offset",
    # "global_rank": r}: rank r masks as if its block started at position 0.
    fault: dict | None = None
    rows: list[tuple[str, int, float, float]] = field(default_factory=list)
    # When the gathered K/V's gradient arrived in the backward (the reduce-scatter's start).
    _backward_start: float | None = None

    def block(self, length: int) -> tuple[int, int]:
        """[lo, hi) of this rank's block of a sequence of `length` positions."""
        if length % self.size:
            raise ValueError(f"context parallelism: a sequence of {length} positions does not split "
                             f"over cp={self.size}")
        s = length // self.size
        return self.index * s, (self.index + 1) * s

    def local(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        lo, hi = self.block(t.shape[dim])
        return t.narrow(dim, lo, hi - lo)

    def mask_offset(self, s: int) -> int:
        f = self.fault
        if f and f.get("kind") == "cp_mask_offset" and f.get("global_rank") == self.global_rank:
            return 0
        return self.index * s

    def timed_gather(self, t: torch.Tensor, chunk: int) -> torch.Tensor:
        t = _BackwardMark.apply(t, self, chunk, "end")
        t0 = time.perf_counter()
        full = self.gather(t.contiguous())
        _wait(full)
        self.rows.append((CP_COMM, chunk, t0, time.perf_counter()))
        return _BackwardMark.apply(full, self, chunk, "start")

    def take_rows(self) -> list[tuple[str, int, float, float]]:
        rows, self.rows = self.rows, []
        return rows


def _wait(t: torch.Tensor) -> None:
    """Complete a functional collective's result now (so its time is the collective's)."""
    trigger = getattr(t, "trigger_wait", None)  # AsyncCollectiveTensor
    if trigger is not None:
        trigger()


class _BackwardMark(torch.autograd.Function):
    """Identity; in the backward it notes when the gradient passes: "start" after the
    gather (the gathered gradient arrived), "end" before it (the reduce-scattered one did)."""

    @staticmethod
    def forward(ctx, x, cp, chunk, which):
        ctx.cp, ctx.chunk, ctx.which = cp, chunk, which
        if hasattr(x, "trigger_wait"):
            # A functional collective's result (AsyncCollectiveTensor, storage-less): a plain
            # copy, so what autograd saves from here on is an ordinary tensor.
            return x.clone()
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        cp = ctx.cp
        if ctx.which == "start":
            cp._backward_start = time.perf_counter()
        else:
            _wait(grad)
            start = cp._backward_start
            if start is not None:
                cp.rows.append((CP_COMM, ctx.chunk, start, time.perf_counter()))
                cp._backward_start = None
        return grad, None, None, None


# --------------------------------------------------------------------------- gathers

def functional_gather(group: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch.distributed's autograd-aware all-gather on `group` (a ProcessGroup)."""
    from torch.distributed import _functional_collectives as funcol

    def gather(t: torch.Tensor) -> torch.Tensor:
        return funcol.all_gather_single_autograd(t, 0, group)

    return gather


class _TransportGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, transport, members):
        ctx.transport, ctx.members = transport, members
        out = x.new_empty((x.shape[0] * len(members),) + tuple(x.shape[1:]))
        transport.wait(transport.all_gather(out, x, members))
        return out

    @staticmethod
    def backward(ctx, grad):
        n = grad.shape[0] // len(ctx.members)
        out = grad.new_empty((n,) + tuple(grad.shape[1:]))
        ctx.transport.wait(ctx.transport.reduce_scatter(out, grad.contiguous(), ctx.members))
        return out, None, None


def transport_gather(transport: Any, members: tuple[int, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The same collective over the runtime's transport (ranks as threads: `LocalTransport`)."""
    return lambda t: _TransportGather.apply(t, transport, members)


# --------------------------------------------------------------------------- attention

class ContextParallelAttention:
    """One causal attention layer's core, (q, k, v, mask) -> y on this rank's block of
    queries, installed as the built-in `Attention.core`."""

    def __init__(self, cp: ContextParallel, chunk: int):
        self.cp, self.chunk = cp, chunk

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None) -> torch.Tensor:
        if mask is not None:  # a packed microbatch's block-diagonal mask spans the whole sequence
            raise ValueError("context parallelism does not run packed microbatches (--data) yet")
        n, h, s, d = q.shape
        lo = self.cp.mask_offset(s)
        hi = (self.cp.index + 1) * s  # keys after this block's last query: masked for every query
        kv = torch.stack([k, v]).permute(3, 0, 1, 2, 4)  # (s, 2, n, h, d): the sequence first
        full = self.cp.timed_gather(kv, self.chunk)[:hi]
        k_all, v_all = full.permute(1, 2, 3, 0, 4).unbind(0)  # each (n, h, hi, d)
        rows = torch.arange(s, device=q.device).unsqueeze(1) + lo
        allowed = torch.arange(hi, device=q.device).unsqueeze(0) <= rows  # (s, hi)
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=allowed)


class _LocalBlock(nn.Module):
    """The embedding, keeping this rank's block of the sequence."""

    def __init__(self, embedding: nn.Module, cp: ContextParallel):
        super().__init__()
        self.inner = embedding
        self.cp = cp

    def forward(self, batch, features):
        return self.cp.local(self.inner(batch, features), dim=1)


class ContextParallelModel:
    """A `PipelineModel` (`runtime.models.protocol`) run on this rank's block of the
    sequence: same parts and parameters, attention swapped for the cp core."""

    def __init__(self, inner: Any, cp: ContextParallel):
        self.inner, self.cp = inner, cp
        self.name, self.root, self.encoder = inner.name, inner.root, inner.encoder
        self.layers, self.head = inner.layers, inner.head
        self.embedding = _LocalBlock(inner.embedding, cp)

    def __getattr__(self, name: str) -> Any:  # make_batch, target_count, feature_shape, ...
        return getattr(self.inner, name)

    def context(self, batch):
        if "pieces" in batch.fields:
            raise ValueError("context parallelism does not run packed microbatches (--data) yet")
        return self.inner.context(batch)

    def hidden_shape(self, batch) -> tuple[int, ...]:
        shape = list(self.inner.hidden_shape(batch))
        lo, hi = self.cp.block(shape[1])
        shape[1] = hi - lo
        return tuple(shape)

    def loss(self, logits: torch.Tensor, batch, normalizer: int) -> torch.Tensor:
        """This block's summed token loss over the whole (global) batch's target count."""
        fields = {**batch.fields, "targets": self.cp.local(batch["targets"], dim=1)}
        return self.inner.loss(logits, type(batch)(batch.images, fields), normalizer)


def causal_attentions(layer: nn.Module) -> list[nn.Module]:
    """A layer's causal attentions that take a core (the built-in `runtime.model.Attention`:
    its `core` attribute replaces the local attention; this room does not import the runtime)."""
    return [m for m in layer.modules() if hasattr(m, "core") and getattr(m, "causal", False) is True]


def supports_context_parallel(model: Any) -> bool:
    """Every layer has the built-in causal attention (plug-ins and HF models: not yet)."""
    return all(causal_attentions(layer) for layer in model.layers)


def context_parallel_model(model: Any, cp: ContextParallel, layer_chunks: dict[int, int]) -> ContextParallelModel:
    """`model` run on this rank's block: every layer's attention gathers K/V over cp
    (`layer_chunks`: layer index -> its chunk, for the timing rows)."""
    if not supports_context_parallel(model):
        raise ValueError(f"model '{model.name}' has no context-parallel attention (run it with cp=1)")
    for i, layer in enumerate(model.layers):
        for attn in causal_attentions(layer):
            attn.core = ContextParallelAttention(cp, layer_chunks.get(i, -1))
    return ContextParallelModel(model, cp)


# --------------------------------------------------------------------------- wiring

def reduction_members(grid: Any, rank: int) -> tuple[int, ...]:
    """The ranks `rank`'s gradients are summed over: its dp x cp group (same tp and pp),
    in rank order (the order of the mesh's flattened dp-cp dimension)."""
    here = grid.coords(rank)
    return tuple(sorted(grid.rank_of({**here, "dp": d, "cp": c})
                        for d in range(grid.size("dp")) for c in range(grid.size("cp"))))


def adopt_reduction_group(mesh: Any, grid: Any, transport: Any, rank: int) -> None:
    """With dp and cp both > 1: the mesh's dp and cp dimensions flattened into one group
    (a collective call, once per mesh), handed to the transport for the dp x cp reduction.
    (With one of them 1 the other's own dimension is that group.)"""
    if mesh is None or grid.size("dp") == 1 or grid.size("cp") == 1:
        return
    flat = mesh["dp", "cp"]._flatten("dp_cp")
    transport.adopt_group(reduction_members(grid, rank), flat.get_group())


def rank_context_parallel(grid: Any, rank: int, transport: Any, mesh: Any, fault: dict | None = None
                          ) -> ContextParallel:
    """This rank's cp place: the mesh's cp group's functional all-gather under
    torch.distributed, the transport's between threads (no mesh)."""
    members = grid.members("cp", rank)
    gather = functional_gather(mesh.get_group("cp")) if mesh is not None else transport_gather(transport, members)
    return ContextParallel(grid.coords(rank)["cp"], grid.size("cp"), gather, global_rank=rank, fault=fault)
