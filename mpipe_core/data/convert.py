"""LLaVA-style annotations to records (docs/data.md, `mpipe data convert`).

An annotation file is a JSON list of records with `image` (one path) or
`images` (a list of paths), `conversations` (`[{"from": ..., "value": ...}]`),
and optionally each image's size (`image_size: [w, h]`, or `image_sizes`, one
pair per image), `text_tokens`, and for a video `video` with `frames`.  Each
becomes one data record `{"images": k, "tiles": [...], "text_tokens": n}`
(`"frames"` for a video), checked against the records' limits.  Sizes a record
does not state come from `read_sizes` (the caller reads the files; this
module reads nothing).

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
from typing import Any, Callable, Iterator, Sequence

from mpipe_core.data.samples import parse_record
from mpipe_core.errors import WorkloadError

CHARS_PER_TOKEN = 4
MAX_ANNOTATION_FILE = 2 * 2**30  # bytes (LLaVA-1.5's 665k-record mix is about 1 GB)
MAX_IMAGE_SIDE = 1 << 20  # pixels
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


def image_paths(record: dict[str, Any], where: str = "record") -> list[str]:
    """The record's image paths (`image`: one, `images`: a list), checked."""
    key = "images" if "images" in record else "image"
    value = record.get(key)
    if value is None:
        return []
    paths = [value] if key == "image" else value
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        shape = "a path" if key == "image" else "a list of paths"
        raise WorkloadError(f"{where}: {key}: expected {shape}, got {value!r:.60}")
    return paths


def record_sizes(record: dict[str, Any], where: str = "record") -> list[tuple[int, int]] | None:
    """Image sizes the record states (`image_size` or `image_sizes`), if any, checked."""
    if "image_sizes" in record:
        key, pairs = "image_sizes", record["image_sizes"]
        if not isinstance(pairs, list):
            raise WorkloadError(f"{where}: image_sizes: expected a list of [width, height] pairs")
    elif "image_size" in record:
        key, pairs = "image_size", [record["image_size"]]
    else:
        return None
    out = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and
                all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_IMAGE_SIDE for v in pair)):
            raise WorkloadError(f"{where}: {key}: an image size is [width, height], two whole numbers from 1 to "
                                f"{MAX_IMAGE_SIDE}, got {pair!r:.60}")
        out.append((pair[0], pair[1]))
    return out


def _text_tokens(record: dict[str, Any], where: str) -> Any:
    if "text_tokens" in record:
        return record["text_tokens"]  # (checked with the record's limits)
    turns = record.get("conversations", [])
    if not isinstance(turns, list):
        raise WorkloadError(f"{where}: conversations: expected a list of {{\"from\": ..., \"value\": ...}} turns")
    chars = sum(len(str(turn.get("value", ""))) for turn in turns if isinstance(turn, dict))
    return math.ceil(chars / CHARS_PER_TOKEN)


def convert(record: Any, where: str, preset: str, sizes: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """One annotation record (its images' sizes given) as a data record."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected an annotation object, got {type(record).__name__}")
    tiler = TILE_RULES[preset]
    paths = image_paths(record, where)
    if len(sizes) != len(paths):
        raise WorkloadError(f"{where}: {len(paths)} images but {len(sizes)} sizes")
    out: dict[str, Any] = {"images": len(paths), "tiles": [tiler(w, h) for w, h in sizes],
                           "text_tokens": _text_tokens(record, where)}
    if "video" in record:
        if "frames" not in record:
            raise WorkloadError(f"{where}: a video record needs a 'frames' count")
        out["frames"] = record["frames"]
    parse_record(out, where)  # within the records' limits
    return out


def convert_annotations(doc: Any, source: str, preset: str,
                        read_sizes: Callable[[list[str], str], list[tuple[int, int]]] | None = None
                        ) -> Iterator[dict[str, Any]]:
    """Every record of an annotation document (`source` names it in messages), in
    order; `read_sizes(paths, where)` gives the sizes a record does not state
    (None: such a record is refused)."""
    if preset not in TILE_RULES:
        raise WorkloadError(f"unknown tokenization preset '{preset}' (known: {', '.join(TILERS)})")
    if not isinstance(doc, list):
        raise WorkloadError(f"{source}: expected a JSON list of annotation records, got {type(doc).__name__}")
    if not doc:
        raise WorkloadError(f"{source}: no annotation records")
    for i, record in enumerate(doc):
        where = f"{source}[{i}]"
        sizes = record_sizes(record, where) if isinstance(record, dict) else None
        if sizes is None and isinstance(record, dict):
            paths = image_paths(record, where)
            if paths and read_sizes is None:
                raise WorkloadError(f"{where}: no image_size in the record: give --images DIR to read the files")
            sizes = read_sizes(paths, where) if paths else []
        yield convert(record, where, preset, sizes or [])
