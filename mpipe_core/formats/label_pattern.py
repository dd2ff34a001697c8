"""Ranges a user names in their own training loop, read as Mpipe ops.

Besides torch's `PP:` actions, a trace may hold ranges that other stacks or a
user's own script record (`torch.profiler.record_function`, NVTX ranges).
Mpipe's own convention is always understood:

    mpipe:<module>:<kind>:<microbatch>[:<chunk>]      e.g. mpipe:vision:F:3

`module` is `llm` or an encoder's name (as the workload calls it), `kind` one
of F, B (input gradient), W (weight gradient), BW (whole backward), R
(recompute); `chunk` is the LLM chunk, or the encoder shard (default 0).  So
wrapping the vision tower's forward of microbatch 3 in
`record_function("mpipe:vision:F:3")` makes it an encoder op of the run.

`--label-pattern REGEX` reads any other naming: a regular expression with
named groups `kind` (required), `microbatch` (required), and optionally
`chunk` and `module` (default `llm`).  It must match the whole range name.
`kind` may also be written forward / fwd (F) or backward / bwd (BW).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from mpipe_core.errors import MpipeError
from mpipe_core.ir.ops import BW, LLM, B, F, R, W

CONVENTION = r"mpipe:(?P<module>[A-Za-z_][A-Za-z0-9_.-]*):(?P<kind>[A-Za-z]+):(?P<microbatch>\d+)(?::(?P<chunk>\d+))?"
KINDS = {"f": F, "b": B, "w": W, "bw": BW, "r": R, "forward": F, "fwd": F, "backward": BW, "bwd": BW}
MAX_PATTERN = 1000


class Label(NamedTuple):
    module: str
    kind: str
    chunk: int
    microbatch: int


class LabelPattern:
    """A compiled pattern; `match(name)` gives the op a range name stands for,
    None if it does not match, or MpipeError for a match with an unknown kind."""

    def __init__(self, pattern: str, source: str = "--label-pattern"):
        if len(pattern) > MAX_PATTERN:
            raise MpipeError(f"{source}: {len(pattern)} characters; the limit is {MAX_PATTERN}")
        try:
            self.regex = re.compile(pattern)
        except re.error as error:
            raise MpipeError(f"{source}: not a regular expression ({error})") from None
        groups = set(self.regex.groupindex)
        for needed in ("kind", "microbatch"):
            if needed not in groups:
                raise MpipeError(f"{source}: the pattern has no named group '{needed}' "
                                 f"(write (?P<{needed}>...); groups: kind, microbatch, optional chunk, module)")
        self.pattern = pattern

    def match(self, name: str) -> Label | None:
        m = self.regex.fullmatch(name)
        if m is None:
            return None
        kind = KINDS.get((m.group("kind") or "").lower())
        if kind is None:
            raise MpipeError(f"kind '{(m.group('kind') or '')[:20]}' is not one of F, B, W, BW, R "
                             f"(or forward, backward)")
        groups = m.groupdict()
        try:
            mb = int(groups["microbatch"])
            chunk = int(groups.get("chunk") or 0)
        except (TypeError, ValueError):
            raise MpipeError("the microbatch and chunk groups must match whole numbers") from None
        module = groups.get("module") or LLM
        return Label(module, kind, chunk, mb)


def convention() -> LabelPattern:
    return LabelPattern(CONVENTION, "the mpipe: label convention")
