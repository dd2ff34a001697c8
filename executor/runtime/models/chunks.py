"""A `PipelineModel` split into the schedule's chunks.

Layers are split as `partition.split_layers` splits the built-in model: as
the schedule states (`partition`/`balanced`), else as evenly as possible,
earlier chunks taking the remainder (the core's `LLM.layers_per_chunk`).  Chunk 0 also runs the embedding (where the encoder
features enter), the last chunk the head and the loss; `runtime.recompute.chunk_forward`
runs a chunk (as the schedule's `recompute(...)` asks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..partition import split_layers
from .protocol import PipelineModel, named_parameters_of


@dataclass(frozen=True)
class ModelChunk:
    index: int
    layers: range
    first: bool
    last: bool

    def modules(self, model: PipelineModel) -> list[torch.nn.Module]:
        parts = [model.embedding] if self.first else []
        parts += [model.layers[i] for i in self.layers]
        return parts + ([model.head] if self.last else [])

    def parameters(self, model: PipelineModel) -> list[tuple[str, torch.nn.Parameter]]:
        """(name, parameter) of everything this chunk owns that trains, in a fixed order."""
        return _trainable_once((name, p) for module in self.modules(model)
                               for name, p in named_parameters_of(model, module))


def _trainable_once(pairs) -> list:
    """The (key, parameter) pairs whose parameter trains, each parameter once, in order."""
    out, seen = [], set()
    for key, p in pairs:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((key, p))
    return out


def trainable_parameters(modules) -> list[torch.nn.Parameter]:
    """The parameters of `modules` that train, each once, in order."""
    return [p for _, p in _trainable_once((None, p) for m in modules for p in m.parameters())]


def model_chunks(model: PipelineModel, chunks: int, counts: tuple[int, ...] | None = None
                 ) -> list[ModelChunk]:
    """Chunk c holds `counts[c]` layers when the schedule states a split, else an even share."""
    ranges = split_layers(len(model.layers), chunks, counts)
    return [ModelChunk(c, r, c == 0, c == chunks - 1) for c, r in enumerate(ranges)]
