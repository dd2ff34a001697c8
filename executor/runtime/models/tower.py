"""The encoder as a chain of layers, for schedules that fold it into LLM chunks.

`balanced` puts the tower's layers at the head of the chain it cuts into
chunks (`mpipe_core.algebra.combinators.partition`): chunk c then runs
`encoder_layers[c]` of them inside its own F/B/W ops, and a chunk boundary
inside the tower is an ordinary pipeline transfer of the tower's hidden state.

How many layers the tower has is the workload's (`Encoder.layers`).  One layer
is the whole encoder, which any model can run.  More must match the model's
own split: a plug-in lists its tower as ``encoder_layers`` (modules chained on
the images, the last one giving the features, so chaining them *is*
``encoder(images)``), and says what a layer that is not the last hands on with
``encoder_hidden_shape(images, layer)`` (receive buffers are sized from it).
"""
from __future__ import annotations

from torch import nn

from .protocol import ModelError, PipelineModel


def tower_size(model: PipelineModel) -> int:
    """The layers the model's tower splits into (1: it does not split; 0: no encoder)."""
    if model.encoder is None:
        return 0
    layers = getattr(model, "encoder_layers", None)
    return len(layers) if layers else 1


def tower_layers(model: PipelineModel, count: int) -> list[nn.Module]:
    """The tower as `count` chained modules (what a folding schedule's workload says it has)."""
    if model.encoder is None:
        raise ModelError(f"the schedule folds encoder layers into its chunks but model '{model.name}' "
                         "has no encoder")
    if count == 1:
        return [model.encoder]
    have = tower_size(model)
    if count != have:
        split = (f"splits into {have} (its encoder_layers)" if have > 1
                 else "does not split (it lists no encoder_layers)")
        raise ModelError(f"the schedule folds {count} encoder layers into its chunks but the tower of model "
                         f"'{model.name}' {split}; give the workload's encoder layers: {have}")
    layers = list(model.encoder_layers)
    held = {id(p) for layer in layers for p in layer.parameters()}
    for name, p in model.encoder.named_parameters():
        if p.requires_grad and id(p) not in held:
            raise ModelError(f"model '{model.name}': encoder parameter {name} is in none of its encoder_layers, "
                             "so a folded tower would not train it")
    return layers


def tower_chain(model: PipelineModel, count: int) -> list[nn.Module]:
    """`tower_layers` without its checks (for a split already checked, on every forward)."""
    return [model.encoder] if count == 1 else list(model.encoder_layers)


def check_tower(model: PipelineModel, folded: tuple[int, ...] | None) -> None:
    """Refuse a folding schedule whose tower split the model cannot run (before launch)."""
    if folded is not None:
        tower_layers(model, sum(folded))
