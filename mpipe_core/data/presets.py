"""Data presets: three published tokenizations and a heavy-tailed mix.

Each is a whole `data` section (samples as a mix, tokens, packing); a
workload names one with ``"data": "internvl"`` or ``{"preset": "internvl",
...}`` (keys given beside `preset` replace the preset's).  Sources:

* `internvl`: InternVL 1.5/2's dynamic resolution cuts an image into 1 to 12
  tiles of 448x448 px, and pixel shuffle leaves 256 tokens a tile (Chen et
  al., "How Far Are We to GPT-4V?", 2024, section 3.2; `max_dynamic_patch`
  12; the thumbnail tile InternVL adds to a multi-tile image is left out).
  Packing as InternVL 2.5's fine-tuning scripts set it: `num_images_expected`
  48, `max_packed_tokens` 16384, `max_buffer_size` 20.
* `llava-onevision`: SigLIP at 384 px gives 729 tokens a crop; AnyRes keeps
  the base image and up to 9 crops, so up to 7,290 tokens an image; a video
  frame is pooled to 196 tokens (Li et al., "LLaVA-OneVision", 2024,
  section 3).  A tile here is one 729-token crop.
* `qwen2-vl`: naive dynamic resolution, one LLM token per 28x28 pixels
  (14 px patches merged 2x2), 4 to 16,384 tokens an image (Wang et al.,
  "Qwen2-VL", 2024, section 2.1; `min_pixels`/`max_pixels` of its
  processor).  A tile here is one 28x28 cell: one token.
* `heavy-tailed`: our own stress mix on InternVL's tiles and packing: a
  lognormal tail of long texts (median about 1,100 tokens, up to 16,000),
  up to 5 images of mostly few tiles and a 15% share of 16-48 frame videos.
  Long texts fill a pack's tokens before its tiles, so a pack holds from 1
  to 48 tiles (10th percentile 7, 90th 42): its encoder work varies several
  fold from one microbatch to the next.

The image/text mixes of the first three are plausible fine-tuning mixes,
not measured dataset statistics: give a converted annotation file for a
real dataset (docs/data.md).
"""
from __future__ import annotations

import copy
from typing import Any

_TEXT = {"lognormal": [5.3, 0.8], "min": 8, "max": 4096}

DATA_PRESETS: dict[str, dict[str, Any]] = {
    "internvl": {
        "samples": {"images": {"weights": [0.1, 0.75, 0.1, 0.05]}, "tiles": {"uniform": [1, 12]},
                    "text_tokens": _TEXT},
        "tokens": {"per_tile": 256, "per_frame": 256},
        "packing": {"max_tiles": 48, "max_tokens": 16384, "buffer": 20},
    },
    "llava-onevision": {
        "samples": {"images": {"weights": [0.1, 0.8, 0.1]}, "tiles": {"uniform": [1, 10]},
                    "text_tokens": _TEXT, "video": {"share": 0.1, "frames": {"uniform": [8, 32]}}},
        "tokens": {"per_tile": 729, "per_frame": 196},
        "packing": {"max_tiles": 64, "max_tokens": 16384, "buffer": 20},
    },
    "qwen2-vl": {
        "samples": {"images": {"weights": [0.1, 0.8, 0.1]},
                    "tiles": {"lognormal": [6.5, 1.2], "min": 4, "max": 16384}, "text_tokens": _TEXT},
        "tokens": {"per_tile": 1, "per_frame": 1},
        "packing": {"max_tiles": 16384, "max_tokens": 16384, "buffer": 20},
    },
    "heavy-tailed": {
        "samples": {"images": {"weights": [0.15, 0.6, 0.1, 0.05, 0.05, 0.05]},
                    "tiles": {"weights": [0.4, 0.2, 0.1, 0.05, 0.05, 0.04, 0.04, 0.03, 0.03, 0.02, 0.02, 0.02],
                              "from": 1},
                    "text_tokens": {"lognormal": [7.0, 1.5], "min": 8, "max": 16000},
                    "video": {"share": 0.15, "frames": {"uniform": [16, 48]}}},
        "tokens": {"per_tile": 256, "per_frame": 256},
        "packing": {"max_tiles": 48, "max_tokens": 16384, "buffer": 20},
    },
}


def data_preset(name: str) -> dict[str, Any]:
    """A fresh copy of a data preset's section."""
    return copy.deepcopy(DATA_PRESETS[name])
