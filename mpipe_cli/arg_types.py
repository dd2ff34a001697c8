"""argparse types that refuse out-of-range numbers at the command line, so a bad
`--steps`, `--max-ops` or `--lease` is a usage error (exit 2) before any work,
never a traceback from the database or a silently odd run; and `--db`, which
every command that opens the database takes."""
from __future__ import annotations

import argparse
import math
import re
from typing import Callable

# Integers stored in the database are 64-bit on PostgreSQL; counts a user asks
# for stay far below that.
INT64_MAX = 2**63 - 1


def int_in(lo: int, hi: int = INT64_MAX) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}, got {text[:40]}")
        return value
    parse.__name__ = "integer"
    return parse


def number_in(lo: float, hi: float = math.inf, *, lo_open: bool = False) -> Callable[[str], float]:
    """A finite number in [lo, hi] (or (lo, hi] with `lo_open`); NaN and infinity are refused."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
            bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}"
                                             + (f" and <= {hi:g}" if math.isfinite(hi) else "")
                                             + f", got {text[:40]}")
        return value
    parse.__name__ = "number"
    return parse


positive_int = int_in(1)


def add_db_argument(p: argparse.ArgumentParser) -> None:
    """`--db URL`, the same on every command that opens the database."""
    p.add_argument("--db", metavar="URL", default=None,
                   help="database URL or SQLite file (default: $MPIPE_DB_URL, else ~/.local/share/mpipe/mpipe.db)")


WORD_KEYS = ("encoder_shard",)  # parallel keys whose value is a word (none, optimizer, gradients)


def parallel_spec(text: str) -> dict:
    """`--parallel tp=8,sp,dp=4`: the analytic workload's `parallel` section as
    KEY=VALUE pairs (a bare KEY is true; values are integers or true/false;
    encoder_shard takes a word: none, optimizer, gradients).
    The keys and values are checked with the workload."""
    out: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not key.isidentifier() or key in out:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE pairs like tp=8,sp, got {text[:60]!r}")
        value = value.strip().lower()
        if not sep or value == "true":
            out[key] = True
        elif value == "false":
            out[key] = False
        elif re.fullmatch(r"-?[0-9]+", value):  # ASCII digits only: str.isdigit() takes "٣" as 3
            out[key] = int(value)
        elif key in WORD_KEYS and re.fullmatch(r"[a-z_]+", value):  # a choice, checked with the workload
            out[key] = value
        else:
            raise argparse.ArgumentTypeError(f"{key}: expected an integer, true or false, got {value[:40]!r}")
    return out


def memory_cap(text: str) -> float | str:
    """`--memory-cap X`: a finite number > 0, or `none` for no cap."""
    if text.strip().lower() == "none":
        return "none"
    return number_in(0.0, lo_open=True)(text)
