"""Per-sample records: what one training sample holds (docs/data.md).

A record is one JSON line ``{"images": k, "tiles": [t1, ..., tk],
"text_tokens": n}``, optionally with ``"frames": f`` (video frames).  Image i
is cut into t_i tiles (InternVL's 448 px tiles, LLaVA-OneVision's crops, or
Qwen2-VL's 28x28-pixel token cells: the data's `tokens` section says what one
tile costs in LLM tokens); each video frame is one more encoder input.

Pure data: this module imports nothing of the core but its errors, so the
workload parser can check a `data` section when it reads one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mpipe_core.errors import WorkloadError

# What one record may hold (a record past these is refused, naming its line).
MAX_IMAGES = 1024
MAX_TILES_PER_IMAGE = 16_384
MAX_TEXT_TOKENS = 1_048_576
MAX_FRAMES = 4096
MAX_DATA_FILE = 256 * 2**20  # bytes
RECORD_KEYS = ("images", "tiles", "text_tokens", "frames")
RECORD_SHAPE = '{"images": k, "tiles": [t1, ...], "text_tokens": n}'


@dataclass(frozen=True)
class Sample:
    """One sample: tiles of each image, video frames, text tokens; `origin`
    says where it came from (file:line, or the mix's draw index).  `key` is
    its place in the drawn stream (`draw.draw_batches`: "n" for the n-th
    sample drawn, "n/k" for part k of one cut by packing; "" where not
    drawn): unlike `origin` it is unique in a stream that cycles a file, and
    it stays with the piece whichever pack carries it (`regroup`), so it is
    what seeds the piece's tensors in a run."""

    tiles: tuple[int, ...]
    text_tokens: int
    frames: int = 0
    origin: str = ""
    key: str = ""

    @property
    def images(self) -> int:
        return len(self.tiles)


def _count(record: dict, key: str, where: str, lo: int, hi: int) -> int:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise WorkloadError(f"{where}: {key}: expected a whole number from {lo} to {hi}, got {value!r}")
    return value


def refuse_unknown_keys(doc: dict, known: tuple[str, ...], where: str) -> None:
    """The first key of `doc` not in `known` (sorted; a long one cut to 40 characters), as an error."""
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise WorkloadError(f"{where}: unknown key '{str(unknown[0])[:40]}' (known: {', '.join(known)})")


def parse_record(record: object, where: str) -> Sample:
    """One record, checked: every count present, whole, within its limit."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected a record {RECORD_SHAPE}, got {type(record).__name__}")
    refuse_unknown_keys(record, RECORD_KEYS, where)
    for key in ("images", "tiles", "text_tokens"):
        if key not in record:
            raise WorkloadError(f"{where}: missing '{key}' (a record is {RECORD_SHAPE})")
    images = _count(record, "images", where, 0, MAX_IMAGES)
    tiles = record["tiles"]
    if not isinstance(tiles, list):
        raise WorkloadError(f"{where}: tiles: expected a list of whole numbers, one per image")
    if len(tiles) != images:
        raise WorkloadError(f"{where}: tiles: has {len(tiles)} entries but images says {images}")
    for i, t in enumerate(tiles):
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= MAX_TILES_PER_IMAGE:
            raise WorkloadError(f"{where}: tiles[{i}]: expected a whole number from 1 to "
                                f"{MAX_TILES_PER_IMAGE}, got {t!r}")
    text = _count(record, "text_tokens", where, 0, MAX_TEXT_TOKENS)
    frames = _count(record, "frames", where, 0, MAX_FRAMES) if "frames" in record else 0
    if not images and not frames and not text:
        raise WorkloadError(f"{where}: an empty record (no images, frames or text tokens)")
    return Sample(tuple(tiles), text, frames, where)


def parse_records(text: str, source: str) -> tuple[Sample, ...]:
    """Every record of a JSON-lines text (blank lines skipped)."""
    samples = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise WorkloadError(f"{where}: not JSON ({error.msg})") from None
        samples.append(parse_record(record, where))
    if not samples:
        raise WorkloadError(f"{source}: no records (expected one JSON object a line: {RECORD_SHAPE})")
    return tuple(samples)


def read_records(path: Path) -> tuple[Sample, ...]:
    """The records of a .jsonl file, size-limited."""
    try:
        size = path.stat().st_size
        if size > MAX_DATA_FILE:
            raise WorkloadError(f"{path}: {size:,} bytes, over the data file limit of {MAX_DATA_FILE:,}")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise WorkloadError(f"data.samples: no such file '{path}'") from None
    except OSError as error:
        raise WorkloadError(f"{path}: cannot read ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not UTF-8 text") from None
    return parse_records(text, str(path))
