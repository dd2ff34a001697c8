"""Named workloads, model sizes and device profiles.

Device figures are nominal (dense 16-bit peak, a typical achieved fraction,
per-device pipeline link bandwidth); calibrate with measured runs for real
predictions.  Model dimensions are the published ones.

Pure data (it imports nothing of the core): `workload.preset` parses these
documents, `analytic` reads the model and device tables.
"""
from __future__ import annotations

import copy
from typing import Any

# `memory`: the device's memory capacity in GB as sold (1e9 bytes; docs/memory.md).
# `peak_tflops`: dense 16-bit (BF16) peak; `efficiency`: the one achieved fraction
# of it a workload without a cluster runs at.  With a cluster (docs/cluster.md)
# compute follows the roofline instead: `hbm_TBps` at `hbm_efficiency`, GEMMs at
# `gemm_efficiency` (the GEMMs' fraction of peak) times the tile and wave
# quantization of `tile` over `compute_units` (their bytes at `hbm_efficiency`);
# `memory_efficiency` the memory-bound kernels' fraction of `hbm_TBps` (default:
# `hbm_efficiency`); `attention_efficiency` the unfused attention core's batched
# GEMMs' ceiling (default: `gemm_efficiency`); `flash_efficiency` the fused
# attention kernel's fraction of peak; `source` where the fractions come from.
# `cluster`: the device's default cluster preset.  Sources: docs/cluster.md.
DEVICES: dict[str, dict[str, Any]] = {
    # gemm_efficiency, memory_efficiency, attention_efficiency: fitted by `mpipe calibrate --device
    # --layer-profile examples/layer-profiles/korthikanti2022-table4.json` to Korthikanti et al. 2022,
    # Table 4 (one 22B GPT layer on a DGX A100, five settings; rms error 0.5%, max 0.9%).  The best
    # aligned matmul measured on A100 (267.9 of 312 TFLOP/s, 0.859) is a ceiling, not what a layer sustains.
    "a100": {"peak_tflops": 312, "efficiency": 0.5, "link_gbps": 25, "link_latency_us": 10, "memory": 80,
             "hbm_TBps": 2.039, "hbm_efficiency": 0.9, "gemm_efficiency": 0.7959, "memory_efficiency": 0.9,
             "attention_efficiency": 0.3325, "compute_units": 108, "tile": [256, 128], "flash_efficiency": 0.6,
             "cluster": "dgx-a100", "source": "fitted to Korthikanti et al. 2022, Table 4"},
    "h100": {"peak_tflops": 989, "efficiency": 0.45, "link_gbps": 50, "link_latency_us": 8, "memory": 80,
             "hbm_TBps": 3.35, "hbm_efficiency": 0.9, "gemm_efficiency": 0.801, "compute_units": 132,
             "tile": [256, 128], "flash_efficiency": 0.5, "cluster": "dgx-h100"},
    # H100's compute and links with HBM3e.
    "h200": {"peak_tflops": 989, "efficiency": 0.45, "link_gbps": 50, "link_latency_us": 8, "memory": 141,
             "hbm_TBps": 4.8, "hbm_efficiency": 0.9, "gemm_efficiency": 0.801, "compute_units": 132,
             "tile": [256, 128], "flash_efficiency": 0.5, "cluster": "dgx-h100"},
    # One die of an Ascend 910C (the NPU has two; the software sees each as a device):
    # 353.9 TFLOP/s dense BF16 (376 FP16), 64 GiB HBM at 1.6 TiB/s (vendor msmodeling).
    "ascend-910c": {"peak_tflops": 353.9, "efficiency": 0.4, "link_gbps": 196, "link_latency_us": 5, "memory": 64,
                    "hbm_TBps": 1.759, "hbm_efficiency": 0.6, "gemm_efficiency": 0.7, "compute_units": 24,
                    "tile": [128, 256], "flash_efficiency": 0.5, "cluster": "cloudmatrix384"},
    # Ascend 910B (Atlas 800T A2, the 376T part): the same die's figures (vendor msmodeling).
    "ascend-910b": {"peak_tflops": 353.9, "efficiency": 0.4, "link_gbps": 25, "link_latency_us": 5, "memory": 64,
                    "hbm_TBps": 1.759, "hbm_efficiency": 0.6, "gemm_efficiency": 0.7, "compute_units": 24,
                    "tile": [128, 256], "flash_efficiency": 0.5, "cluster": "atlas-910b"},
}

# `gated_mlp` (SwiGLU: three MLP matrices) and `kv_heads` (grouped-query
# attention) count in both the FLOPs (`transformer_cost`) and the parameters.
LLMS: dict[str, dict[str, Any]] = {
    "llama2-7b": {"hidden": 4096, "layers": 32, "heads": 32, "ffn": 11008, "seq_len": 4096, "vocab": 32000,
                  "gated_mlp": True},
    "llama2-13b": {"hidden": 5120, "layers": 40, "heads": 40, "ffn": 13824, "seq_len": 4096, "vocab": 32000,
                   "gated_mlp": True},
    "internlm2-20b": {"hidden": 6144, "layers": 48, "heads": 48, "ffn": 16384, "seq_len": 4096, "vocab": 92544,
                      "gated_mlp": True, "kv_heads": 8},
    "gpt3-175b": {"hidden": 12288, "layers": 96, "heads": 96, "ffn": 49152, "seq_len": 2048, "vocab": 50257},
    # Llama 3.1 405B (Dubey et al. 2024, Table 3): 126 layers, model dimension 16,384, FFN 53,248,
    # 128 attention heads, 8 key/value heads, vocabulary 128,256, trained at 8,192 tokens.
    "llama3-405b": {"hidden": 16384, "layers": 126, "heads": 128, "kv_heads": 8, "ffn": 53248, "seq_len": 8192,
                    "vocab": 128256, "gated_mlp": True},
}

VITS: dict[str, dict[str, Any]] = {
    # CLIP ViT-L/14 at 336 px (LLaVA-1.5's tower), ~0.3B.
    "vit-l-0.3b": {"hidden": 1024, "layers": 24, "heads": 16, "ffn": 4096, "patches_per_image": 576,
                   "image_size": 336},
    # InternViT-6B at 448 px (InternVL), pixel-shuffle merges 4 tokens into 1.
    "intern-vit-6b": {"hidden": 3200, "layers": 45, "heads": 25, "ffn": 12800, "patches_per_image": 1024,
                      "image_size": 448, "token_merge": 4},
    # SigLIP-SO400M/14 at 384 px (LLaVA-OneVision's tower; Zhai et al. 2023): 27x27 = 729 patches.
    "siglip-so400m": {"hidden": 1152, "layers": 27, "heads": 16, "ffn": 4304, "patches_per_image": 729,
                      "image_size": 384},
    # Qwen2-VL's 675M ViT (Wang et al. 2024), per 28x28-pixel cell: 4 patches of 14 px merged into one
    # token (a data tile of the qwen2-vl preset); attention within a cell only (an underestimate).
    "qwen2-vl-vit-cell": {"hidden": 1280, "layers": 32, "heads": 16, "ffn": 5120, "patches_per_image": 4,
                          "image_size": 28, "token_merge": 4},
    # ViT-22B (Dehghani et al.), as used with GPT-175B in Optimus.
    "vit-22b": {"hidden": 6144, "layers": 48, "heads": 48, "ffn": 24576, "patches_per_image": 256,
                "image_size": 224},
}

_DOCS: dict[str, dict[str, Any]] = {
    "uniform": {"llm": {"layers": None, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.0}},
    # The seed paper's small-scale regime: a heavy, frozen vision tower on a
    # small LLM (the encoder costs as much as several pipeline stages).
    "vit-heavy-small": {
        "llm": {"layers": 8, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.0},
        "encoders": [{"name": "vision", "f": 6.0, "b": 6.0, "w": 6.0, "trainable": False,
                      "output_bytes": 1.0, "input_bytes": 4.0, "param_bytes": 8.0, "activation": 2.0}],
        "link": {"latency": 0.05, "bandwidth": 20.0},
    },
    "llava-7b": {"model": "llama2-7b", "device": "a100",
                 "encoders": [{"name": "vision", "vit": "vit-l-0.3b", "trainable": False}]},
    "internvl-26b": {"model": "internlm2-20b", "device": "ascend-910c",
                     "encoders": [{"name": "vision", "vit": "intern-vit-6b", "trainable": True,
                                   "images": {"min": 1, "max": 4, "seed": 0}}]},
    "optimus-vit22b-gpt175b": {"model": "gpt3-175b", "device": "a100",
                               "encoders": [{"name": "vision", "vit": "vit-22b", "trainable": True}]},
    "llama2-7b": {"model": "llama2-7b", "device": "a100"},
    "gpt3-175b": {"model": "gpt3-175b", "device": "a100"},
}

PRESETS = tuple(_DOCS)


def preset_document(name: str) -> dict[str, Any]:
    """A fresh copy of a preset's document (editing it never changes the preset)."""
    return copy.deepcopy(dict(_DOCS[name], name=name))
