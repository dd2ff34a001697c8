"""A parametric mix of samples, drawn with a seed (docs/data.md).

``{"images": COUNT, "tiles": COUNT, "text_tokens": COUNT,
"video": {"share": s, "frames": COUNT}}``: per sample, with probability
`share` a video of `frames` frames (no images), else `images` images of
`tiles` tiles each, and `text_tokens` text tokens either way.  A COUNT is a
whole number, ``{"uniform": [lo, hi]}`` (inclusive), ``{"weights": [w0, w1,
...], "from": k}`` (value k + i with weight w_i; `from` is 0 by default) or
``{"lognormal": [mu, sigma], "min": lo, "max": hi}`` (rounded, clipped: a
heavy tail).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterator

from mpipe_core.errors import WorkloadError
from mpipe_core.data.samples import (MAX_FRAMES, MAX_IMAGES, MAX_TEXT_TOKENS, MAX_TILES_PER_IMAGE, Sample,
                                     refuse_unknown_keys)

MIX_KEYS = ("images", "tiles", "text_tokens", "video")
COUNT_SHAPES = ('a whole number, {"uniform": [lo, hi]}, {"weights": [w0, w1, ...], "from": k} or '
                '{"lognormal": [mu, sigma], "min": lo, "max": hi}')


@dataclass(frozen=True)
class Count:
    """A distribution over whole numbers in [lo, hi]."""

    kind: str  # "constant", "uniform", "weights", "lognormal"
    lo: int
    hi: int
    weights: tuple[float, ...] = ()
    mu: float = 0.0
    sigma: float = 0.0

    def draw(self, rng: random.Random) -> int:
        if self.kind == "constant":
            return self.lo
        if self.kind == "uniform":
            return rng.randint(self.lo, self.hi)
        if self.kind == "weights":
            return self.lo + rng.choices(range(len(self.weights)), weights=self.weights)[0]
        return min(self.hi, max(self.lo, round(rng.lognormvariate(self.mu, self.sigma))))


def _whole(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise WorkloadError(f"{where}: expected a whole number from {lo} to {hi}, got {value!r}")
    return value


def _real(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def parse_count(doc: Any, where: str, lo: int, hi: int) -> Count:
    if isinstance(doc, int) and not isinstance(doc, bool):
        v = _whole(doc, where, lo, hi)
        return Count("constant", v, v)
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: expected {COUNT_SHAPES}")
    if "uniform" in doc:
        pair = doc["uniform"]
        if set(doc) != {"uniform"} or not isinstance(pair, list) or len(pair) != 2:
            raise WorkloadError(f'{where}: expected {{"uniform": [lo, hi]}}')
        a, b = (_whole(x, f"{where}.uniform[{i}]", lo, hi) for i, x in enumerate(pair))
        if a > b:
            raise WorkloadError(f"{where}.uniform: need lo <= hi, got {pair!r}")
        return Count("uniform", a, b)
    if "weights" in doc:
        if not set(doc) <= {"weights", "from"}:
            raise WorkloadError(f'{where}: expected {{"weights": [w0, w1, ...], "from": k}}')
        weights = doc["weights"]
        if not isinstance(weights, list) or not weights:
            raise WorkloadError(f"{where}.weights: expected a non-empty list of numbers")
        ws = tuple(_real(w, f"{where}.weights[{i}]") for i, w in enumerate(weights))
        if min(ws) < 0 or sum(ws) <= 0:
            raise WorkloadError(f"{where}.weights: need weights >= 0 with a positive sum")
        start = _whole(doc.get("from", 0), f"{where}.from", lo, hi)
        top = start + len(ws) - 1
        if top > hi:
            raise WorkloadError(f"{where}.weights: values reach {top}, over the limit of {hi}")
        # the largest value that can be drawn (a zero weight at the end cannot)
        last = max(i for i, w in enumerate(ws) if w > 0)
        return Count("weights", start, start + last, ws[:last + 1])
    if "lognormal" in doc:
        if not set(doc) <= {"lognormal", "min", "max"} or "max" not in doc:
            raise WorkloadError(f'{where}: expected {{"lognormal": [mu, sigma], "min": lo, "max": hi}}')
        pair = doc["lognormal"]
        if not isinstance(pair, list) or len(pair) != 2:
            raise WorkloadError(f"{where}.lognormal: expected [mu, sigma]")
        mu, sigma = (_real(x, f"{where}.lognormal[{i}]") for i, x in enumerate(pair))
        if sigma < 0:
            raise WorkloadError(f"{where}.lognormal: sigma must be >= 0, got {sigma:g}")
        a = _whole(doc.get("min", lo), f"{where}.min", lo, hi)
        b = _whole(doc["max"], f"{where}.max", lo, hi)
        if a > b:
            raise WorkloadError(f"{where}: need min <= max, got {a} and {b}")
        return Count("lognormal", a, b, mu=mu, sigma=sigma)
    raise WorkloadError(f"{where}: expected {COUNT_SHAPES}")


@dataclass(frozen=True)
class Mix:
    images: Count
    tiles: Count
    text_tokens: Count
    video_share: float = 0.0
    frames: Count | None = None

    def samples(self, seed: int) -> Iterator[Sample]:
        """The endless sample stream this mix draws with `seed`."""
        rng = random.Random(seed)
        index = 0
        while True:
            if self.frames is not None and rng.random() < self.video_share:
                tiles: tuple[int, ...] = ()
                frames = self.frames.draw(rng)
            else:
                tiles = tuple(self.tiles.draw(rng) for _ in range(self.images.draw(rng)))
                frames = 0
            text = self.text_tokens.draw(rng)
            if not tiles and not frames and not text:
                text = 1  # never an empty sample
            yield Sample(tiles, text, frames, f"mix draw {index}")
            index += 1


def parse_mix(doc: Any, where: str = "data.samples") -> Mix:
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: expected a .jsonl file name or a mix object")
    refuse_unknown_keys(doc, MIX_KEYS, where)
    for key in ("images", "tiles", "text_tokens"):
        if key not in doc:
            raise WorkloadError(f"{where}: missing '{key}'")
    images = parse_count(doc["images"], f"{where}.images", 0, MAX_IMAGES)
    tiles = parse_count(doc["tiles"], f"{where}.tiles", 1, MAX_TILES_PER_IMAGE)
    text = parse_count(doc["text_tokens"], f"{where}.text_tokens", 0, MAX_TEXT_TOKENS)
    video = doc.get("video")
    share, frames = 0.0, None
    if video is not None:
        if not isinstance(video, dict) or set(video) != {"share", "frames"}:
            raise WorkloadError(f'{where}.video: expected {{"share": fraction, "frames": COUNT}}')
        share = _real(video["share"], f"{where}.video.share")
        if not 0 <= share <= 1:
            raise WorkloadError(f"{where}.video.share: expected a fraction from 0 to 1, got {share:g}")
        frames = parse_count(video["frames"], f"{where}.video.frames", 1, MAX_FRAMES)
    return Mix(images, tiles, text, share, frames)
