"""An example model plug-in: a small MLLM built differently from the built-in one.

    mpipe run --model examples.tiny_mllm:build 'transpose(1f1b(p=2, m=4))' --check-grads
    mpipe runs enqueue NAME -o model=tiny-mllm     # registered by mpipe's pyproject
    mpipe run --model examples.tiny_mllm:build 'per_batch(colocated(zb_h1(p=3, m=6)))' \
        --data data.json --steps 3 --check-grads     # each step planned from its own batch

Where the built-in model places ViT patch features at image-token positions
with learned positions and LayerNorm/GELU blocks, this one has

* a convolutional image stem with a *resampler*: a few learned queries
  cross-attend to the conv features, so every image becomes ``queries``
  tokens whatever its size (Flamingo / Qwen-VL-1 style);
* an embedding that *prepends* the features as a prefix before the text;
* RMSNorm + SwiGLU layers with ALiBi attention (no position embedding): the
  per-microbatch context is the ALiBi + causal + padding bias, computed from
  the batch on every rank;
* texts of varying length padded at the end.

It also runs ``mpipe run --data`` (`ExamplePlugin.data_batch`): a packed
sample is its pieces one after the other, each piece its images' ``queries``
tokens then its text, and the context's mask keeps each piece to itself.
What a sample costs follows from two things the plug-in states: a tile (or a
video frame) is one encoder input (one row of ``images``), and it becomes
``feature_shape()[0]`` = ``QUERIES`` LLM tokens; the run's workload prices
an encoder input and a token (docs/running.md, "Own models and data").

``factory(config, shape)``: ``config`` is None / ``"tiny"`` or
``"frozen"`` (the image tower frozen); ``shape`` a `BatchShape`.
"""
from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F
from torch import nn

from executor.runtime.models.meta_build import module_reset, replay_init
from executor.runtime.models.protocol import Batch, BatchShape, chained_loss

VOCAB, WIDTH, HEADS, LAYERS, QUERIES, IMAGE = 48, 32, 4, 4, 3, 8


class RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Resampler(nn.Module):
    """Images (n, 3, H, W) -> (n, QUERIES, WIDTH)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.SiLU(),
                                  nn.Conv2d(16, WIDTH, 3, stride=2, padding=1))
        self.queries = nn.Parameter(torch.randn(QUERIES, WIDTH) * 0.02)
        self.attn = nn.MultiheadAttention(WIDTH, 2, batch_first=True)
        self.norm = RMSNorm(WIDTH)

    def reset_parameters(self) -> None:  # its own parameter only (its layers reset themselves)
        nn.init.normal_(self.queries, std=0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.resample(self.conv(images))

    def conv(self, images: torch.Tensor) -> torch.Tensor:
        """The conv stem: (n, 3, H, W) -> (n, (H/4)*(W/4), WIDTH)."""
        return self.stem(images).flatten(2).transpose(1, 2)

    def resample(self, feats: torch.Tensor) -> torch.Tensor:
        """The queries cross-attending to the conv features: -> (n, QUERIES, WIDTH)."""
        q = self.queries.expand(feats.shape[0], -1, -1)
        out, _ = self.attn(q, feats, feats, need_weights=False)
        return self.norm(out + q)


class ConvStem(nn.Module):
    """The tower's first layer, when `balanced` folds it into LLM chunks."""

    def __init__(self, tower: Resampler):
        super().__init__()
        self.stem = tower.stem
        self._tower = (tower,)  # (not a submodule: its other parameters are the next layer's)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self._tower[0].conv(images)


class QueryResampler(nn.Module):
    """The tower's second layer: the resampler on the conv features."""

    def __init__(self, tower: Resampler):
        super().__init__()
        self.queries, self.attn, self.norm = tower.queries, tower.attn, tower.norm
        self._tower = (tower,)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self._tower[0].resample(feats)


class PrefixEmbedding(nn.Module):
    def __init__(self, images_per_sample: int):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.images_per_sample = images_per_sample

    def forward(self, batch: Batch, features: torch.Tensor | None) -> torch.Tensor:
        return self.merge(self.tokens(batch["tokens"]), batch, features)

    def merge(self, x: torch.Tensor, batch: Batch, features: torch.Tensor | None) -> torch.Tensor:
        """The token embeddings `x` with the images' features: a prefix of each
        sample, or, in a packed sample, at each piece's feature positions."""
        if features is None or not features.numel():
            return x
        if "feature_cols" in batch.fields:
            rows = torch.zeros_like(batch["feature_cols"])
            return x.index_put((rows, batch["feature_cols"]), features.reshape(-1, WIDTH).to(x.dtype))
        prefix = features.reshape(x.shape[0], self.images_per_sample * QUERIES, WIDTH).to(x.dtype)
        return torch.cat([prefix, x], dim=1)


class AlibiLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(WIDTH), RMSNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.out = nn.Linear(WIDTH, WIDTH, bias=False)
        self.gate = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.up = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.down = nn.Linear(2 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # Written to run tensor-parallel too (`ExamplePlugin.tp_plan`): the sizes come from
        # what qkv gives (this rank's heads, the whole sequence), not from `x` (under sequence
        # parallelism, this rank's block of the sequence) or HEADS.
        qkv = self.qkv(self.norm1(x))
        n, t = qkv.shape[:2]
        dh = WIDTH // HEADS
        q, k, v = (z.reshape(n, t, z.shape[-1] // dh, dh).transpose(1, 2) for z in qkv.chunk(3, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.out(y.transpose(1, 2).reshape(n, t, y.shape[1] * y.shape[3]))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyMLLM(nn.Module):
    def __init__(self, images_per_sample: int):
        super().__init__()
        self.vision = Resampler()
        self.embed = PrefixEmbedding(images_per_sample)
        self.blocks = nn.ModuleList(AlibiLayer() for _ in range(LAYERS))
        self.final = nn.Sequential(RMSNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False))


class ExamplePlugin:
    """`TinyMLLM` as a `PipelineModel` (see executor.runtime.models.protocol)."""

    def __init__(self, config: str | None, shape: BatchShape):
        if config not in (None, "tiny", "frozen"):
            raise ValueError(f"unknown config {config!r} (tiny, frozen)")
        torch.manual_seed(shape.seed)
        self.name, self.shape = "examples.tiny_mllm", shape
        self.root = TinyMLLM(shape.images)
        self.encoder = self.root.vision
        if config == "frozen":
            self.encoder.requires_grad_(False)
        self.embedding = self.root.embed
        # Optional: the tower as chained layers, so `balanced` can fold it into LLM chunks
        # layer by layer (`executor.runtime.models.tower`), and what the first hands on.
        self.encoder_layers = [ConvStem(self.encoder), QueryResampler(self.encoder)]
        self.layers = list(self.root.blocks)
        self.head = self.root.final
        self.prefix = shape.images * QUERIES
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)])
        self.slopes = slopes.view(1, HEADS, 1, 1)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """Optional: parameter `name`'s initial value, in place, whatever else this
        process holds.  With it, the model is built with its parameters on the meta
        device and each rank makes real only its own parts (`models.materialise`);
        here every module's own `reset_parameters` replayed for that parameter alone,
        seeded by its name (`models.meta_build.replay_init`)."""
        replay_init(self.root, name, tensor, self.shape.seed, module_reset)

    def tp_plan(self, sequence_parallel: bool) -> dict:
        """Tensor parallelism (optional; docs/running.md): submodule -> ParallelStyle for each
        layer and for the head.  The fused qkv is sharded head-aware; each rank keeps its
        heads' slice of the ALiBi bias (the layer's second input, Replicate -> Shard(heads));
        with sequence parallelism the norms run on sequence blocks (Shard(1))."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                       SequenceParallel)

        from executor.parallel.tensor_parallel import FusedColwiseParallel

        seq = Shard(1) if sequence_parallel else Replicate()
        layer = {"": PrepareModuleInput(input_layouts=(None, Replicate()), desired_input_layouts=(None, Shard(1)),
                                        use_local_output=True),
                 "qkv": FusedColwiseParallel(3, input_layouts=seq),
                 "out": RowwiseParallel(output_layouts=seq),
                 "gate": ColwiseParallel(input_layouts=seq), "up": ColwiseParallel(input_layouts=seq),
                 "down": RowwiseParallel(output_layouts=seq)}
        head = {"1": ColwiseParallel(input_layouts=seq, output_layouts=Replicate())}
        if sequence_parallel:
            layer.update(norm1=SequenceParallel(), norm2=SequenceParallel())
            head["0"] = SequenceParallel()
        return {"layers": layer, "head": head}

    def make_batch(self, step: int, mb: int, microbatches: int) -> Batch:
        s = self.shape
        g = torch.Generator().manual_seed(zlib.crc32(f"example:{s.seed}:{step}:{mb}".encode()))
        lengths = torch.randint(max(2, s.text_len // 2), s.text_len + 1, (s.microbatch_size,), generator=g)
        tokens = torch.randint(1, VOCAB, (s.microbatch_size, s.text_len), generator=g)
        keep = torch.arange(s.text_len).unsqueeze(0) < lengths.unsqueeze(1)
        tokens = tokens * keep
        targets = torch.where(keep[:, 1:], tokens[:, 1:], torch.full_like(tokens[:, 1:], -1))
        images = torch.randn(s.microbatch_size * s.images, 3, IMAGE, IMAGE, generator=g)
        return Batch(images, {"tokens": tokens, "targets": targets, "lengths": lengths})

    def data_batch(self, pieces, key: str, piece_keys=None) -> Batch:
        """One packed sample of `mpipe run --data`, a sequence of one row: each
        piece's encoder inputs (a tile or a video frame is one image, whose
        features fill ``QUERIES`` positions), then its text.  Targets are the
        next word within the piece's text, so none crosses a piece boundary;
        `context` lets a piece attend only within itself (ALiBi has no
        positions to restart: its bias depends only on the distance within the
        piece).  Each piece's words and pixels are seeded by its `piece_keys`
        entry, so it gets the same tensors in whichever pack it is; without
        them (a step plan made before pieces had keys) `key` seeds the pack."""
        rows = [sum(tiles) + frames for tiles, _, frames in pieces]
        length = sum(r * QUERIES + text for r, (_, text, _) in zip(rows, pieces))
        tokens = torch.zeros(1, length, dtype=torch.long)
        targets = torch.full((1, length), -1, dtype=torch.long)
        piece_of = torch.zeros(1, length, dtype=torch.long)
        pack_g = None if piece_keys else \
            torch.Generator().manual_seed(zlib.crc32(f"example-pack:{self.shape.seed}:{key}".encode()))
        cols: list[int] = []
        images = []
        pos = 0
        for i, (r, (_, text, _)) in enumerate(zip(rows, pieces)):
            g = pack_g if pack_g is not None else \
                torch.Generator().manual_seed(zlib.crc32(f"example-piece:{self.shape.seed}:{piece_keys[i]}".encode()))
            piece_of[0, pos:pos + r * QUERIES + text] = i
            cols += range(pos, pos + r * QUERIES)
            pos += r * QUERIES
            words = torch.randint(1, VOCAB, (text,), generator=g)
            tokens[0, pos:pos + text] = words
            targets[0, pos:pos + text - 1] = words[1:]
            pos += text
            images.append(torch.randn(r, 3, IMAGE, IMAGE, generator=g))
        return Batch(torch.cat(images), {"tokens": tokens, "targets": targets, "pieces": piece_of,
                                         "feature_cols": torch.tensor(cols, dtype=torch.long)})

    def context(self, batch: Batch) -> torch.Tensor:
        """ALiBi + causal + padding bias, (batch, heads, seq, seq); in a packed
        sample, ALiBi + causal within each piece."""
        if "pieces" in batch.fields:
            pieces = batch["pieces"]
            t = pieces.shape[1]
            pos = torch.arange(t, device=pieces.device)
            dist = (pos.view(1, -1) - pos.view(-1, 1)).float()  # key - query
            bias = self.slopes.to(pieces.device) * dist.view(1, 1, t, t)
            allowed = (dist <= 0).view(1, 1, t, t) & (pieces.unsqueeze(2) == pieces.unsqueeze(1)).unsqueeze(1)
            return bias.masked_fill(~allowed, float("-inf"))
        lengths = batch["lengths"] + self.prefix
        t = self.prefix + batch["tokens"].shape[1]
        pos = torch.arange(t, device=lengths.device)
        dist = (pos.view(1, -1) - pos.view(-1, 1)).float()  # key - query
        bias = self.slopes.to(lengths.device) * dist.view(1, 1, t, t)
        allowed = (dist <= 0).view(1, 1, t, t) & (pos.view(1, 1, 1, t) < lengths.view(-1, 1, 1, 1))
        allowed = allowed | torch.eye(t, dtype=torch.bool, device=lengths.device)  # pad rows see themselves
        return bias.masked_fill(~allowed, float("-inf"))

    def loss(self, logits: torch.Tensor, batch: Batch, normalizer: int) -> torch.Tensor:
        if "pieces" in batch.fields:  # a packed sample: targets at every position (-1: none)
            return F.cross_entropy(logits.reshape(-1, VOCAB), batch["targets"].reshape(-1),
                                   ignore_index=-1, reduction="sum") / normalizer
        text = logits[:, self.prefix:-1]
        return F.cross_entropy(text.reshape(-1, VOCAB), batch["targets"].reshape(-1),
                               ignore_index=-1, reduction="sum") / normalizer

    def target_count(self, batch: Batch) -> int:
        return int((batch["targets"] != -1).sum())

    def hidden_shape(self, batch: Batch) -> tuple[int, ...]:
        if "pieces" in batch.fields:
            return tuple(batch["tokens"].shape) + (WIDTH,)
        return (batch["tokens"].shape[0], self.prefix + batch["tokens"].shape[1], WIDTH)

    def feature_shape(self) -> tuple[int, ...]:
        return (QUERIES, WIDTH)

    def encoder_hidden_shape(self, images: int, layer: int) -> tuple[int, ...]:
        """What `encoder_layers[layer]` hands on (only the conv stem's is asked for)."""
        return (images, (IMAGE // 4) ** 2, WIDTH)

    def image_counts(self, microbatches: int) -> list[int]:
        return [self.shape.microbatch_size * self.shape.images] * microbatches

    def reference_loss(self, batch: Batch, normalizer: int) -> torch.Tensor:
        return chained_loss(self, batch, normalizer)


def build(config: str | None = None, shape: BatchShape = BatchShape()) -> ExamplePlugin:
    return ExamplePlugin(config, shape)
