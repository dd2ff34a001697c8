"""The built-in MLLM (`executor.model`) expressed through the plug-in protocol.

Same modules, same parameter names (``llm.blocks.3.fc.weight``,
``vision.patch_embed.weight``, ...) and the same arithmetic as `MLLM`, so a
run through the protocol equals the built-in reference exactly.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from ..model import (MLLM, Microbatch, ModelConfig, TowerLayer, data_microbatch, init_parameter, make_microbatch,
                     piece_mask)
from .protocol import Batch, NormHead


class _Embedding(nn.Module):
    def __init__(self, tok_emb: nn.Embedding, pos: nn.Parameter):
        super().__init__()
        self.tok_emb = tok_emb
        self.pos = pos

    def forward(self, batch: Batch, features: torch.Tensor | None) -> torch.Tensor:
        x = self.tok_emb(batch["tokens"])
        if features is not None and features.shape[0] > 0:
            index = (batch["image_rows"], batch["image_cols"])
            x = x.index_put(index, features.reshape(-1, features.shape[-1]).to(x.dtype))
        if "positions" in batch.fields:  # a packed microbatch: positions restart per piece
            return x + self.pos[batch["positions"]]
        return x + self.pos[:x.shape[1]]


class _Layer(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        return self.block(hidden, context)


class BuiltinModel:
    """`MLLM(cfg)` as a `PipelineModel`."""

    def tp_plan(self, sequence_parallel: bool) -> dict:
        """Its tensor-parallel plan (`executor.parallel.tensor_parallel.builtin_plan`)."""
        from ...parallel.tensor_parallel import builtin_plan

        return builtin_plan(sequence_parallel)

    def __init__(self, cfg: ModelConfig, name: str = "builtin", meta: bool = False):
        self.cfg, self.name = cfg, name
        # meta: only shapes; a rank makes its own parts real (`models.materialise`).
        with torch.device("meta") if meta else nullcontext():
            self.root = MLLM(cfg)
        llm = self.root.llm
        self.encoder = self.root.encoder
        self.embedding = _Embedding(llm.tok_emb, llm.pos)
        self.layers = [_Layer(llm.blocks[str(i)]) for i in range(cfg.n_layer)]
        self.head = NormHead(llm.ln_f, llm.head)
        # The tower as layers (`balanced` folds them into LLM chunks; `models.tower`).
        self.encoder_layers = ([TowerLayer(self.encoder, i) for i in range(cfg.enc_layers)]
                               if self.encoder is not None else None)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """The initial value of parameter `name` (what `MLLM(cfg)` gives it), in place."""
        init_parameter(name, tensor, self.cfg.seed)

    def encoder_hidden_shape(self, images: int, layer: int) -> tuple[int, ...]:
        """What `encoder_layers[layer]` (not the last) hands on for `images` images."""
        return (images, self.cfg.tokens_per_image, self.cfg.d_enc)

    def context(self, batch: Batch) -> torch.Tensor | None:
        """A packed microbatch's block-diagonal causal mask (`model.piece_mask`); else None."""
        return piece_mask(batch.fields.get("pieces"))

    def loss(self, logits: torch.Tensor, batch: Batch, normalizer: int) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1),
            ignore_index=-1, reduction="sum") / normalizer

    def make_batch(self, step: int, mb: int, microbatches: int) -> Batch:
        return self._batch(make_microbatch(self.cfg, step, mb, microbatches))

    def data_batch(self, pieces, key: str, piece_keys=None) -> Batch:
        """A packed sample of `mpipe run --data` (`model.data_microbatch`)."""
        return self._batch(data_microbatch(self.cfg, pieces, key, piece_keys))

    def _batch(self, m: Microbatch) -> Batch:
        images = m.images if self.cfg.encoder is not None else None
        fields = {"tokens": m.tokens, "targets": m.targets,
                  "image_rows": m.image_index[0], "image_cols": m.image_index[1]}
        if m.pieces is not None:
            fields.update(pieces=m.pieces, positions=m.positions)
        return Batch(images, fields)

    def target_count(self, batch: Batch) -> int:
        return int((batch["targets"] != -1).sum())

    def hidden_shape(self, batch: Batch) -> tuple[int, ...]:
        return tuple(batch["tokens"].shape) + (self.cfg.d_model,)

    def feature_shape(self) -> tuple[int, ...]:
        return (self.cfg.tokens_per_image, self.cfg.d_model)

    def image_counts(self, microbatches: int) -> list[int]:
        return self.cfg.image_counts(microbatches)

    def reference_loss(self, batch: Batch, normalizer: int) -> torch.Tensor:
        m = Microbatch(batch["tokens"], batch["targets"],
                       batch.images if batch.images is not None else torch.empty(0),
                       (batch["image_rows"], batch["image_cols"]),
                       batch.fields.get("pieces"), batch.fields.get("positions"))
        return self.root.microbatch_loss(m, normalizer)
