"""A `PipelineModel` split into the schedule's chunks.

Layers are split as `partition.split_layers` splits the built-in model: as
the schedule states (`partition`/`balanced`), else as evenly as possible,
earlier chunks taking the remainder (the core's `LLM.layers_per_chunk`).  Chunk 0 also runs the embedding (where the encoder
features enter), the last chunk the head and the loss; `runtime.recompute.chunk_forward`
runs a chunk (as the schedule's `recompute(...)` asks).

When `balanced` folded the encoder into the chain (`Pipeline.encoder_layers`),
the tower's layers (`models.tower`) come first: chunk c runs `tower` of them on
the images (chunk 0) or on the tower's hidden state it receives, and the
chunk holding the tower's last layer runs the embedding right after it, on the
features it just made (`embeds`).  Its earlier chunks hold tower layers only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import ExecutorError
from ..partition import split_layers
from .protocol import PipelineModel, named_parameters_of
from .tower import tower_chain, tower_layers


@dataclass(frozen=True)
class ModelChunk:
    index: int
    layers: range
    first: bool
    last: bool
    tower: range = range(0)  # the encoder's layers folded into this chunk (`balanced`)
    tower_size: int = 0  # the whole tower's layers when folded; 0: the encoder runs as ops of its own

    @property
    def embeds(self) -> bool:
        """Runs the embedding: chunk 0, or with a folded tower the chunk holding its last layer."""
        if not self.tower_size:
            return self.first
        return bool(self.tower) and self.tower.stop == self.tower_size

    @property
    def tower_input(self) -> bool:
        """Its input is the tower's hidden state (a chunk after the first inside a folded tower)."""
        return bool(self.tower) and not self.first

    def tower_modules(self, model: PipelineModel) -> list[torch.nn.Module]:
        if not self.tower:
            return []
        chain = tower_chain(model, self.tower_size)  # (checked by `model_chunks`)
        return [chain[i] for i in self.tower]

    def modules(self, model: PipelineModel) -> list[torch.nn.Module]:
        parts = self.tower_modules(model) + ([model.embedding] if self.embeds else [])
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


def model_chunks(model: PipelineModel, chunks: int, counts: tuple[int, ...] | None = None,
                 tower: tuple[int, ...] | None = None) -> list[ModelChunk]:
    """Chunk c holds `counts[c]` layers when the schedule states a split, else an even
    share, and `tower[c]` of the encoder's layers when the schedule folded them in."""
    if tower is None:
        ranges = split_layers(len(model.layers), chunks, counts)
        return [ModelChunk(c, r, c == 0, c == chunks - 1) for c, r in enumerate(ranges)]
    size = sum(tower)
    tower_layers(model, size)  # (refuses a split the model's tower does not have)
    llm = _ranges(counts, len(model.layers), chunks, "LLM", len(model.layers))
    enc = _ranges(tower, size, chunks, "encoder", size)
    return [ModelChunk(c, llm[c], c == 0, c == chunks - 1, enc[c], size) for c in range(chunks)]


def _ranges(counts: tuple[int, ...] | None, total: int, chunks: int, what: str, have: int) -> list[range]:
    """Contiguous ranges of `counts` (some may be empty: a folded chain's chunk may hold
    encoder layers only, or LLM layers only)."""
    if counts is None or len(counts) != chunks or sum(counts) != total or min(counts) < 0:
        raise ExecutorError(f"the schedule splits the {what} as {list(counts or [])} but the model has "
                            f"{have} {what} layers in {chunks} chunks")
    bounds = [sum(counts[:c]) for c in range(chunks + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]
