"""The workload's `data` section, checked (docs/data.md):

``{"samples": "FILE.jsonl" | MIX, "tokens": {"per_tile": 256, "per_frame": 256},
"packing": {"max_tiles": ..., "max_tokens": ..., "buffer": 100}, "seed": 0,
"balance": "none" | "tiles+tokens", "dp": 1}``, or a preset's name
(``"internvl"``), or ``{"preset": NAME, ...}`` with keys that replace the
preset's.  `dp` (data-parallel replicas) is for the explicit form; an
analytic workload states it as `parallel.dp`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import cycle
from pathlib import Path
from typing import Any, Iterator

from mpipe_core.errors import WorkloadError
from mpipe_core.data.mix import Mix, parse_mix
from mpipe_core.data.packing import DEFAULT_BUFFER, Packing, Tokens, check_fits
from mpipe_core.data.presets import DATA_PRESETS, data_preset
from mpipe_core.data.samples import MAX_TEXT_TOKENS, Sample, read_records, refuse_unknown_keys

DATA_KEYS = ("preset", "samples", "tokens", "packing", "seed", "balance", "dp")
BALANCES = ("none", "tiles+tokens")
MAX_PACK_TOKENS = 16 * MAX_TEXT_TOKENS
MAX_REPLICAS = 100_000


@dataclass(frozen=True)
class DataSpec:
    samples: tuple[Sample, ...] | Mix
    source: str  # the file's path, or "mix" / the preset's name
    tokens: Tokens
    packing: Packing
    seed: int = 0
    balance: str = "none"
    dp: int | None = None  # explicit form only; None: the workload's own (1, or parallel.dp)

    def stream(self) -> Iterator[Sample]:
        """Samples in order, endlessly: a file's records again from the top when
        they run out (InternVL's `replacement`), a mix's draws with the seed."""
        if isinstance(self.samples, Mix):
            return self.samples.samples(self.seed)
        return cycle(self.samples)


def _whole(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise WorkloadError(f"{where}: expected a whole number from {lo} to {hi}, got {value!r}")
    return value


def _section(doc: Any, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: expected an object with {', '.join(keys)}")
    refuse_unknown_keys(doc, keys, where)
    return doc


@lru_cache(maxsize=16)
def _records(path: str, mtime: float, size: int) -> tuple[Sample, ...]:
    return read_records(Path(path))


def parse_data(doc: Any, base: Path | None = None, analytic: bool = False) -> DataSpec:
    """The checked `data` section; a relative file name is read from `base`
    (the workload file's folder) when given, else the working folder."""
    preset_name = None
    if isinstance(doc, str):
        doc = {"preset": doc}
    doc = dict(_section(doc, "data", DATA_KEYS))
    if "preset" in doc:
        preset_name = doc.pop("preset")
        if preset_name not in DATA_PRESETS:
            raise WorkloadError(f"data.preset: unknown data preset {str(preset_name)[:40]!r} "
                                f"(known: {', '.join(DATA_PRESETS)})")
        doc = {**data_preset(preset_name), **doc}
    if "samples" not in doc:
        raise WorkloadError("data: missing 'samples' (a .jsonl file of records, a mix object or a preset)")
    if "packing" not in doc:
        raise WorkloadError('data: missing \'packing\' ({"max_tiles": ..., "max_tokens": ...})')
    tok = _section(doc.get("tokens", {}), "data.tokens", ("per_tile", "per_frame"))
    per_tile = _whole(tok.get("per_tile", 256), "data.tokens.per_tile", 1, MAX_TEXT_TOKENS)
    tokens = Tokens(per_tile, _whole(tok.get("per_frame", per_tile), "data.tokens.per_frame", 1, MAX_TEXT_TOKENS))
    pk = _section(doc["packing"], "data.packing", ("max_tiles", "max_tokens", "buffer"))
    for key in ("max_tiles", "max_tokens"):
        if key not in pk:
            raise WorkloadError(f"data.packing: missing '{key}'")
    packing = Packing(_whole(pk["max_tiles"], "data.packing.max_tiles", 1, MAX_PACK_TOKENS),
                      _whole(pk["max_tokens"], "data.packing.max_tokens", 1, MAX_PACK_TOKENS),
                      _whole(pk.get("buffer", DEFAULT_BUFFER), "data.packing.buffer", 0, 100_000))
    seed = _whole(doc.get("seed", 0), "data.seed", -(2**63), 2**63 - 1)
    balance = doc.get("balance", "none")
    if balance not in BALANCES:
        raise WorkloadError(f"data.balance: expected one of {', '.join(BALANCES)}, got {str(balance)[:40]!r}")
    dp = None
    if "dp" in doc:
        if analytic:
            raise WorkloadError("data.dp: an analytic workload states its replicas as parallel.dp")
        dp = _whole(doc["dp"], "data.dp", 1, MAX_REPLICAS)
    raw = doc["samples"]
    if isinstance(raw, str):
        path = Path(raw)
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            stat = path.stat()
        except OSError:
            raise WorkloadError(f"data.samples: no such file '{raw[:200]}'") from None
        samples: tuple[Sample, ...] | Mix = _records(str(path), stat.st_mtime, stat.st_size)
        source = str(path)
        largest = max(samples, key=lambda s: max(s.tiles, default=0))
        if largest.tiles:
            check_fits(max(largest.tiles), False, tokens, packing, f"at {largest.origin}")
        video = next((s for s in samples if s.frames), None)
        if video is not None:
            check_fits(1, True, tokens, packing, f"at {video.origin}")
    else:
        samples = parse_mix(raw)
        source = preset_name or "mix"
        if samples.images.hi > 0:
            check_fits(samples.tiles.hi, False, tokens, packing, "the largest image the mix draws")
        if samples.frames is not None and samples.video_share > 0:
            check_fits(1, True, tokens, packing, "the mix's video frames")
    return DataSpec(samples, source, tokens, packing, seed, balance, dp)
