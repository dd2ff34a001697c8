"""The executor's MLLM: a ViT encoder feeding a decoder-only language model.

nanoGPT-plain on purpose: one file, one config dataclass, no tricks.

* `VisionEncoder` ("vision"): patch embedding (a linear map of flattened
  patches, i.e. a stride-`patch` convolution), learned position embedding,
  non-causal transformer blocks, final norm and a 2-layer projector into the
  LLM's width.  Images are independent, so any split of a microbatch's images
  into shards gives the same features.
* `LanguageModel` ("llm"): token embedding + learned positions, causal blocks,
  final norm, LM head; next-token cross-entropy on the text tokens only.
  It can be built holding only some of its layers (`layers=`) and only the
  first/last parts (`embed=`, `head=`): that is how a pipeline rank builds the
  chunks it owns.  Every parameter is initialised from its own full name and
  the seed, so a partial model holds exactly the reference model's values.
* `make_microbatch`: deterministic synthetic data from (seed, step, mb).

Sequence layout of one sample: image tokens (all of its images, in order),
then `text_len` text tokens, then padding up to the microbatch-independent
length `seq_len`.  Attention is causal, so trailing padding changes nothing.
A packed microbatch (`data_microbatch`) holds several pieces in one sequence:
each piece attends only within itself (a block-diagonal causal mask) and its
positions start at 0, as varlen attention with per-sample `cu_seqlens` runs a
packed sample, so a piece's loss does not depend on the pieces beside it.
The loss of a microbatch is its summed token loss divided by the token count
of the whole step, so the microbatch losses add up to the step's mean loss.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import asdict, dataclass
from typing import Iterable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    d_model: int = 32
    n_layer: int = 8
    n_head: int = 2
    text_len: int = 16
    batch: int = 1  # samples per microbatch
    # The vision tower; `encoder=None` makes a text-only LLM.
    encoder: str | None = "vision"
    trainable_encoder: bool = True
    image_size: int = 8
    patch: int = 4
    channels: int = 3
    d_enc: int = 32
    enc_layers: int = 2
    enc_heads: int = 2
    # Images per microbatch drawn like `mpipe_core.workloads.encoder.Encoder.image_counts`.
    images_min: int = 1
    images_max: int = 1
    images_seed: int = 0
    seed: int = 0
    # With `mpipe run --data`: the longest packed sequence (the position table's
    # length); a microbatch is then one pack of its own length (`data_batch`).
    max_seq: int | None = None

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch) ** 2

    @property
    def max_images_per_sample(self) -> int:
        if self.encoder is None:
            return 0
        return -(-self.images_max // self.batch)

    @property
    def seq_len(self) -> int:
        if self.max_seq is not None:
            return self.max_seq
        return self.max_images_per_sample * self.tokens_per_image + self.text_len

    def image_counts(self, microbatches: int) -> list[int]:
        """Images in each microbatch (the same draw as the core's workload)."""
        if self.encoder is None:
            return [0] * microbatches
        rng = random.Random(self.images_seed)
        return [rng.randint(self.images_min, self.images_max) for _ in range(microbatches)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> "ModelConfig":
        return cls(**doc)


# Named sizes for `mpipe run --model`.
MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "tiny-text": ModelConfig(encoder=None),
    "tiny-frozen": ModelConfig(trainable_encoder=False),
    "tiny-varimg": ModelConfig(images_min=1, images_max=4, batch=2),
    "small": ModelConfig(vocab=256, d_model=128, n_layer=16, n_head=4, text_len=64,
                         image_size=32, patch=8, d_enc=128, enc_layers=4, enc_heads=4,
                         images_min=1, images_max=4, batch=2),
    # Encoder-heavy: a tower that costs several LLM stages (the transpose regime).
    "vit-heavy": ModelConfig(vocab=128, d_model=64, n_layer=8, n_head=4, text_len=32,
                             image_size=32, patch=8, d_enc=256, enc_layers=8, enc_heads=4,
                             images_min=4, images_max=4, batch=1, trainable_encoder=False),
}


# --------------------------------------------------------------------------- layers

class Attention(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool):
        super().__init__()
        if d % heads:
            raise ValueError(f"width {d} is not divisible by {heads} heads")
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        # (q, k, v, mask) -> y in place of the local attention below; context parallelism
        # installs one that all-gathers K and V (`executor.parallel.context_parallel`).
        self.core = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask`: (n, 1, t, t) bool, True where a query may attend a key (then
        instead of the plain causal mask); None: causal (or full) attention."""
        n, t, d = x.shape
        # (under tensor parallelism qkv gives this rank's heads only: [q; k; v] of heads / tp,
        # `executor.parallel.tensor_parallel`; so the head count follows the width it gets)
        q, k, v = self.qkv(x).chunk(3, dim=2)
        dh = d // self.heads
        q, k, v = (z.reshape(n, t, z.shape[-1] // dh, dh).transpose(1, 2) for z in (q, k, v))
        if self.core is not None:
            y = self.core(q, k, v, mask)
        elif mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(n, t, y.shape[1] * y.shape[3]))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, causal)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def init_by_name(module: nn.Module, prefix: str, seed: int) -> None:
    """Initialise every parameter from (seed, full name): order-independent.  A
    module built on the `meta` device is left as it is (a rank materialises
    only its own parts, by the same rule: `init_parameter`)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not p.is_meta:
                init_parameter(f"{prefix}.{name}", p, seed)


def init_parameter(full_name: str, p: torch.Tensor, seed: int) -> None:
    """One parameter's initial value from (seed, its full name in `MLLM`), in place."""
    with torch.no_grad():
        if full_name.endswith("bias"):
            p.zero_()
        elif ".ln" in f".{full_name.split('.', 1)[1]}":  # LayerNorm weight
            p.fill_(1.0)
        else:
            g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{full_name}".encode()))
            if p.dtype == torch.float32 and p.device.type == "cpu":  # in place: no temporaries
                torch.randn(p.shape, generator=g, out=p.data).mul_(0.02)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


# --------------------------------------------------------------------------- encoder

class VisionEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.channels * cfg.patch * cfg.patch, cfg.d_enc)
        self.pos = nn.Parameter(torch.zeros(cfg.tokens_per_image, cfg.d_enc))
        self.blocks = nn.ModuleList(Block(cfg.d_enc, cfg.enc_heads, causal=False)
                                    for _ in range(cfg.enc_layers))
        self.ln_f = nn.LayerNorm(cfg.d_enc)
        self.proj_in = nn.Linear(cfg.d_enc, cfg.d_model)
        self.proj_out = nn.Linear(cfg.d_model, cfg.d_model)
        init_by_name(self, cfg.encoder or "vision", cfg.seed)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(n, C, H, W) images -> (n, tokens_per_image, d_model) features."""
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        return self.tail(x)

    def stem(self, images: torch.Tensor) -> torch.Tensor:
        """Patch embedding plus positions: (n, C, H, W) -> (n, tokens_per_image, d_enc)."""
        p = self.cfg.patch
        n, c, h, w = images.shape
        patches = images.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return self.patch_embed(patches.reshape(n, (h // p) * (w // p), c * p * p)) + self.pos

    def tail(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and projector into the LLM's width."""
        return self.proj_out(F.gelu(self.proj_in(self.ln_f(x))))


class TowerLayer(nn.Module):
    """Block `index` of a `VisionEncoder` as one layer of the tower's chain
    (`balanced` folds the tower into LLM chunks layer by layer): the first also
    runs the patch stem, the last the final norm and projector, so chaining
    them is the encoder's own forward, op for op."""

    def __init__(self, encoder: VisionEncoder, index: int):
        super().__init__()
        self.index, self.first, self.last = index, index == 0, index == len(encoder.blocks) - 1
        self.block = encoder.blocks[index]
        if self.first:
            self.patch_embed, self.pos = encoder.patch_embed, encoder.pos
        if self.last:
            self.ln_f, self.proj_in, self.proj_out = encoder.ln_f, encoder.proj_in, encoder.proj_out
        self._encoder = (encoder,)  # (a tuple: not a submodule, so parameters are not listed twice)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        encoder = self._encoder[0]
        x = self.block(encoder.stem(x) if self.first else x)
        return encoder.tail(x) if self.last else x


# --------------------------------------------------------------------------- language model

class LanguageModel(nn.Module):
    """The decoder; optionally only some layers and parts of it (a pipeline rank's share)."""

    def __init__(self, cfg: ModelConfig, layers: Iterable[int] | None = None,
                 embed: bool = True, head: bool = True):
        super().__init__()
        self.cfg = cfg
        keep = range(cfg.n_layer) if layers is None else sorted(set(layers))
        if embed:
            # (its own initialiser is skipped: `init_by_name` sets it, and on the meta device
            # `normal_` would import torch's Python decompositions, ~75 MB per process)
            self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model, _weight=torch.empty(cfg.vocab, cfg.d_model))
            self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        # Keyed by the global layer index so names match the full model's.
        self.blocks = nn.ModuleDict({str(i): Block(cfg.d_model, cfg.n_head, causal=True) for i in keep})
        if head:
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        init_by_name(self, "llm", cfg.seed)

    def embed(self, tokens: torch.Tensor, features: torch.Tensor | None,
              image_index: tuple[torch.Tensor, torch.Tensor],
              positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token embedding with the image features placed at their positions;
        `positions` (a packed microbatch's, restarting per piece) index the
        position table, else positions run 0, 1, ..."""
        x = self.tok_emb(tokens)
        if features is not None and features.shape[0] > 0:
            flat = features.reshape(-1, features.shape[-1]).to(x.dtype)  # (bf16 under autocast)
            x = x.index_put(image_index, flat)
        if positions is not None:
            return x + self.pos[positions]
        return x + self.pos[:x.shape[1]]  # (a packed microbatch may be shorter than seq_len)

    def run_layers(self, x: torch.Tensor, layers: Iterable[int], mask: torch.Tensor | None = None) -> torch.Tensor:
        for i in layers:
            x = self.blocks[str(i)](x, mask)
        return x

    def loss(self, x: torch.Tensor, targets: torch.Tensor, normalizer: int) -> torch.Tensor:
        """Summed next-token loss over targets != -1, divided by the step's token count."""
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-1, reduction="sum") / normalizer


class MLLM(nn.Module):
    """The whole model in one process: the reference the pipeline must equal."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.llm = LanguageModel(cfg)
        if cfg.encoder is not None:
            self.add_module(cfg.encoder, VisionEncoder(cfg))
            if not cfg.trainable_encoder:
                getattr(self, cfg.encoder).requires_grad_(False)

    @property
    def encoder(self) -> VisionEncoder | None:
        return None if self.cfg.encoder is None else getattr(self, self.cfg.encoder)

    def microbatch_loss(self, mb: "Microbatch", normalizer: int) -> torch.Tensor:
        feats = self.encoder(mb.images) if self.encoder is not None else None
        x = self.llm.embed(mb.tokens, feats, mb.image_index, mb.positions)
        x = self.llm.run_layers(x, range(self.cfg.n_layer), piece_mask(mb.pieces))
        return self.llm.loss(x, mb.targets, normalizer)


# --------------------------------------------------------------------------- data

class Microbatch(NamedTuple):
    tokens: torch.Tensor  # (batch, seq_len) int64; image and pad positions hold 0
    targets: torch.Tensor  # (batch, seq_len) int64; -1 where no loss
    images: torch.Tensor  # (n_images, C, H, W)
    image_index: tuple[torch.Tensor, torch.Tensor]  # (sample, position) of each image token
    # A packed microbatch's (`data_microbatch`): each position's piece and its place in it.
    pieces: torch.Tensor | None = None  # (batch, seq_len) int64: 0, 0, ..., 1, 1, ...
    positions: torch.Tensor | None = None  # (batch, seq_len) int64: 0, 1, ..., 0, 1, ...

    def to(self, device) -> "Microbatch":
        return Microbatch(self.tokens.to(device), self.targets.to(device), self.images.to(device),
                          tuple(t.to(device) for t in self.image_index),
                          *(None if t is None else t.to(device) for t in (self.pieces, self.positions)))


def piece_mask(pieces: torch.Tensor | None) -> torch.Tensor | None:
    """Block-diagonal causal attention: (n, 1, t, t), True where query i and key
    j <= i are of the same piece (`pieces`: (n, t) each position's piece)."""
    if pieces is None:
        return None
    t = pieces.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=pieces.device).tril()
    return (pieces.unsqueeze(2) == pieces.unsqueeze(1)).unsqueeze(1) & causal


def images_per_sample(cfg: ModelConfig, n_images: int) -> list[int]:
    """A microbatch's images spread over its samples, earlier samples taking the remainder."""
    base, extra = divmod(n_images, cfg.batch)
    return [base + (1 if i < extra else 0) for i in range(cfg.batch)]


def shard_bounds(n_images: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous image ranges of `shards` shards, earlier shards taking the remainder."""
    base, extra = divmod(n_images, shards)
    bounds, start = [], 0
    for k in range(shards):
        size = base + (1 if k < extra else 0)
        bounds.append((start, start + size))
        start += size
    return bounds


def tokens_per_step(cfg: ModelConfig, microbatches: int) -> int:
    """Predicted tokens in one step (the loss normaliser)."""
    return microbatches * cfg.batch * (cfg.text_len - 1)


def make_microbatch(cfg: ModelConfig, step: int, mb: int, microbatches: int) -> Microbatch:
    n_images = cfg.image_counts(microbatches)[mb]
    g = torch.Generator().manual_seed(zlib.crc32(f"data:{cfg.seed}:{step}:{mb}".encode()))
    text = torch.randint(1, cfg.vocab, (cfg.batch, cfg.text_len), generator=g)
    images = torch.randn(n_images, cfg.channels, cfg.image_size, cfg.image_size, generator=g)
    tokens = torch.zeros(cfg.batch, cfg.seq_len, dtype=torch.long)
    targets = torch.full((cfg.batch, cfg.seq_len), -1, dtype=torch.long)
    tpi = cfg.tokens_per_image
    rows, cols = [], []
    for i, count in enumerate(images_per_sample(cfg, n_images)):
        start = count * tpi
        tokens[i, start:start + cfg.text_len] = text[i]
        targets[i, start:start + cfg.text_len - 1] = text[i, 1:]
        rows += [i] * start
        cols += list(range(start))
    index = (torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long))
    return Microbatch(tokens, targets, images, index)


def data_microbatch(cfg: ModelConfig, pieces, key: str, piece_keys=None) -> Microbatch:
    """One packed sample (`mpipe run --data`) as a microbatch of one sequence:
    each piece's image rows (a tile or a video frame is one encoder input of
    `tokens_per_image` tokens), then its text; next-token targets within each
    piece's text; each piece attends only within itself, its positions from 0
    (`Microbatch.pieces`, `.positions`).  `pieces`: (tiles per image, text
    tokens, frames) each.  `piece_keys` (one per piece: its place in the draw,
    `Sample.key`) seed each piece's words and pixels, so a piece gets the same
    tensors in whichever pack it is; without them (a plan stored before pieces
    had keys) `key`, the pack's place in the draw, seeds the whole pack."""
    tpi = cfg.tokens_per_image if cfg.encoder is not None else 0
    rows_per_piece = [sum(tiles) + frames for tiles, _, frames in pieces]
    length = sum(r * tpi + text for r, (_, text, _) in zip(rows_per_piece, pieces))
    tokens = torch.zeros(1, length, dtype=torch.long)
    targets = torch.full((1, length), -1, dtype=torch.long)
    piece_of = torch.zeros(1, length, dtype=torch.long)
    positions = torch.zeros(1, length, dtype=torch.long)
    image_shape = (cfg.channels, cfg.image_size, cfg.image_size)
    pack_g = None if piece_keys else torch.Generator().manual_seed(zlib.crc32(f"data-pack:{cfg.seed}:{key}".encode()))
    cols: list[int] = []
    images: list[torch.Tensor] = []
    pos = 0
    for i, (rows, (_, text, _)) in enumerate(zip(rows_per_piece, pieces)):
        g = pack_g if pack_g is not None else \
            torch.Generator().manual_seed(zlib.crc32(f"data-piece:{cfg.seed}:{piece_keys[i]}".encode()))
        size = rows * tpi + text
        piece_of[0, pos:pos + size] = i
        positions[0, pos:pos + size] = torch.arange(size)
        cols += range(pos, pos + rows * tpi)
        pos += rows * tpi
        words = torch.randint(1, cfg.vocab, (text,), generator=g)
        tokens[0, pos:pos + text] = words
        targets[0, pos:pos + text - 1] = words[1:]
        pos += text
        if pack_g is None and tpi:
            images.append(torch.randn((rows,) + image_shape, generator=g))
    if pack_g is not None:  # the old seeding: the pack's words, then all its pixels
        pixels = torch.randn((sum(rows_per_piece) if tpi else 0,) + image_shape, generator=pack_g)
    else:
        pixels = torch.cat(images) if images else torch.empty((0,) + image_shape)
    index = (torch.zeros(len(cols), dtype=torch.long), torch.tensor(cols, dtype=torch.long))
    return Microbatch(tokens, targets, pixels, index, piece_of, positions)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

