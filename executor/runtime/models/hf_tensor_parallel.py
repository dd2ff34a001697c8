"""Tensor-parallel plans of the HF models (`hf.HFModel.tp_plan`; the form is the
protocol's, applied by `executor.parallel.tensor_parallel`).

* The LLM's layers: transformers' own `base_model_tp_plan` of the text config
  (Llama, Qwen2 and Qwen2.5-VL's text model: q/k/v and the MLP's gate/up
  column-wise, o_proj and down_proj row-wise), each ``layers.*.NAME`` mapped to
  torch's `ColwiseParallel` / `RowwiseParallel` on ``layer.NAME`` of our
  `hf.DecoderLayer`; a style other than those is refused.  HF's attention
  reshapes with ``view(*shape, -1, head_dim)``, so it runs the local heads
  (heads / tp, kv heads / tp: the GQA groups stay whole, since tp divides
  the kv heads); the rotary tables are the whole sequence's and not sharded.
* With sequence parallelism the layer's norms run `SequenceParallel`, and each
  module holding the plan's linears (``self_attn``, ``mlp``) gathers its
  hidden input from the sequence blocks (`LocalHeads(gather_sequence=True)`,
  for a positional or a ``hidden_states=`` input, as HF calls them); the row-wise outputs
  come back as blocks (``Shard(1)``).  A layer child that is neither a norm
  nor such a module is refused under sp.
* The head: the model's `_tp_plan` for ``lm_head`` (``colwise_gather_output``)
  as `ColwiseParallel` with the logits gathered; the final norm as the layers'.
* The vision tower and projector (no HF plan): ours, without sequence
  parallelism.  CLIP/SigLIP layers (LLaVA): ``self_attn`` q/k/v column-wise
  and ``out_proj`` row-wise, ``mlp.fc1`` / ``fc2``; the projector's
  ``linear_1`` / ``linear_2``.  Qwen2.5-VL's blocks: the fused ``attn.qkv``
  with `FusedColwiseParallel` (each rank its heads' q, k and v) and
  ``attn.proj`` row-wise, the MLP's gate/up/down, the merger's two linears.
  Qwen's vision attention reshapes with its ``num_heads`` attribute, so
  `LocalHeads` sets it (and any ``num_key_value_heads``) to the local count,
  on every module holding sharded linears (the LLM's too: Qwen2.5-VL's text
  attention keeps the counts, though its reshape takes -1).
"""
from __future__ import annotations

import functools
from typing import Any

from torch import nn

from .protocol import ModelError

LAYER_PREFIX = "layers.*."  # HF's plan keys, relative to the text model


def LocalHeads(gather_sequence: bool = False):  # noqa: N802 - a ParallelStyle, named like torch's
    """A style for a module holding sharded linears (an attention, an MLP): its head-count
    attributes (``num_heads``, ``num_key_value_heads``; where it has them) divided by tp,
    the counts its sharded q/k/v give it, for a module that reshapes by them; with
    `gather_sequence` its hidden input (the first positional tensor, else
    ``hidden_states=``, as HF calls them) gathered from this rank's sequence block
    (``Shard(1)``) to the whole sequence."""
    return _local_heads_class()(gather_sequence)


@functools.cache
def _local_heads_class():
    """Made once, on first use (torch.distributed.tensor is imported only by tp runs)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel.style import ParallelStyle

    def gather_hook(mesh):
        def gather(x):
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
            return x.redistribute(mesh, [Replicate()]).to_local()

        def hook(_module, args, kwargs):
            if args:
                return (gather(args[0]),) + tuple(args[1:]), kwargs
            return args, {**kwargs, "hidden_states": gather(kwargs["hidden_states"])}

        return hook

    class _LocalHeads(ParallelStyle):
        def __init__(self, gather_sequence: bool):
            self.gather_sequence = gather_sequence

        def _apply(self, module: nn.Module, mesh) -> nn.Module:
            for attr in ("num_heads", "num_key_value_heads"):
                if isinstance(getattr(module, attr, None), int):
                    setattr(module, attr, getattr(module, attr) // mesh.size())
            if self.gather_sequence:
                module.register_forward_pre_hook(gather_hook(mesh), with_kwargs=True)
            return module

    return _LocalHeads


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def layer_plan(config_plan: dict[str, str] | None, layer: nn.Module, label: str,
               sequence_parallel: bool) -> dict[str, Any]:
    """One decoder layer's styles (names relative to `hf.DecoderLayer`, whose HF layer is
    ``layer``) from the text config's `base_model_tp_plan`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if not config_plan:
        raise ModelError(f"{label}: its text model ({type(layer).__name__}) has no base_model_tp_plan in "
                         "transformers (run it with tp=1)")
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {}
    holders = []
    for key, kind in config_plan.items():
        if not key.startswith(LAYER_PREFIX):
            raise ModelError(f"{label}: transformers' tp plan entry '{key}' is outside the decoder layers "
                             "(run it with tp=1)")
        name = key[len(LAYER_PREFIX):]
        if kind == "colwise":
            style = ColwiseParallel()
        elif kind == "rowwise":
            style = RowwiseParallel(output_layouts=seq)
        else:
            raise ModelError(f"{label}: transformers' tp style '{kind}' for '{key}' is not supported "
                             "(colwise, rowwise; run it with tp=1)")
        plan[f"layer.{name}"] = style
        holder = name.split(".")[0]
        if holder not in holders:
            holders.append(holder)
    for holder in holders:
        plan[f"layer.{holder}"] = LocalHeads(gather_sequence=sequence_parallel)
    if not sequence_parallel:
        return plan
    for child, module in layer.named_children():
        if child in holders:
            continue
        if _is_norm(module):
            plan[f"layer.{child}"] = SequenceParallel()
        else:
            raise ModelError(f"{label}: sequence parallelism: the decoder layer's '{child}' "
                             f"({type(module).__name__}) is neither a norm nor sharded by the tp plan "
                             "(run it without sp)")
    return plan


def head_plan(model_plan: dict[str, str] | None, sequence_parallel: bool) -> dict[str, Any]:
    """The `NormHead`'s styles: HF's ``lm_head`` entry (``colwise_gather_output``, its
    only form in these models; the same when the model gives none)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel

    kind = (model_plan or {}).get("lm_head", "colwise_gather_output")
    if kind != "colwise_gather_output":
        raise ModelError(f"transformers' tp style '{kind}' for lm_head is not supported (colwise_gather_output)")
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {"lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate())}
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    return plan


def encoder_plan(family: str) -> dict[str, Any]:
    """The vision tower's and projector's styles: patterns of the encoder part's
    (`hf.LlavaEncoder`, `hf.QwenEncoder`) submodule names; no sequence parallelism."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from ...parallel.tensor_parallel import FusedColwiseParallel

    if family == "llava":  # CLIP / SigLIP layers, then LLaVA's two-linear projector
        return {"vision_tower.*.self_attn": LocalHeads(),
                "vision_tower.*.self_attn.q_proj": ColwiseParallel(),
                "vision_tower.*.self_attn.k_proj": ColwiseParallel(),
                "vision_tower.*.self_attn.v_proj": ColwiseParallel(),
                "vision_tower.*.self_attn.out_proj": RowwiseParallel(),
                "vision_tower.*.mlp.fc1": ColwiseParallel(),
                "vision_tower.*.mlp.fc2": RowwiseParallel(),
                "multi_modal_projector.linear_1": ColwiseParallel(),
                "multi_modal_projector.linear_2": RowwiseParallel()}
    return {"visual.blocks.*.attn": LocalHeads(),  # reshapes by num_heads
            "visual.blocks.*.attn.qkv": FusedColwiseParallel(3),
            "visual.blocks.*.attn.proj": RowwiseParallel(),
            "visual.blocks.*.mlp.gate_proj": ColwiseParallel(),
            "visual.blocks.*.mlp.up_proj": ColwiseParallel(),
            "visual.blocks.*.mlp.down_proj": RowwiseParallel(),
            "visual.merger.mlp.0": ColwiseParallel(),
            "visual.merger.mlp.2": RowwiseParallel()}


def tensor_dims(hf: nn.Module, family: str) -> dict[str, int | None]:
    """What tp splits, from the configs (`layout_checks.ModelDims`' fields)."""
    text, vision = hf.config.text_config, hf.config.vision_config
    heads = text.num_attention_heads
    return {"heads": heads, "kv_heads": getattr(text, "num_key_value_heads", None) or heads,
            "hidden": text.hidden_size,
            "encoder_heads": vision.num_attention_heads if family == "llava" else vision.num_heads,
            "encoder_hidden": vision.hidden_size}
