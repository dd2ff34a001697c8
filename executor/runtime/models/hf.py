"""HuggingFace transformers adapters: LLaVA and Qwen2.5-VL as pipeline-able parts.

* ``hf:llava`` — `LlavaForConditionalGeneration` (CLIP vision tower +
  projector + Llama decoder).
* ``hf:qwen2_5_vl`` — `Qwen2_5_VLForConditionalGeneration` (window-attention
  ViT with patch merger + Qwen2 decoder with multimodal rotary positions).
* ``hf:/path/to/checkpoint`` — a local `save_pretrained` folder of either
  class (local files only, never a download).

Model configs for the built-in ones (``--model-config``): ``tiny`` (random
weights from a tiny config built here, seeded; the default), ``small`` (wider:
width 256, for profiling) and ``tiny-frozen`` / ``small-frozen`` (the same
with the encoder part frozen: LLaVA's tower and projector, Qwen's
``visual``); for a checkpoint, ``frozen`` freezes the same.

The parts reuse the HF modules themselves and follow the HF forward: the
encoder is the model's image-feature path (`get_image_features` for LLaVA,
`visual` for Qwen), the embedding scatters the features into the image
placeholder tokens (`masked_scatter`, as HF does), the context holds the
rotary tables (`rotary_emb`; Qwen's 3-D positions from `get_rope_index`) and
the causal/padding masks (`create_causal_mask`), the loss is the model's own
`loss_function` with ``num_items_in_batch`` = the step's target count.
`reference_loss` is the HF model's own forward, so ``--check-grads`` checks
the parts against HF, not against themselves.

Batches (seeded): each sample is, per image, a vision-start token and the
image's placeholder tokens, then a text of random length (at least half of
``text_len``) and right padding (attention mask 0, label -100).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mpipe_core.runs.model_spec import BatchShape

from .checkpoint import SafetensorsFolder
from .meta_build import meta_parameters, replay_init
from .protocol import Batch, ModelError, NormHead

FAMILIES = ("llava", "qwen2_5_vl")
IGNORE = -100


# --------------------------------------------------------------------------- tiny configs

# Sizes of the locally built configs: tiny for tests, small (compute well above
# the per-op overheads on a CPU) for the profile benchmark.
SIZES = {"tiny": dict(width=32, vision=32, image=8, vocab=64),
         "small": dict(width=256, vision=128, image=32, vocab=512)}


# Grouped-query attention (two query heads per key/value head) that tp=2 can split:
# tp must divide the key/value heads (`layout_checks`).
HEADS, KV_HEADS = 4, 2


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen2.5-VL's rotary split of half a head over (time, height, width), in its
    released proportions (16, 24, 24 of 64); what rounding leaves goes to width, whose
    frequencies are the lowest (at 8 dims: 1, 1, 2, so neighbours in a row differ)."""
    t = head_dim // 8
    h = (head_dim // 2 - t) // 2
    return [t, h, head_dim // 2 - t - h]


def _local_config(family: str, size: str):
    d = SIZES[size]
    w, vw, vocab = d["width"], d["vision"], d["vocab"]
    if family == "llava":
        from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

        vision = CLIPVisionConfig(hidden_size=vw, intermediate_size=2 * vw, num_hidden_layers=2,
                                  num_attention_heads=2, image_size=d["image"], patch_size=4, num_channels=3,
                                  projection_dim=vw)
        text = LlamaConfig(vocab_size=vocab, hidden_size=w, intermediate_size=2 * w, num_hidden_layers=4,
                           num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=1024,
                           tie_word_embeddings=False)
        return LlavaConfig(vision_config=vision, text_config=text, image_token_id=vocab - 1,
                           tie_word_embeddings=False)
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        vision_config=dict(depth=2, hidden_size=vw, intermediate_size=2 * vw, num_heads=2, in_channels=3,
                           patch_size=2, temporal_patch_size=2, spatial_merge_size=2, window_size=4,
                           out_hidden_size=w, fullatt_block_indexes=[1]),
        text_config=dict(vocab_size=vocab, hidden_size=w, intermediate_size=2 * w, num_hidden_layers=4,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=1024,
                         bos_token_id=0, eos_token_id=0,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": _mrope_section(w // HEADS)}),
        image_token_id=vocab - 1, video_token_id=vocab - 2, vision_start_token_id=vocab - 3,
        vision_end_token_id=vocab - 4,
        tie_word_embeddings=False)


def _family_of(model: nn.Module) -> str:
    name = type(model).__name__
    if name == "LlavaForConditionalGeneration":
        return "llava"
    if name == "Qwen2_5_VLForConditionalGeneration":
        return "qwen2_5_vl"
    raise ModelError(f"checkpoint class {name} is not supported (LlavaForConditionalGeneration, "
                     "Qwen2_5_VLForConditionalGeneration)")


def import_modelling(source: str) -> None:
    """Import transformers and the modelling code of `source`'s class (transformers
    imports it lazily, on first use: inside a rank's measured build)."""
    import json

    import transformers

    family = source
    if source not in FAMILIES:
        family = json.loads((Path(source) / "config.json").read_text()).get("model_type")
    if family == "llava":
        transformers.LlavaForConditionalGeneration  # noqa: B018  (the attribute access imports it)
    elif family == "qwen2_5_vl":
        transformers.Qwen2_5_VLForConditionalGeneration  # noqa: B018


def build_hf(source: str, config: str | None = None, shape: BatchShape = BatchShape()) -> "HFModel":
    """`source` is a family name (llava, qwen2_5_vl) or a local checkpoint folder."""
    try:
        import transformers
    except ImportError as error:  # pragma: no cover - the executor extra installs it
        raise ModelError("hf: models need transformers (pip install 'mpipe[executor]')") from error
    frozen = False
    if source in FAMILIES:
        known = [f"{size}{suffix}" for size in SIZES for suffix in ("", "-frozen")]
        if config not in [None] + known:
            raise ModelError(f"hf:{source}: unknown model config '{config}' ({', '.join(known)})")
        size = (config or "tiny").removesuffix("-frozen")
        frozen = config is not None and config.endswith("-frozen")
        cfg = _local_config(source, size)
        cfg._attn_implementation = "sdpa"
        cls = (transformers.LlavaForConditionalGeneration if source == "llava"
               else transformers.Qwen2_5_VLForConditionalGeneration)
        with meta_parameters():  # a rank makes its own parts real (`HFModel.init_parameter`)
            hf = cls(cfg)
        label, weights = f"hf:{source}", None
    else:
        if config not in (None, "frozen"):
            raise ModelError(f"hf:{source}: unknown model config '{config}' (frozen)")
        frozen = config == "frozen"
        path = Path(source)
        label = f"hf:{path}"
        if not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "has no config.json"
            raise ModelError(f"hf:{source}: the checkpoint folder {what} (hf:NAME is one of "
                             f"{', '.join(FAMILIES)}; hf:/path is a local save_pretrained folder)")
        try:
            cfg = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
            cfg._attn_implementation = "sdpa"
            with meta_parameters():  # the values come from the folder, a rank's own tensors only
                hf = transformers.AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32)
        except (OSError, ValueError, KeyError, TypeError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ModelError(f"hf:{source}: cannot load the checkpoint: {first}") from error
    hf = hf.float()
    hf.train()  # dropout is 0 in these configs; train mode keeps HF's training paths
    family = _family_of(hf)
    if frozen:  # the whole encoder part (LLaVA: tower and projector)
        for module in _vision_modules(hf, family):
            module.requires_grad_(False)
    if source not in FAMILIES:  # every parameter in the folder, in its shape (headers only)
        weights = SafetensorsFolder(Path(source), label, _checkpoint_names(hf))
        weights.check((n, tuple(p.shape)) for n, p in hf.named_parameters())
    return HFModel(label, hf, family, shape, weights)


def _checkpoint_names(hf: nn.Module):
    """Checkpoint key -> the model's parameter name, as HF's own loader renames it
    (`save_pretrained` writes LLaVA's legacy layout: ``language_model.model.layers...``);
    None for a tensor HF converts (merges, splits) rather than renames, which cannot be
    read alone."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(hf)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    state = hf.state_dict()  # (meta tensors: names only)

    def rename(key: str) -> str | None:
        name, converted = rename_source_key(key, renamings, converters, getattr(hf, "base_model_prefix", None),
                                            state)
        return None if converted is not None else name

    return rename


def _hf_init(ancestors: list[nn.Module]):
    """The initialiser HF runs on `ancestors[-1]`: the `_init_weights` of its nearest
    `PreTrainedModel` (a composite model dispatches each sub-model's own)."""
    from transformers import PreTrainedModel

    return next((m._init_weights for m in reversed(ancestors) if isinstance(m, PreTrainedModel)), None)


def _vision_modules(hf: nn.Module, family: str) -> list[nn.Module]:
    if family == "llava":
        return [hf.model.vision_tower, hf.model.multi_modal_projector]
    return [hf.model.visual]


# --------------------------------------------------------------------------- parts

class LlavaEncoder(nn.Module):
    """Pixels (n, C, H, W) -> projected features (n, tokens, d), HF's own path."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.vision_tower = hf.model.vision_tower
        self.multi_modal_projector = hf.model.multi_modal_projector
        self._features = hf.model.get_image_features  # a bound method, not a submodule

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        out = self._features(pixel_values=pixels, return_dict=True).pooler_output
        return torch.stack(list(out))


class QwenEncoder(nn.Module):
    """Patches (n, h*w, C*T*P*P) of n same-size images -> merged features (n, h*w/4, d)."""

    def __init__(self, hf: nn.Module, grid: tuple[int, int, int]):
        super().__init__()
        self.visual = hf.model.visual
        self.grid = grid

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        n = patches.shape[0]
        if n == 0:  # no image (a text-only pack, an empty shard): HF's ViT takes no empty grid
            return self._no_features(patches)
        grid = torch.tensor([self.grid] * n, dtype=torch.long, device=patches.device)
        out = self.visual(patches.reshape(-1, patches.shape[-1]), grid_thw=grid).pooler_output
        return out.reshape(n, -1, out.shape[-1])


    def _no_features(self, patches: torch.Tensor) -> torch.Tensor:
        """(0, tokens, d) features; where the tower trains, on its merger's graph (an
        empty slice, so a backward through it adds zeros), as a tower run on no rows is."""
        merger = self.visual.merger.mlp[-1]
        tokens = self.grid[0] * self.grid[1] * self.grid[2] // self.visual.spatial_merge_size ** 2
        bias = merger.bias
        if hasattr(bias, "to_local"):  # sharded for tp: a replicated DTensor
            bias = bias.to_local()
        empty = bias.reshape(1, 1, -1)[:0] if merger.bias.requires_grad else \
            patches.new_zeros(0, 1, merger.out_features)
        return empty.expand(0, tokens, merger.out_features)


class PlaceholderEmbedding(nn.Module):
    """Token embedding with image features scattered into the placeholder tokens."""

    def __init__(self, embed_tokens: nn.Embedding, image_token_id: int):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.image_token_id = image_token_id

    def forward(self, batch: Batch, features: torch.Tensor | None) -> torch.Tensor:
        ids = batch["input_ids"]
        x = self.embed_tokens(ids)
        if features is not None and features.numel():
            mask = (ids == self.image_token_id).unsqueeze(-1)
            x = x.masked_scatter(mask, features.reshape(-1, x.shape[-1]).to(x.dtype))
        return x


@dataclass
class DecoderContext:
    masks: list[Any]  # per layer (its attention type's mask)
    rope: tuple[torch.Tensor, torch.Tensor]
    position_ids: torch.Tensor | None


class DecoderLayer(nn.Module):
    def __init__(self, layer: nn.Module, index: int):
        super().__init__()
        self.layer = layer
        self.index = index

    def forward(self, hidden: torch.Tensor, ctx: DecoderContext) -> torch.Tensor:
        return self.layer(hidden, attention_mask=ctx.masks[self.index], position_embeddings=ctx.rope,
                          position_ids=ctx.position_ids)


# --------------------------------------------------------------------------- the model

class HFModel:
    """A HF LLaVA / Qwen2.5-VL model as a `PipelineModel`."""

    def __init__(self, name: str, hf: nn.Module, family: str, shape: BatchShape,
                 weights: SafetensorsFolder | None = None):
        self.name, self.root, self.family, self.shape = name, hf, family, shape
        self.weights = weights
        cfg = hf.config
        self.text_config = cfg.text_config
        self.lm = hf.model.language_model
        self.image_token_id = cfg.image_token_id
        self.start_token_id = getattr(cfg, "vision_start_token_id", None)
        if self.start_token_id is None:
            self.start_token_id = 1
        vc = cfg.vision_config
        if family == "llava":
            self.encoder = LlavaEncoder(hf)
            self.image_input = (vc.num_channels, vc.image_size, vc.image_size)
            cls_drop = 1 if cfg.vision_feature_select_strategy == "default" else 0
            self.tokens_per_image = (vc.image_size // vc.patch_size) ** 2 + 1 - cls_drop
        else:
            side = 2 * vc.spatial_merge_size  # patches per image side (smallest mergeable image)
            self.encoder = QwenEncoder(hf, (1, side, side))
            self.image_input = (side * side, vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2)
            self.tokens_per_image = side * side // vc.spatial_merge_size ** 2
        self.embedding = PlaceholderEmbedding(self.lm.embed_tokens, self.image_token_id)
        self.layers = [DecoderLayer(layer, i) for i, layer in enumerate(self.lm.layers)]
        self.head = NormHead(self.lm.norm, hf.lm_head)
        self.vocab = self.text_config.vocab_size
        reserved = {self.image_token_id, self.start_token_id, getattr(cfg, "video_token_id", None),
                    getattr(cfg, "vision_end_token_id", None)}
        self._text_vocab = torch.tensor([t for t in range(2, self.vocab) if t not in reserved])

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """Parameter `name`'s value, in place (`models.materialise`): read from the
        checkpoint folder, that tensor only; else HF's own initialiser replayed for
        it alone, seeded by its name (`meta_build.replay_init`)."""
        if self.weights is not None:
            self.weights.read_into(name, tensor)
        else:
            replay_init(self.root, name, tensor, self.shape.seed, _hf_init)

    # ------------------------------------------------------------------ tensor parallelism

    def tp_plan(self, sequence_parallel: bool) -> dict[str, dict[str, Any]]:
        """transformers' own plan for the LLM, ours for the vision tower and projector
        (`hf_tensor_parallel`)."""
        from .hf_tensor_parallel import encoder_plan, head_plan, layer_plan

        layers = layer_plan(getattr(self.text_config, "base_model_tp_plan", None), self.lm.layers[0], self.name,
                            sequence_parallel)
        return {"layers": layers, "head": head_plan(getattr(self.root, "_tp_plan", None), sequence_parallel),
                "encoder": encoder_plan(self.family)}

    def tensor_dims(self) -> dict[str, int | None]:
        """Heads, kv heads and widths tp must divide (`layout_checks`), from the configs."""
        from .hf_tensor_parallel import tensor_dims

        return tensor_dims(self.root, self.family)

    # ------------------------------------------------------------------ shapes

    @property
    def seq_len(self) -> int:
        return self.shape.images * (1 + self.tokens_per_image) + self.shape.text_len

    def hidden_shape(self, batch: Batch) -> tuple[int, ...]:
        return tuple(batch["input_ids"].shape) + (self.text_config.hidden_size,)

    def feature_shape(self) -> tuple[int, ...]:
        return (self.tokens_per_image, self.text_config.hidden_size)

    def image_counts(self, microbatches: int) -> list[int]:
        return [self.shape.microbatch_size * self.shape.images] * microbatches

    # ------------------------------------------------------------------ data

    def make_batch(self, step: int, mb: int, microbatches: int) -> Batch:
        s = self.shape
        g = torch.Generator().manual_seed(zlib.crc32(f"hf:{s.seed}:{step}:{mb}".encode()))
        n, seq = s.microbatch_size, self.seq_len
        ids = torch.zeros(n, seq, dtype=torch.long)
        mask = torch.zeros(n, seq, dtype=torch.long)
        labels = torch.full((n, seq), IGNORE, dtype=torch.long)
        for i in range(n):
            pos = 0
            for _ in range(s.images):
                ids[i, pos] = self.start_token_id
                ids[i, pos + 1:pos + 1 + self.tokens_per_image] = self.image_token_id
                pos += 1 + self.tokens_per_image
            text = int(torch.randint(max(2, s.text_len // 2), s.text_len + 1, (), generator=g))
            words = self._text_vocab[torch.randint(len(self._text_vocab), (text,), generator=g)]
            ids[i, pos:pos + text] = words
            labels[i, pos:pos + text] = words
            mask[i, :pos + text] = 1
        images = torch.randn((n * s.images,) + self.image_input, generator=g)
        fields = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if self.family == "qwen2_5_vl":
            fields["mm_token_type_ids"] = (ids == self.image_token_id).int()
        return Batch(images, fields)

    def data_batch(self, pieces, key: str, piece_keys=None) -> Batch:
        """A packed sample of `mpipe run --data` as one sequence: each piece's
        image rows (a tile or a video frame is one image input of
        `tokens_per_image` placeholder tokens: for Qwen2.5-VL one image of the
        encoder's grid; no separator tokens, so the sequence has exactly the
        data's token count), then its text.

        Packed as HF's `DataCollatorWithFlattening` packs: `position_ids` start
        at 0 in each piece and there is no 2-D attention mask, so HF's
        `create_causal_mask` finds the pieces from the positions and lets each
        attend only within itself; a piece's first token is no target (nothing
        of the piece predicts it).  Qwen2.5-VL's position ids are HF's packed
        form, (4, 1, seq): the text positions, then each piece's 3-D rotary
        positions (`_piece_rope`).  `piece_keys` (one per piece, its place in
        the draw) seed each piece's words and pixels, so a piece's loss is the
        same in whichever pack it is; without them (a plan stored before pieces
        had keys) `key` seeds the whole pack."""
        pack_g = None if piece_keys else \
            torch.Generator().manual_seed(zlib.crc32(f"hf-pack:{self.shape.seed}:{key}".encode()))
        rows = [sum(tiles) + frames for tiles, _, frames in pieces]
        length = sum(r * self.tokens_per_image + text for r, (_, text, _) in zip(rows, pieces))
        ids = torch.zeros(1, length, dtype=torch.long)
        labels = torch.full((1, length), IGNORE, dtype=torch.long)
        positions = torch.zeros(1, length, dtype=torch.long)
        rope = []
        images = []
        pos = 0
        for i, (r, (_, text, _)) in enumerate(zip(rows, pieces)):
            g = pack_g if pack_g is not None else \
                torch.Generator().manual_seed(zlib.crc32(f"hf-piece:{self.shape.seed}:{piece_keys[i]}".encode()))
            start = pos
            ids[0, pos:pos + r * self.tokens_per_image] = self.image_token_id
            pos += r * self.tokens_per_image
            words = self._text_vocab[torch.randint(len(self._text_vocab), (text,), generator=g)]
            ids[0, pos:pos + text] = words
            labels[0, pos:pos + text] = words
            pos += text
            labels[0, start] = IGNORE  # the piece's first token: predicted by nothing of the piece
            positions[0, start:pos] = torch.arange(pos - start)
            if self.family == "qwen2_5_vl":
                rope.append(self._piece_rope(r, text))
            if pack_g is None:
                images.append(torch.randn((r,) + self.image_input, generator=g))
        if pack_g is not None:  # the old seeding: the pack's words, then all its pixels
            pixels = torch.randn((sum(rows),) + self.image_input, generator=pack_g)
        else:
            pixels = torch.cat(images)
        if self.family == "llava":
            return Batch(pixels, {"input_ids": ids, "labels": labels, "position_ids": positions})
        position_ids = torch.cat([positions, torch.cat(rope, dim=1)]).unsqueeze(1)  # (4, 1, seq)
        return Batch(pixels, {"input_ids": ids, "labels": labels, "position_ids": position_ids,
                              "mm_token_type_ids": (ids == self.image_token_id).int()})

    def _piece_rope(self, images: int, text: int) -> torch.Tensor:
        """One piece's Qwen2.5-VL rotary positions (3, images * tokens_per_image +
        text), from 0: each image's from `get_rope_index` (one image of the
        encoder's grid alone), each next image or text continuing where the last
        ended, by `get_rope_index`'s own rule (its largest position + 1), as it
        places the images and texts of one sequence; text tokens take the same
        position on all three axes."""
        ids = torch.full((1, self.tokens_per_image), self.image_token_id, dtype=torch.long)
        one, _ = self.root.model.get_rope_index(ids, mm_token_type_ids=torch.ones_like(ids, dtype=torch.int),
                                                image_grid_thw=torch.tensor([self.encoder.grid]))
        image = one[:, 0]
        step = int(image.max()) + 1
        parts = [image + k * step for k in range(images)]
        parts.append(torch.arange(text).expand(3, -1) + images * step)
        return torch.cat(parts, dim=1)

    def target_count(self, batch: Batch) -> int:
        return int((batch["labels"][:, 1:] != IGNORE).sum())

    # ------------------------------------------------------------------ parts

    def _positions(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rotary position ids, text position ids for the mask and layers), as HF builds them."""
        ids = batch["input_ids"]
        if "position_ids" in batch.fields:  # a packed sample (`data_batch`): positions restart per piece
            pos = batch["position_ids"]
            if pos.ndim == 3:  # Qwen2.5-VL's packed form: text positions, then the 3-D rotary ones
                return pos[1:], pos[0]
            return pos, pos
        if self.family == "llava":
            pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            return pos, pos
        n_img = batch.images.shape[0] if batch.images is not None else 0
        grid = torch.tensor([self.encoder.grid] * n_img, dtype=torch.long, device=ids.device)
        pos, _ = self.root.model.get_rope_index(ids, mm_token_type_ids=batch["mm_token_type_ids"],
                                                image_grid_thw=grid if n_img else None,
                                                attention_mask=batch["attention_mask"])
        return pos, None

    def context(self, batch: Batch) -> DecoderContext:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        ids = batch["input_ids"]
        like = torch.zeros(ids.shape + (self.text_config.hidden_size,), device=ids.device)
        rope_pos, text_pos = self._positions(batch)
        # A packed sample has no 2-D mask: HF then masks per piece from its position ids.
        kw = dict(config=self.text_config, inputs_embeds=like, attention_mask=batch.fields.get("attention_mask"),
                  cache=None, position_ids=text_pos)
        types = getattr(self.text_config, "layer_types", None) or ["full_attention"] * len(self.layers)
        by_type = {"full_attention": create_causal_mask(**kw)}
        if "sliding_attention" in types:
            by_type["sliding_attention"] = create_sliding_window_causal_mask(**kw)
        self.lm.rotary_emb.to(ids.device)  # buffers only; no chunk holds it, so it is moved here
        rope = self.lm.rotary_emb(like, rope_pos)
        return DecoderContext([by_type[t] for t in types], rope, text_pos)

    def loss(self, logits: torch.Tensor, batch: Batch, normalizer: int) -> torch.Tensor:
        return self.root.loss_function(logits=logits, labels=batch["labels"], vocab_size=self.vocab,
                                       num_items_in_batch=normalizer)

    def reference_loss(self, batch: Batch, normalizer: int) -> torch.Tensor:
        """The HF model's own forward on the microbatch."""
        kw = dict(input_ids=batch["input_ids"], attention_mask=batch.fields.get("attention_mask"),
                  labels=batch["labels"], num_items_in_batch=normalizer)
        if "position_ids" in batch.fields:  # packed: HF masks per piece (no cache, no 2-D mask)
            kw.update(position_ids=batch["position_ids"], use_cache=False)
        if self.family == "llava":
            kw["pixel_values"] = batch.images
        elif batch.images.shape[0]:
            n = batch.images.shape[0]
            kw.update(pixel_values=batch.images.reshape(-1, batch.images.shape[-1]),
                      image_grid_thw=torch.tensor([self.encoder.grid] * n, dtype=torch.long),
                      mm_token_type_ids=batch["mm_token_type_ids"])
        return self.root(**kw).loss
