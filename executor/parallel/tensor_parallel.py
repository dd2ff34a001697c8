"""Tensor and sequence parallelism: each model part sharded over the tp ranks with
torch's DTensor (`torch.distributed.tensor.parallel.parallelize_module`).

The plan is torchtitan's for Llama, applied per pipeline part:

* every LLM layer: the attention's q/k/v projection and the MLP's first
  linear(s) column-wise, the attention's output and the MLP's last linear
  row-wise; each rank then runs heads / tp heads and hidden / tp of the MLP;
* with sequence parallelism (`sp`) the norms run `SequenceParallel` on this
  rank's block of the sequence, the layouts change where a norm's output meets
  a column-wise linear (`PrepareModuleInput` before attention, the linear's own
  `input_layouts` before the MLP), and the row-wise outputs come back as
  sequence blocks (`Shard(1)`); so the residual stream, and what the pipeline
  sends between stages, is each tp rank's block of the sequence
  (`hidden_shape` / tp); a stage sends its block to the stage peer with the
  same tp coordinate.  Without sp the residual stream is replicated and every
  tp rank sends its (identical) full hidden state to its peer;
* the head: the final norm as the layers' norms, the LM head column-wise over
  the vocabulary, its logits gathered (`Replicate`) so every tp rank computes
  the same loss; only tp rank 0's loss is reported (`reports_loss`), so the
  step's loss is not tp times too large, and no loss is all-reduced in
  autograd;
* the vision tower's blocks (a plan's `encoder` part) are sharded like the
  layers without sequence parallelism: the tower takes and gives replicated
  tensors (a model whose plan has no `encoder` part runs its tower at tp 1,
  a full copy per tp rank); its stem and projector and the embedding are not
  sharded.  Under sp the embedding's output is turned into this rank's block
  by a DTensor redistribution (`Replicate` -> `Shard(1)`), whose backward
  all-gathers the blocks' gradients: the embedding's and the tower's
  gradients are then the whole sequence's on every tp rank, with no extra
  reduction.

A fused q/k/v linear ([q; k; v] rows) cannot be split column-wise as it is:
rank 0 would get all of q and part of k.  `FusedColwiseParallel(parts=3)`
reorders the rows to [q_0; k_0; v_0; q_1; ...] (q_r: rank r's heads) before
sharding, so each rank's rows are its own heads' q, k and v; `full_value`
puts a gathered tensor back in the model's order for the gradient check.

Weights are built (materialised, deterministically) before sharding, as the
ENGINEERING_NOTES require; dropout is 0 throughout.  So a rank's build still
peaks at its whole (unsharded) chunks: the shard is sliced from them.  Every parameter a plan
touches becomes a DTensor: the gradient check gathers it (`full_tensor`), the
dp reduction reduces its local shard over the ranks with the same tp
coordinate (`local_tensor`).

Sharding needs torch.distributed (a `DeviceMesh`); ranks as threads of one
process run tp = 1 only.  The tp collectives are DTensor's own, inside the
styles' hooks and the sharded ops (issued asynchronously and waited on at
first use); `collective_timer` times each where it is issued, as `tp_comm`
rows.  What the plan shards (`sharded_parameters`) is what `mpipe profile`
writes as a model's tp share of its static memory.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

import torch
from torch import nn

FUSED_ATTR = "_mpipe_fused_parts"  # set on a parameter sharded by `FusedColwiseParallel`


def _is_dtensor(t: Any) -> bool:
    # (by its attribute: importing DTensor's machinery costs runs without tp time and memory)
    return getattr(t, "_local_tensor", None) is not None


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (sharing its storage), any other tensor itself."""
    return t._local_tensor if _is_dtensor(t) else t


def flat_values(tensors) -> torch.Tensor:
    """Tensors' local values (a DTensor's shard) flattened into one buffer: what a collective
    over an encoder's replicas (`BCAST`, `ALLREDUCE`) sends."""
    return torch.cat([local_tensor(t).reshape(-1) for t in tensors])


def gradient_from_flat(param: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """A gradient for `param` from its local values (a DTensor with the parameter's placements)."""
    local = local_tensor(param)
    grad = flat.view_as(local).to(local.dtype).clone()
    if not _is_dtensor(param):
        return grad
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(grad, param.device_mesh, param.placements, run_check=False)


def _fused_order(rows: int, parts: int, tp: int) -> torch.Tensor:
    """Row order that puts each tp rank's share of every part together:
    [part0_rank0, part1_rank0, ..., part0_rank1, ...]."""
    size = rows // parts
    s = size // tp
    return torch.cat([torch.arange(p * size + r * s, p * size + (r + 1) * s)
                      for r in range(tp) for p in range(parts)])


@functools.cache
def _styles():
    from torch.distributed.tensor.parallel import ColwiseParallel

    class FusedColwiseParallel(ColwiseParallel):
        """Column-wise sharding of a linear whose output is `parts` equal blocks
        (a fused [q; k; v]): each rank gets its share of every block, in block order."""

        def __init__(self, parts: int = 3, **kwargs):
            super().__init__(**kwargs)
            self.parts = parts

        def _partition_linear_fn(self, name, module, device_mesh):
            tp = device_mesh.size()
            for pname, param in list(module.named_parameters()):
                if param.shape[0] % (self.parts * tp):
                    raise ValueError(f"fused linear {name}.{pname}: {param.shape[0]} rows do not split "
                                     f"into {self.parts} parts over tp={tp}")
                with torch.no_grad():
                    param.copy_(param[_fused_order(param.shape[0], self.parts, tp)])
            super()._partition_linear_fn(name, module, device_mesh)
            for param in module.parameters():
                setattr(param, FUSED_ATTR, self.parts)

    return FusedColwiseParallel


def FusedColwiseParallel(parts: int = 3, **kwargs):  # noqa: N802 - a ParallelStyle, named like torch's
    """A `ColwiseParallel` for a fused linear of `parts` equal output blocks (q, k, v)."""
    return _styles()(parts, **kwargs)


def full_value(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`value` (the parameter or its gradient) as the unsharded model holds it: a DTensor
    gathered (a collective over tp: every tp rank calls it, in the same order), a fused
    linear's rows put back in [q; k; v] order."""
    if not _is_dtensor(value):
        return value
    full = value.full_tensor()
    parts = getattr(param, FUSED_ATTR, None)
    if parts:
        order = _fused_order(full.shape[0], parts, value.device_mesh.size())
        out = torch.empty_like(full)
        out[order] = full
        full = out
    return full


def full_values(params: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every value of a name -> tensor dict unsharded (see `full_value`), on CPU."""
    return {n: full_value(params[n], v).to("cpu") if n in params else v for n, v in values.items()}


def whole_zero_gradients(pieces: dict[str, list], params: dict[str, torch.Tensor], dp: Any) -> dict[str, list]:
    """ZeRO-1 over tp shards, for the gradient check: this rank's reduced slices of each
    parameter's *local* shard (`GradientSync.gradient_pieces`) joined over its ZeRO group
    (a sum of zero-filled shards: each element is one member's), then gathered over tp and
    reported as one piece of the whole parameter.  Collectives: every member of the dp and
    tp groups calls it, parameters in the same order (`params`: the rank's trained ones)."""
    from torch.distributed.tensor import DTensor

    out: dict[str, list] = {}
    for name, p in params.items():
        local = local_tensor(p)
        buf = torch.zeros(local.numel() + 1, dtype=torch.float32, device=local.device)
        for a, b, t in pieces.get(name, []):
            buf[a:b] = t.to(buf.device)
            buf[-1] = 1.0
        dp.transport.wait(dp.transport.all_reduce(buf, dp.members))
        if buf[-1] == 0:  # no member had a gradient for it
            continue
        grad = buf[:-1].view_as(local)
        if isinstance(p, DTensor):
            grad = DTensor.from_local(grad, p.device_mesh, p.placements, run_check=False)
        whole = full_value(p, grad).to("cpu")
        out[name] = [(0, whole.numel(), whole.reshape(-1))]
    return out


# --------------------------------------------------------------------------- plans

def builtin_plan(sequence_parallel: bool) -> dict[str, dict[str, Any]]:
    """The built-in MLLM's plan: per part (`layers`: each `_Layer`, `head`: the
    `NormHead`, `encoder`: the vision tower, whose blocks get the LLM's tp without
    sequence parallelism), submodule name (a pattern) -> ParallelStyle."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    tower = {"blocks.*.attn.qkv": FusedColwiseParallel(3), "blocks.*.attn.proj": RowwiseParallel(),
             "blocks.*.fc": ColwiseParallel(), "blocks.*.out": RowwiseParallel()}
    if not sequence_parallel:
        return {"layers": {"block.attn.qkv": FusedColwiseParallel(3), "block.attn.proj": RowwiseParallel(),
                           "block.fc": ColwiseParallel(), "block.out": RowwiseParallel()},
                "head": {"lm_head": ColwiseParallel(output_layouts=Replicate())},
                "encoder": tower}
    return {
        "encoder": tower,
        "layers": {
            "block.ln1": SequenceParallel(),
            "block.attn": PrepareModuleInput(input_layouts=(Shard(1), None),
                                             desired_input_layouts=(Replicate(), None), use_local_output=True),
            "block.attn.qkv": FusedColwiseParallel(3),
            "block.attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "block.ln2": SequenceParallel(),
            "block.fc": ColwiseParallel(input_layouts=Shard(1)),
            "block.out": RowwiseParallel(output_layouts=Shard(1)),
        },
        "head": {"norm": SequenceParallel(),
                 "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())},
    }


def model_plan(model: Any, sequence_parallel: bool) -> dict[str, dict[str, Any]] | None:
    """The plan for `model` (a `PipelineModel`): its own `tp_plan(sequence_parallel)` (the
    built-in model's is `builtin_plan`), or None: no tensor-parallel plan."""
    own = getattr(model, "tp_plan", None)
    return own(sequence_parallel) if callable(own) else None


def _plan_matches(module: nn.Module, pattern: str, dotted: bool) -> list[nn.Module]:
    """The submodules of `module` a plan key names: as `parallelize_module` matches a key
    (atom by atom, each an fnmatch pattern: `dotted`), or as `shard_held` matches the tower's
    keys (one fnmatch over the whole dotted name)."""
    if not dotted:
        return [sub for name, sub in module.named_modules() if name and fnmatch(name, pattern)]
    if pattern == "":
        return [module]
    atoms = pattern.split(".")
    return [sub for name, sub in module.named_modules()
            if name and len(name.split(".")) == len(atoms)
            and all(fnmatch(a, p) for a, p in zip(name.split("."), atoms))]


def sharded_parameters(model: Any, plan: dict[str, dict[str, Any]]) -> set[int]:
    """Ids of the parameters of `model` (a `PipelineModel`) that `plan` shards over tp, found
    without sharding anything (`mpipe profile` writes what they weigh): a column-wise style
    shards every parameter of its module (a linear's weight and bias), a row-wise one its
    weight (the bias is added after the reduction, replicated); norms and layout changes
    (`SequenceParallel`, `PrepareModuleInput`, ...) shard none."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    parts = [("layers", layer, True) for layer in model.layers] + [("head", model.head, True)]
    if model.encoder is not None:
        parts.append(("encoder", model.encoder, False))
    out: set[int] = set()
    for part, module, dotted in parts:
        for pattern, style in plan.get(part, {}).items():
            for sub in _plan_matches(module, pattern, dotted):
                if isinstance(style, ColwiseParallel):
                    out.update(id(p) for p in sub.parameters(recurse=False))
                elif isinstance(style, RowwiseParallel) and getattr(sub, "weight", None) is not None:
                    out.add(id(sub.weight))
    return out


# --------------------------------------------------------------------------- the model

@dataclass
class TensorParallel:
    """A rank's place in its tp group and the tp sub-mesh it shards on."""

    index: int
    size: int
    mesh: Any  # the tp `DeviceMesh` (1-D)
    sequence_parallel: bool
    global_rank: int = 0
    # Test hook (a mutation the gradient check must catch): {"kind": "tp_swap_shards",
    # "param": name}: tp ranks 0 and 1 exchange their local shards of that parameter after sharding.
    fault: dict | None = None


class _SequenceBlock(nn.Module):
    """The embedding, its output turned into this tp rank's block of the sequence."""

    def __init__(self, embedding: nn.Module, tp: TensorParallel):
        super().__init__()
        self.inner = embedding
        self.tp = tp

    def forward(self, batch, features):
        from torch.distributed.tensor import DTensor, Replicate, Shard

        x = self.inner(batch, features)
        # Replicate -> Shard(1) keeps this rank's block; its backward all-gathers the blocks' gradients.
        full = DTensor.from_local(x, self.tp.mesh, [Replicate()], run_check=False)
        return full.redistribute(self.tp.mesh, [Shard(1)]).to_local()


class TensorParallelModel:
    """A `PipelineModel` whose held parts are sharded over tp once built (`shard_held`)."""

    def __init__(self, inner: Any, tp: TensorParallel, plan: dict[str, dict[str, Any]]):
        self.inner, self.tp, self.plan = inner, tp, plan
        self.name, self.root, self.encoder = inner.name, inner.root, inner.encoder
        self.layers, self.head = inner.layers, inner.head
        self.embedding = _SequenceBlock(inner.embedding, tp) if tp.sequence_parallel else inner.embedding

    def __getattr__(self, name: str) -> Any:  # make_batch, loss, context, target_count, ...
        return getattr(self.inner, name)

    def hidden_shape(self, batch) -> tuple[int, ...]:
        shape = list(self.inner.hidden_shape(batch))
        if self.tp.sequence_parallel:
            if shape[1] % self.tp.size:
                raise ValueError(f"sequence parallelism: a sequence of {shape[1]} positions does not split "
                                 f"over tp={self.tp.size}")
            shape[1] //= self.tp.size
        return tuple(shape)

    def shard_held(self, modules) -> None:
        """Shard the held LLM layers and head (built, real) on the tp mesh; called once, by the
        runtime, after it made its parts real and before it lists what it trains."""
        from torch.distributed.tensor.parallel import parallelize_module

        held = {id(m) for m in modules if m is not None}
        inside = {id(m) for h in modules if h is not None for m in h.modules()}
        for styles in self.plan.values():
            for style in styles.values():
                style.src_data_rank = None  # every rank built the same weights: slice, no scatter
        for part, module in [("layers", layer) for layer in self.layers] + [("head", self.head)]:
            if id(module) in held or any(id(m) in held for m in module.modules()):
                parallelize_module(module, self.tp.mesh, self.plan.get(part, {}))
        # The tower: each matching submodule this rank holds (a folded tower's layers are spread
        # over chunks, and the others' stay unbuilt), one at a time.
        if self.encoder is not None:
            for pattern, style in self.plan.get("encoder", {}).items():
                for name, sub in self.encoder.named_modules():
                    if fnmatch(name, pattern) and id(sub) in inside and not any(p.is_meta for p in sub.parameters()):
                        parallelize_module(sub, self.tp.mesh, style)
        self._maybe_swap_shards()

    def _maybe_swap_shards(self) -> None:
        f = self.tp.fault
        if not f or f.get("kind") != "tp_swap_shards":
            return
        params = dict(self.root.named_parameters())
        p = params.get(f.get("param"))
        if p is None or p.is_meta:
            return
        from torch.distributed.tensor import DTensor

        if not isinstance(p, DTensor):
            raise ValueError(f"fault tp_swap_shards: {f.get('param')} is not sharded")
        dim = p.placements[0].dim
        with torch.no_grad():
            blocks = p.full_tensor().chunk(self.tp.size, dim=dim)
            other = {0: 1, 1: 0}.get(self.tp.index, self.tp.index)
            local_tensor(p).copy_(blocks[other])


def rank_tensor_parallel(grid: Any, rank: int, mesh: Any, sequence_parallel: bool,
                         fault: dict | None = None) -> TensorParallel:
    """This rank's tp place on the world mesh's `tp` dimension (and DTensor's parallel styles
    imported: a caller measuring a build calls this first)."""
    if mesh is None:
        raise ValueError("tensor parallelism needs torch.distributed ranks (a device mesh); "
                         "ranks as threads of one process run tp=1")
    # (the styles, and what DTensor's first collectives import: torch._dynamo, ~30 MB)
    import torch._dynamo  # noqa: F401
    import torch.distributed._functional_collectives  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    return TensorParallel(grid.coords(rank)["tp"], grid.size("tp"), mesh["tp"], sequence_parallel,
                          global_rank=rank, fault=fault)


def tensor_parallel_model(model: Any, tp: TensorParallel) -> TensorParallelModel:
    plan = model_plan(model, tp.sequence_parallel)
    if plan is None:
        raise ValueError(f"model '{model.name}' has no tensor-parallel plan (run it with tp=1)")
    return TensorParallelModel(model, tp, plan)


def reports_loss(grid: Any, rank: int) -> bool:
    """Whether this rank's loss counts in the step's: every tp rank computes the same loss."""
    return grid.coords(rank)["tp"] == 0

