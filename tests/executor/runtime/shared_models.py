"""Plug-ins whose parameters are used by several parts (`examples.tiny_mllm` with
weights tied), for the gradient checks of shared parameters.

``build(config, shape)``: ``config`` is a comma-separated list of

* ``enc_emb``: one projection (``vision.proj``) applied by the encoder to its
  features and by the embedding to the token embeddings;
* ``layers``: layer 3 uses layer 0's ``gate`` and layer 4 layer 1's ``up``
  (with 6 layers under ``1f1b(p=2)`` both pairs sit on different ranks; under
  ``partition(zbv(p=2), [2, 1, 1, 2])`` the first pair does, the second is on
  one rank in two chunks);
* ``tied``: the LM head's weight is the token embedding's;
* ``frozen``: the image tower (not the shared projection) frozen;
* ``n=K``: K layers (default 6).
"""
from __future__ import annotations

import torch
from torch import nn

from examples.tiny_mllm import WIDTH, AlibiLayer, ExamplePlugin, PrefixEmbedding, Resampler
from executor.runtime.models.protocol import Batch, BatchShape


class ProjectedEncoder(nn.Module):
    def __init__(self, resampler: Resampler, proj: nn.Linear):
        super().__init__()
        self.resampler, self.proj = resampler, proj

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(self.resampler(images))


class ProjectedEmbedding(nn.Module):
    def __init__(self, embed: PrefixEmbedding, proj: nn.Linear):
        super().__init__()
        self.embed, self.proj = embed, proj

    def forward(self, batch: Batch, features: torch.Tensor | None) -> torch.Tensor:
        return self.embed.merge(self.proj(self.embed.tokens(batch["tokens"])), batch, features)


class SharedPlugin(ExamplePlugin):
    def __init__(self, config: str | None, shape: BatchShape):
        flags = [f.strip() for f in (config or "").split(",") if f.strip()]
        layers = 6
        for flag in [f for f in flags if f.startswith("n=")]:
            layers = int(flag[2:])
            flags.remove(flag)
        unknown = set(flags) - {"enc_emb", "layers", "tied", "frozen"}
        if unknown:
            raise ValueError(f"unknown flags {sorted(unknown)}")
        super().__init__(None, shape)
        root = self.root
        torch.manual_seed(shape.seed + 1)
        root.blocks = nn.ModuleList(AlibiLayer() for _ in range(layers))
        self.name = f"shared_models({config})"
        if "enc_emb" in flags:
            proj = nn.Linear(WIDTH, WIDTH)
            root.vision = ProjectedEncoder(root.vision, proj)
            root.embed = ProjectedEmbedding(root.embed, proj)
        if "layers" in flags:
            root.blocks[3].gate = root.blocks[0].gate
            root.blocks[4].up = root.blocks[1].up
        if "tied" in flags:
            tokens = root.embed.embed.tokens if "enc_emb" in flags else root.embed.tokens
            root.final[1].weight = tokens.weight
        self.encoder, self.embedding = root.vision, root.embed
        self.layers, self.head = list(root.blocks), root.final
        if "frozen" in flags:
            tower = root.vision.resampler if "enc_emb" in flags else root.vision
            tower.requires_grad_(False)


def build(config: str | None = None, shape: BatchShape = BatchShape()) -> SharedPlugin:
    return SharedPlugin(config, shape)
