"""The model plug-in protocol: an MLLM described as pipeline-able parts.

A plug-in is a factory (``package.module:factory``), called as
``factory(config, shape)`` (``--model-config`` text or None, a `BatchShape`),
returning a `PipelineModel`.  The executor never looks inside the parts; it only chains
them the way the schedule says:

    features = encoder(batch.images[lo:hi])          # any device, any shard of images
    hidden   = embedding(batch, features)             # chunk 0: merges the features
    hidden   = layers[i](hidden, context)             # the chunks' layers, in order
    loss     = model.loss(head(hidden), batch, n)     # the last chunk

* ``encoder`` maps encoder inputs to features, one row of dim 0 per image on
  both sides, so a microbatch's images can be split into shards (transpose)
  and the features concatenated back.  ``None``: a text-only model.  It is
  trainable iff any of its parameters ``requires_grad``.
* ``embedding(batch, features)`` is the LLM's input embedding, merging the
  features (all images of the microbatch, in order; None without an encoder)
  the way the model does (placeholder tokens, a prefix, ...).
* ``layers`` is the list of transformer layers; each is called
  ``layer(hidden, context)`` and returns the next hidden state (same shape).
* ``context(batch)`` is what every layer needs besides the hidden state and
  carries no gradient: positions, rotary tables, attention masks.  Every rank
  computes it from the batch (it is never sent).
* ``head`` is the final norm and the LM head (hidden -> logits).
* ``loss(logits, batch, normalizer)`` is the microbatch's *summed* token loss
  divided by ``normalizer``, the step's target count (the sum of
  ``target_count`` over the step's microbatches), so the microbatch losses add
  up to the step's mean loss whatever the schedule.
* ``make_batch(step, mb, microbatches)`` is a seeded batch maker: the same
  arguments give the same tensors in every process.
* ``root`` is a module holding every part: parameter names (how gradients are
  reported and checked) are its ``named_parameters()`` names.
* ``hidden_shape(batch)``, ``feature_shape()`` (one image's features) and
  ``image_counts(microbatches)`` size the receive buffers and the workload.
* ``data_batch(pieces, key, piece_keys=None)`` (optional; ``mpipe run
  --data``) is one packed sample: ``pieces`` a list of (tiles per image, text
  tokens, video frames), ``key`` the pack's place in the draw and
  ``piece_keys`` each piece's (strings, or None for a step plan made before
  pieces had keys: then ``key`` seeds the pack).  Its ``images`` hold one row
  per tile and frame, in piece order, and its sequence has exactly
  ``rows * feature_shape()[0] + text`` positions.  ``per_batch`` may deal a
  step's pieces into other packs (``mpipe_core.data.regroup``); for that not
  to change the step's loss and gradients, as packed training with
  per-sample masks has it, a plug-in must keep each piece to itself: seed the
  piece's tensors by its own ``piece_keys`` entry (not by ``key``, which
  names the pack), let it attend only within itself (a block-diagonal causal
  mask, from ``context``), start its positions at 0 (rotary or learned; an
  ALiBi bias, being relative, needs nothing), and give it no target across a
  piece boundary (so ``target_count`` does not depend on the grouping
  either).  The built-in model, ``hf:llava``, ``hf:qwen2_5_vl`` and
  ``examples.tiny_mllm`` (the example to copy) do; a
  ``data_batch(pieces, key)`` without ``piece_keys`` is still called, seeded
  per pack.  What a sample costs, as the planner prices it
  (``mpipe_core.workloads.batch_costs``), follows from two things the
  plug-in states and the run's workload: a tile or a frame is one encoder
  input, costing the workload encoder's ``f``/``b``/``w`` (per input), and
  becomes ``feature_shape()[0]`` LLM tokens; a pack of n tokens costs each
  layer's stated ``f``/``b``/``w`` times n / ``packing.max_tokens`` (the
  stated costs are a full pack's).  Without ``--workload`` those are the
  structural workload's (`models.workload.model_workload`: 1 an input, 1 a
  layer of a full pack, units relative to each other only); a profiled one
  (``mpipe profile``) gives seconds, its layers read as a full pack's, so
  profile a microbatch of ``max_tokens`` tokens.
* ``encoder_layers`` (optional) is the tower as a list of modules chained on
  the images, the last one giving the features (chaining them must *be*
  ``encoder(images)``), with ``encoder_hidden_shape(images, layer)`` the
  shape a layer that is not the last hands on.  `balanced` then folds the
  tower into the LLM chunks layer by layer (`models.tower`); without them it
  folds the whole tower as one layer.
* ``tp_plan(sequence_parallel)`` (optional; ``--parallel tp=N[,sp]``) is the
  model's tensor-parallel plan: ``{"layers": {name: ParallelStyle},
  "head": {name: ParallelStyle}, "encoder": {pattern: ParallelStyle}}``, names
  relative to each of ``layers`` and to ``head`` (``""``: the module itself),
  as torch's ``parallelize_module`` takes them, and (optional) patterns of
  ``encoder``'s submodules (without it the tower runs unsharded); the executor applies it to the parts a rank holds once they are
  built (`executor.parallel.tensor_parallel`, docs/running.md).  Under sp the
  layers take and return this rank's block of the sequence (``Shard(1)``).
  Without it the model runs tp = 1 only.  ``tensor_dims()`` (optional) gives
  what tp must divide (``heads``, ``kv_heads``, ``hidden``, ``encoder_heads``,
  ``encoder_hidden``), checked before launch (the hf: models give it from
  their configs).
* ``reference_loss(batch, normalizer)`` is the unpipelined model's loss on one
  microbatch, what ``--check-grads`` compares against: the HF model's own
  forward for the HF adapters, the parts chained in one process otherwise
  (`chained_loss`).

The executor computes in float32 (or under bf16 autocast, `--precision bf16`,
`runtime.precision`).  Every process builds the model from the factory (it
must be deterministic: seed it) and keeps the parts its chunks hold.  It builds
only those parts where the model gives
* ``init_parameter(name, tensor)`` (optional): parameter ``name``'s initial
  value written into ``tensor``, the same in every process whatever else it
  holds.  The factory is then called with every parameter placed on the
  ``meta`` device (`models.meta_build.meta_parameters`: buffers stay real),
  each rank makes real only its chunks' and encoder replica's parameters with
  it (`models.materialise`) and the reference run all of them, so the values
  are ``init_parameter``'s, not the constructor's.
  `models.meta_build.replay_init` replays the model's own per-module
  initialisers (``reset_parameters``) for one parameter, seeded by its name;
  ``examples.tiny_mllm`` uses it.  A factory that fails under the meta device,
  or a model without ``init_parameter``, is built whole in every process.
A parameter may be used by several parts (the encoder and the
embedding, two layers, tied embedding and head): its gradient is summed over
all its uses and ranks, as the model alone would sum it (`sharing`).
`check_model` refuses, before any rank starts, parts that are not
`nn.Module`s (``layers`` a list of them), a part's parameter outside ``root``
and a trainable parameter of ``root`` no part uses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch
from torch import nn

from mpipe_core.errors import MpipeError
from mpipe_core.runs.model_spec import BatchShape  # noqa: F401  (re-exported: a plug-in's factory takes one)


class ModelError(MpipeError):
    """A model that cannot be built or does not fit the protocol or the schedule."""


@dataclass
class Batch:
    """One microbatch: the encoder input (dim 0 indexes images) and named tensors
    the embedding, context and loss read."""

    images: torch.Tensor | None
    fields: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.fields[key]

    def to(self, device) -> "Batch":
        return Batch(None if self.images is None else self.images.to(device),
                     {k: v.to(device) for k, v in self.fields.items()})


@runtime_checkable
class PipelineModel(Protocol):
    name: str
    root: nn.Module
    encoder: nn.Module | None
    embedding: nn.Module
    layers: Sequence[nn.Module]
    head: nn.Module

    def context(self, batch: Batch) -> Any: ...

    def loss(self, logits: torch.Tensor, batch: Batch, normalizer: int) -> torch.Tensor: ...

    def make_batch(self, step: int, mb: int, microbatches: int) -> Batch: ...

    def target_count(self, batch: Batch) -> int: ...

    def hidden_shape(self, batch: Batch) -> tuple[int, ...]: ...

    def feature_shape(self) -> tuple[int, ...]: ...

    def image_counts(self, microbatches: int) -> list[int]: ...

    def reference_loss(self, batch: Batch, normalizer: int) -> torch.Tensor: ...


class NormHead(nn.Module):
    """A `head` made of the model's final norm and its LM head (hidden -> logits)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


def chained_loss(model: PipelineModel, batch: Batch, normalizer: int) -> torch.Tensor:
    """The parts chained in one process: the unpipelined plug-in model."""
    feats = model.encoder(batch.images) if model.encoder is not None else None
    x = model.embedding(batch, feats)
    ctx = model.context(batch)
    for layer in model.layers:
        x = layer(x, ctx)
    return model.loss(model.head(x), batch, normalizer)


def encoder_trainable(model: PipelineModel) -> bool:
    return model.encoder is not None and any(p.requires_grad for p in model.encoder.parameters())


def step_normalizer(model: PipelineModel, step: int, microbatches: int) -> int:
    return sum(model.target_count(model.make_batch(step, m, microbatches)) for m in range(microbatches))


def parameter_names(model: PipelineModel) -> dict[int, str]:
    """id(parameter) -> its name in `model.root` (a shared parameter keeps its first name)."""
    return {id(p): n for n, p in model.root.named_parameters()}


def named_parameters_of(model: PipelineModel, module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    names = parameter_names(model)
    out = []
    for p in module.parameters():
        if id(p) not in names:
            raise ModelError(f"model '{model.name}': a parameter of {type(module).__name__} is not "
                             "under its root module (parameter names come from `root`)")
        out.append((names[id(p)], p))
    return out


METHODS = ("context", "loss", "make_batch", "target_count", "hidden_shape", "feature_shape", "image_counts",
           "reference_loss")


def model_parts(model: PipelineModel) -> list[tuple[str, nn.Module]]:
    """The parts the executor places, by the names its messages use: encoder,
    embedding, layers[i], head (a checked model's)."""
    parts = [("encoder", model.encoder)] if model.encoder is not None else []
    parts.append(("embedding", model.embedding))
    parts += [(f"layers[{i}]", layer) for i, layer in enumerate(model.layers)]
    return parts + [("head", model.head)]


def _kind(value: Any) -> str:
    return type(value).__name__


def check_model(model: Any, where: str) -> PipelineModel:
    """Refuse, with one clear line, what does not follow the protocol (before any
    rank starts: every rank would fail the same way)."""
    missing = [a for a in ("name", "root", "encoder", "embedding", "layers", "head") + METHODS
               if not hasattr(model, a)]
    if missing:
        raise ModelError(f"{where} returned a {type(model).__name__} without {', '.join(missing)} "
                         "(see executor.runtime.models.protocol.PipelineModel)")
    if not isinstance(model.root, nn.Module):
        raise ModelError(f"{where}: root must be a torch.nn.Module (got {_kind(model.root)})")
    for method in METHODS:
        if not callable(getattr(model, method)):
            raise ModelError(f"{where}: {method} must be callable")
    if not isinstance(model.layers, (list, tuple, nn.ModuleList)):
        raise ModelError(f"{where}: layers must be a list of torch.nn.Module (got {_kind(model.layers)})")
    if len(model.layers) < 1:
        raise ModelError(f"{where}: the model has no transformer layers")
    for i, layer in enumerate(model.layers):
        if not isinstance(layer, nn.Module):
            raise ModelError(f"{where}: layers[{i}] must be a torch.nn.Module (got {_kind(layer)})")
    for part in ("embedding", "head"):
        if not isinstance(getattr(model, part), nn.Module):
            raise ModelError(f"{where}: {part} must be a torch.nn.Module (got {_kind(getattr(model, part))})")
    if model.encoder is not None and not isinstance(model.encoder, nn.Module):
        raise ModelError(f"{where}: encoder must be a torch.nn.Module or None (got {_kind(model.encoder)})")
    # Parameter names (how gradients are reported and checked) come from root, and
    # a rank trains exactly the parameters of the parts it holds.
    names = parameter_names(model)
    _check_tower(model, where, names)
    in_parts: set[int] = set()
    for part, module in model_parts(model):
        for p in module.parameters():
            if id(p) not in names:
                raise ModelError(f"{where}: a parameter of {part} ({_kind(module)}, shape {list(p.shape)}) is "
                                 "not under root (parameter names come from root)")
            in_parts.add(id(p))
    for name, p in model.root.named_parameters():
        if p.requires_grad and id(p) not in in_parts:
            raise ModelError(f"{where}: parameter {name} is under root but in none of the parts (encoder, "
                             "embedding, layers, head), so no rank would train it")
    return model


def _check_tower(model: Any, where: str, names: dict[int, str]) -> None:
    """The optional ``encoder_layers``: modules under root, and a shape for what each
    but the last hands on (that they cover the encoder is checked where a schedule
    folds them, `tower.tower_layers`)."""
    layers = getattr(model, "encoder_layers", None)
    if layers is None or model.encoder is None:
        return
    if not isinstance(layers, (list, tuple, nn.ModuleList)) or not layers:
        raise ModelError(f"{where}: encoder_layers must be a non-empty list of torch.nn.Module "
                         f"(got {_kind(layers)})")
    held: set[int] = set()
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            raise ModelError(f"{where}: encoder_layers[{i}] must be a torch.nn.Module (got {_kind(layer)})")
        for p in layer.parameters():
            if id(p) not in names:
                raise ModelError(f"{where}: a parameter of encoder_layers[{i}] is not under root")
            held.add(id(p))
    if len(layers) > 1 and not callable(getattr(model, "encoder_hidden_shape", None)):
        raise ModelError(f"{where}: a model with encoder_layers needs encoder_hidden_shape(images, layer)")


Factory = Callable[..., PipelineModel]
