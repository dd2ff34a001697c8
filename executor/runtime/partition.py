"""The LLM split into the schedule's `p*v` chunks, and which parameters each holds.

Layers are split as evenly as possible, earlier chunks taking the remainder
(the core's `LLM.layers_per_chunk`), unless the schedule states the split
(`partition`/`balanced`: chunk c holds `layers[c]` layers).  Chunk 0 also holds the token embedding
and is where encoder features enter the sequence; the last chunk holds the
final norm, the LM head and the loss.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import LanguageModel, Microbatch, ModelConfig, piece_mask
from ..errors import ExecutorError


def split_layers(layers: int, chunks: int, counts: tuple[int, ...] | None = None) -> list[range]:
    """Contiguous layer ranges per chunk: `counts` when given, else even."""
    if counts is not None:
        if len(counts) != chunks or sum(counts) != layers or min(counts) < 1:
            raise ExecutorError(f"the schedule splits the LLM as {list(counts)} but the model has {layers} "
                                f"layers in {chunks} chunks (each chunk needs at least one layer)")
        bounds = [sum(counts[:c]) for c in range(chunks + 1)]
        return [range(a, b) for a, b in zip(bounds, bounds[1:])]
    if chunks < 1:
        raise ExecutorError(f"need at least one chunk, got {chunks}")
    if layers < chunks:
        raise ExecutorError(f"the model has {layers} LLM layers but the schedule needs {chunks} "
                            "chunks (each chunk needs at least one layer)")
    base, extra = divmod(layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        size = base + (1 if c < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


@dataclass(frozen=True)
class Chunk:
    index: int
    layers: range
    first: bool
    last: bool

    def parameters(self, lm: LanguageModel) -> list[tuple[str, torch.nn.Parameter]]:
        """(full name, parameter) of everything this chunk owns, in a fixed order."""
        out = []
        if self.first:
            out += [("llm.tok_emb.weight", lm.tok_emb.weight), ("llm.pos", lm.pos)]
        for i in self.layers:
            out += [(f"llm.blocks.{i}.{n}", p) for n, p in lm.blocks[str(i)].named_parameters()]
        if self.last:
            out += [(f"llm.ln_f.{n}", p) for n, p in lm.ln_f.named_parameters()]
            out += [("llm.head.weight", lm.head.weight)]
        return out

    def forward(self, lm: LanguageModel, x: torch.Tensor | None, features: torch.Tensor | None,
                mb: Microbatch, normalizer: int) -> torch.Tensor:
        """Hidden states out (the loss on the last chunk); `x` is the input hidden
        state, or None on chunk 0, which embeds `mb.tokens` with `features`."""
        if self.first:
            x = lm.embed(mb.tokens, features, mb.image_index, mb.positions)
        x = lm.run_layers(x, self.layers, piece_mask(mb.pieces))
        if self.last:
            return lm.loss(x, mb.targets, normalizer)
        return x


def make_chunks(cfg: ModelConfig, chunks: int, counts: tuple[int, ...] | None = None) -> list[Chunk]:
    ranges = split_layers(cfg.n_layer, chunks, counts)
    return [Chunk(c, r, c == 0, c == chunks - 1) for c, r in enumerate(ranges)]


def build_rank_model(cfg: ModelConfig, held: list[Chunk]) -> LanguageModel | None:
    """The part of the LLM a rank holds: its chunks' layers, embedding, head."""
    if not held:
        return None
    layers = [i for ch in held for i in ch.layers]
    return LanguageModel(cfg, layers=layers, embed=any(ch.first for ch in held),
                         head=any(ch.last for ch in held))
