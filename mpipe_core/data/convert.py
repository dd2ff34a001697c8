"""LLaVA-style annotations to records (docs/data.md, `scripts/convert_llava.py`).

Tiles per image by each preset's tokenization (our reading of each model's
preprocessing):

* `internvl`: the tile grid (i columns, j rows, 1 <= i*j <= 12) whose aspect
  ratio is closest to the image's; on a tie the larger grid when the image
  covers more than half of its 448 px tiles (InternVL's
  `find_closest_aspect_ratio`); the thumbnail tile it adds is left out.
* `llava-onevision`: the base image plus its 384 px crops, at most 9
  (anyres_max_9); one tile when the image fits one crop.
* `qwen2-vl`: the image rounded to 28 px cells, scaled to lie between 4 and
  16,384 cells (`smart_resize`'s min/max pixels); one tile a cell.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from mpipe_core.errors import WorkloadError

CHARS_PER_TOKEN = 4
TILERS = ("internvl", "llava-onevision", "qwen2-vl")


def internvl_tiles(width: int, height: int, size: int = 448, most: int = 12) -> int:
    ratio = width / height
    grids = sorted({(i, j) for n in range(1, most + 1) for i in range(1, n + 1) for j in range(1, n + 1)
                    if i * j <= most}, key=lambda g: g[0] * g[1])
    best, best_diff = (1, 1), math.inf
    for i, j in grids:
        diff = abs(ratio - i / j)
        if diff < best_diff:
            best, best_diff = (i, j), diff
        elif diff == best_diff and width * height > 0.5 * size * size * i * j:
            best = (i, j)
    return best[0] * best[1]


def onevision_tiles(width: int, height: int, size: int = 384, most: int = 9) -> int:
    crops = math.ceil(width / size) * math.ceil(height / size)
    return 1 if crops <= 1 else 1 + min(most, crops)


def qwen2_vl_tiles(width: int, height: int, cell: int = 28, least: int = 4, most: int = 16384) -> int:
    h, w = max(cell, round(height / cell) * cell), max(cell, round(width / cell) * cell)
    cells = (h // cell) * (w // cell)
    if cells > most:
        beta = math.sqrt(height * width / (most * cell * cell))
        h, w = math.floor(height / beta / cell) * cell, math.floor(width / beta / cell) * cell
    elif cells < least:
        beta = math.sqrt(least * cell * cell / (height * width))
        h, w = math.ceil(height * beta / cell) * cell, math.ceil(width * beta / cell) * cell
    return max(least, min(most, (h // cell) * (w // cell)))


TILE_RULES: dict[str, Callable[[int, int], int]] = {
    "internvl": internvl_tiles, "llava-onevision": onevision_tiles, "qwen2-vl": qwen2_vl_tiles}


def image_paths(record: dict[str, Any]) -> list[str]:
    value = record.get("images", record.get("image"))
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def record_sizes(record: dict[str, Any]) -> list[tuple[int, int]] | None:
    """Image sizes the record states (`image_size` or `image_sizes`), if any."""
    if "image_sizes" in record:
        return [tuple(s) for s in record["image_sizes"]]
    if "image_size" in record:
        return [tuple(record["image_size"])]
    return None


def convert(record: Any, where: str, preset: str, sizes: list[tuple[int, int]]) -> dict[str, Any]:
    """One annotation record (its images' sizes given) as a data record."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected an annotation object")
    tiler = TILE_RULES[preset]
    paths = image_paths(record)
    if len(sizes) != len(paths):
        raise WorkloadError(f"{where}: {len(paths)} images but {len(sizes)} sizes")
    for w, h in sizes:
        if not (isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0):
            raise WorkloadError(f"{where}: an image size must be two positive whole numbers, got {[w, h]}")
    if "text_tokens" in record:
        text = record["text_tokens"]
    else:
        chars = sum(len(str(turn.get("value", ""))) for turn in record.get("conversations", [])
                    if isinstance(turn, dict))
        text = math.ceil(chars / CHARS_PER_TOKEN)
    out: dict[str, Any] = {"images": len(paths), "tiles": [tiler(w, h) for w, h in sizes], "text_tokens": text}
    if "video" in record:
        if "frames" not in record:
            raise WorkloadError(f"{where}: a video record needs a 'frames' count")
        out["frames"] = record["frames"]
    return out
