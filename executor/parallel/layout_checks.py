"""What a layout needs of the model and the run, checked before any process starts.

Each refusal is one line naming the layout key and what it does not fit
(the CLI prints it as `error: ...` and exits 2):

* tp must divide the attention heads, the key/value heads and the hidden size;
* cp must divide the sequence;
* tp > 1 needs a model with a tensor-parallel plan (the built-in model, the
  hf: models, a plug-in with `tp_plan`), with sp a sequence that splits
  into tp x cp blocks, and no --data yet; cp > 1 a model whose
  attention runs context-parallel (the built-in one) and no packed data,
  `encoder_shard` a run without `--data` (a data run's steps place the
  encoder's copies anew): what the executor does not run yet is refused
  here, not half-run;
* dp > 1 with `--data` runs: each replica its own share of each step's drawn
  batch, on one schedule per step (`data_run.step_plans` refuses a step whose
  replicas' `per_batch` plans differ: the replicas run in lockstep).

The world's size against the layout is the run set-up's check (it knows the
ranks asked for).
"""
from __future__ import annotations

from dataclasses import dataclass

from mpipe_core.runs.layout import LayoutError, RunLayout


@dataclass(frozen=True)
class ModelDims:
    """What tp and cp split: None where the model does not say."""

    name: str
    heads: int | None = None
    kv_heads: int | None = None
    hidden: int | None = None
    sequence: int | None = None
    tp_plan: bool = False  # does the executor have a tensor-parallel plan for it?
    # A vision tower sharded with the LLM's tp (the built-in one's): its heads and width.
    encoder_heads: int | None = None
    encoder_hidden: int | None = None
    context_parallel: bool = False  # does its attention run context-parallel (`context_parallel`)?


def builtin_dims(cfg, name: str = "the built-in model") -> ModelDims:
    """The built-in model's (`runtime.model.ModelConfig`): multi-head attention, kv heads = heads."""
    tower = cfg.encoder is not None
    return ModelDims(name, cfg.n_head, cfg.n_head, cfg.d_model, cfg.seq_len, tp_plan=True,
                     context_parallel=True, encoder_heads=cfg.enc_heads if tower else None,
                     encoder_hidden=cfg.d_enc if tower else None)


def own_model_dims(model, name: str) -> ModelDims:
    """A loaded own model's (`runtime.models.protocol.PipelineModel`): a tensor-parallel plan iff
    it gives `tp_plan`; heads and widths where it gives `tensor_dims()` (the hf: models, from
    their configs), else the plug-in's to check (its plan's styles refuse a width that does
    not split)."""
    if model is None:
        return ModelDims(name)
    sequence = model.hidden_shape(model.make_batch(0, 0, 1))[1]  # (batches are padded to one length)
    sizes = model.tensor_dims() if callable(getattr(model, "tensor_dims", None)) else {}
    return ModelDims(name, sequence=sequence, tp_plan=callable(getattr(model, "tp_plan", None)), **sizes)


def check_layout(layout: RunLayout, dims: ModelDims, data: bool = False) -> None:
    """Refuse (LayoutError, one line) a layout the model or the executor cannot run."""
    tp, cp = layout.tp, layout.cp
    for what, value in (("attention heads", dims.heads), ("key/value heads", dims.kv_heads),
                        ("hidden size", dims.hidden), ("vision tower heads", dims.encoder_heads),
                        ("vision tower width", dims.encoder_hidden)):
        if tp > 1 and value is not None and value % tp:
            raise LayoutError(f"layout tp={tp} does not divide {dims.name}'s {value} {what}")
    if cp > 1 and dims.sequence is not None and dims.sequence % cp:
        raise LayoutError(f"layout cp={cp} does not divide {dims.name}'s sequence of {dims.sequence} tokens")
    if tp > 1 and not dims.tp_plan:
        raise LayoutError(f"layout tp={tp}: {dims.name} has no tensor-parallel plan (run it with tp=1)")
    if tp > 1 and layout.sp and dims.sequence is not None and dims.sequence % (tp * cp):
        where = f"tp={tp} sp" + (f" cp={cp}" if cp > 1 else "")
        raise LayoutError(f"layout {where}: {dims.name}'s sequence of {dims.sequence} tokens does not split "
                          f"into {tp * cp} sequence blocks")
    if cp > 1 and not dims.context_parallel:
        raise LayoutError(f"layout cp={cp}: {dims.name} has no context-parallel attention (run it with cp=1)")
    if tp > 1 and data:
        raise LayoutError(f"layout tp={tp} with --data: packed microbatches do not run tensor-parallel yet")
    if cp > 1 and data:
        raise LayoutError(f"layout cp={cp} with --data: packed microbatches do not run context-parallel yet")
    if layout.encoder_shard != "none" and data:
        raise LayoutError(f"layout encoder_shard={layout.encoder_shard} with --data: each drawn step places "
                          f"the encoder's copies anew, which a sharded state does not follow yet (use encoder_shard=none)")
