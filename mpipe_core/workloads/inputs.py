"""Reading what users hand us (files, JSON, free text) within fixed bounds, so a
huge, endless or deeply nested input is refused with one clear line instead of
eating memory or the stack.

`-w /dev/zero` never ends: files are read in chunks and refused as soon as they
pass their limit, whatever `stat` says about their size.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from mpipe_core.errors import MpipeError

MIB = 1024 * 1024
# Big enough for any real workload (per-microbatch lists of 100k entries are ~2 MB),
# a torch CSV of 1.5M actions (~12 MB) and a large library export.
WORKLOAD_FILE_LIMIT = 16 * MIB
CSV_FILE_LIMIT = 32 * MIB
LIBRARY_FILE_LIMIT = 64 * MIB
# Deeper nesting than any real term or document has; far below Python's recursion limit.
MAX_NESTING = 64


def read_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of `path`, or MpipeError if it cannot be read or holds more than `limit`."""
    path = Path(path)
    try:
        with open(path, "rb") as stream:
            data = stream.read(limit + 1)
    except FileNotFoundError:
        raise MpipeError(f"{path}: no such file") from None
    except OSError as error:
        raise MpipeError(f"{path}: cannot read ({error.strerror or error})") from None
    if len(data) > limit:
        raise MpipeError(f"{path}: {what} is larger than the limit of {limit // MIB} MB")
    return data


def decode_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MpipeError(f"{where}: not UTF-8 text (byte {error.start})") from None


def check_nesting(text: str, where: str, limit: int = MAX_NESTING) -> None:
    """Refuse text whose brackets nest deeper than `limit` (terms: no strings in them)."""
    depth = deepest = offset = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
            if depth > deepest:
                deepest, offset = depth, i
        elif ch in ")]}":
            depth -= 1
    if deepest > limit:
        raise MpipeError(f"{where}: nested {deepest} levels deep at character {offset + 1}; "
                         f"the limit is {limit}")


def _document_depth(doc: Any) -> int:
    """How many levels of objects and arrays nest in `doc`, level by level (iterative: the
    document may be deeper than the stack allows; only containers are kept, so the scalars
    that make up most of a profiler trace are looked at once and dropped)."""
    depth, level = 0, [doc] if isinstance(doc, (dict, list)) else []
    while level:
        depth += 1
        inner = []
        for container in level:
            for value in container.values() if isinstance(container, dict) else container:
                if isinstance(value, (dict, list)):
                    inner.append(value)
        level = inner
    return depth


def load_document(text: str | bytes, where: str, parse: Callable[[str], Any] = json.loads,
                  kind: str = "json", hint: str = "") -> Any:
    """A JSON (or, with `parse`, TOML) document from text or bytes: not-valid,
    non-UTF-8 and too deeply nested input are MpipeError saying where (a
    syntax error with `hint` after the parser's words, in parentheses)."""
    if isinstance(text, bytes):
        text = decode_utf8(text, where)
    try:
        doc = parse(text)
    except RecursionError:
        pass  # past Python's own limit: refused below
    except ValueError as error:
        line = getattr(error, "lineno", None)
        at = f":{line}:{error.colno}" if line else ""
        why = getattr(error, "msg", error)
        raise MpipeError(f"{where}{at}: not valid {kind} ({why}; {hint})" if hint else
                         f"{where}{at}: not valid {kind}: {why}") from None
    else:
        check_depth(doc, where)
        return doc
    raise MpipeError(f"{where}: nested more levels deep than Python's parser allows; the limit is {MAX_NESTING}")


def load_toml(text: str) -> Any:
    """TOML text as a document; a syntax error is ValueError (what `load_document` reports).
    tomllib is imported here: most commands read no TOML, and it (with datetime)
    is a measurable share of `mpipe eval`'s start-up."""
    try:  # Python 3.11+
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(str(error)) from None


def check_depth(doc: Any, where: str) -> None:
    """Refuse a parsed document nested deeper than MAX_NESTING."""
    depth = _document_depth(doc)
    if depth > MAX_NESTING:
        raise MpipeError(f"{where}: nested {depth} levels deep; the limit is {MAX_NESTING}")


def finite_json(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None (strict JSON has neither:
    PostgreSQL's json type and browsers refuse them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def check_text(value: str, what: str, max_length: int, *, single_line: bool = False) -> str:
    """Free text a user gives us: no NUL (databases refuse it), at most `max_length`
    characters, and with `single_line` no line breaks."""
    if "\x00" in value:
        raise MpipeError(f"{what}: contains a NUL character")
    if len(value) > max_length:
        raise MpipeError(f"{what}: {len(value)} characters; the limit is {max_length}")
    if single_line and ("\n" in value or "\r" in value):
        raise MpipeError(f"{what}: must be one line")
    return value
