"""The core workload that describes the executor's model, so the schedule the
core evaluates has exactly the ops the executor runs (layers, encoder,
trainable or frozen, images per microbatch) and costs in proportion to the
model's FLOPs (unit: one LLM layer's forward on one microbatch)."""
from __future__ import annotations

from typing import Any

from .model import ModelConfig


def _block_flops(tokens: int, width: int, seq: int) -> float:
    # qkv + proj + 2 MLP matmuls (2 * 12 d^2 per token) + attention scores/values.
    return 24.0 * tokens * width * width + 4.0 * tokens * seq * width


def workload_for(cfg: ModelConfig, name: str | None = None) -> dict[str, Any]:
    tokens = cfg.batch * cfg.seq_len
    layer = _block_flops(tokens, cfg.d_model, cfg.seq_len)
    doc: dict[str, Any] = {
        "name": name or "executor-model",
        "llm": {"layers": cfg.n_layer, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.0,
                "boundary_bytes": 4.0 * tokens * cfg.d_model},
        "encoders": [],
    }
    if cfg.encoder is not None:
        tpi = cfg.tokens_per_image
        per_image = (cfg.enc_layers * _block_flops(tpi, cfg.d_enc, tpi)
                     + 2.0 * tpi * (cfg.channels * cfg.patch ** 2 * cfg.d_enc
                                    + cfg.d_enc * cfg.d_model + cfg.d_model ** 2))
        f = per_image / layer
        doc["encoders"].append({
            "name": cfg.encoder, "f": f, "b": f, "w": f, "trainable": cfg.trainable_encoder,
            "layers": cfg.enc_layers,  # (`balanced` folds the tower block by block: `TowerLayer`)
            "output_bytes": 4.0 * tpi * cfg.d_model,
            "input_bytes": 4.0 * cfg.channels * cfg.image_size ** 2,
            "param_bytes": 4.0 * (cfg.enc_layers * 12 * cfg.d_enc ** 2),
            "activation": f,
            "images": {"min": cfg.images_min, "max": cfg.images_max, "seed": cfg.images_seed},
        })
    return doc
