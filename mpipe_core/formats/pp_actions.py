"""torch.distributed.pipelining's action names, as its runtime records them.

`_PipelineScheduleRuntime` wraps every action in `record_function("PP:<action>")`
(`_get_profiler_function_name`); the action grammar is `_Action.from_str`:
`{stage}{type}{microbatch}` with type one of F, I, W, B (compute), SEND_F,
RECV_F, SEND_B, RECV_B (transfers), UNSHARD, RESHARD, REDUCE_GRAD (no
microbatch), and `(a;b;...)OVERLAP_F_B`, several compute actions run as one.

In Mpipe's terms a stage is an LLM chunk, torch's F/I/W/B are our F/B/W/BW
(`torch_csv.FROM_TORCH`), sends and receives are transfers, and the FSDP
actions are neither (counted, not timed).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from mpipe_core.formats.torch_csv import FROM_TORCH

PP_PREFIX = "PP:"
COMPUTE, TRANSFER, OTHER = "compute", "transfer", "other"
TRANSFER_TYPES = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
OTHER_TYPES = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
_SINGLE = re.compile(r"(\d+)(" + "|".join(map(re.escape, (*FROM_TORCH, *OTHER_TYPES, *TRANSFER_TYPES))) + r")(\d*)\Z")


class Action(NamedTuple):
    """One torch action: `role` is compute, transfer or other; `kind` is the
    Mpipe kind of a compute action (F, B, W, BW) or torch's own type name."""

    role: str
    kind: str
    stage: int
    microbatch: int  # -1: none (UNSHARD, ...)


def parse_action(text: str) -> list[Action] | None:
    """The actions a `PP:` range name stands for (several for OVERLAP_F_B), or
    None when `text` is not a pipelining action at all."""
    if not text.startswith(PP_PREFIX):
        return None
    body = text[len(PP_PREFIX):].strip()
    if body.startswith("(") and body.endswith(")OVERLAP_F_B"):
        parts = [p.strip() for p in body[1:-len(")OVERLAP_F_B")].split(";") if p.strip()]
        actions = [_single(p) for p in parts]
        if not parts or any(a is None or a.role != COMPUTE for a in actions):
            return None
        return actions  # type: ignore[return-value]
    action = _single(body)
    return None if action is None else [action]


def _single(text: str) -> Action | None:
    match = _SINGLE.match(text)
    if not match:
        return None
    stage, kind, mb = int(match[1]), match[2], match[3]
    if kind in FROM_TORCH:
        if not mb:
            return None
        return Action(COMPUTE, FROM_TORCH[kind], stage, int(mb))
    if kind in TRANSFER_TYPES:
        return Action(TRANSFER, kind, stage, int(mb)) if mb else None
    return Action(OTHER, kind, stage, int(mb) if mb else -1)
