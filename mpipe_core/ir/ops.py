"""Operations: the atoms a schedule orders.

An op is `(module, kind, chunk, microbatch, step)`.  `module` is `"llm"` or an
encoder name; a replica suffix (`"llm@1"`) marks the second copy of a model
that `par`/`overlay` place beside the first.  `chunk` is the LLM chunk (stage
index, as in torch's pipelining), or for encoder ops the shard index, or for a
collective the participating device.  `step` is the training iteration (`repeat`,
`seq`); steps are separated by the optimizer update.
"""
from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple

LLM = "llm"

# Compute kinds.  B is the input gradient only, W the weight gradient, BW both.
F, B, W, BW = "F", "B", "W", "BW"
# Encoder recompute forward (transpose backward=recompute), parameter broadcast
# and gradient all-reduce of a replicated encoder (transpose, colocated,
# disaggregate).
R, BCAST, ALLREDUCE = "R", "BCAST", "AR"
# `colocated`'s phase barriers, one per device and encoder: GATHER closes the
# encoder forward phase (every share's features gathered to the first stage's
# device), SCATTER opens the encoder backward phase (their gradients sent back).
GATHER, SCATTER = "GATHER", "SCATTER"
# Ops that are no microbatch's work: collectives and barriers, `chunk` = device.
COLLECTIVE_KINDS = (BCAST, ALLREDUCE, GATHER, SCATTER)

COMPUTE_KINDS = (F, B, W, BW)
_FIELDS = tuple(itemgetter(i) for i in range(5))
NO_MICROBATCH = -1


class Op(NamedTuple):
    module: str
    kind: str
    chunk: int
    mb: int
    step: int = 0

    def __str__(self) -> str:
        return format_op(self)


def unzip(ops) -> tuple[tuple, ...]:
    """(modules, kinds, chunks, microbatches, steps) of a sequence of ops, as
    tuples (a column at a time: `zip(*ops)` spends twice as long on 10^5 ops)."""
    return tuple(tuple(map(_FIELDS[i], ops)) for i in range(5))


def base_module(module: str) -> str:
    """`"llm@1"` -> `"llm"`: the model a replica copies (costs live there)."""
    at = module.find("@")
    return module if at < 0 else module[:at]


def replica_of(module: str) -> int:
    at = module.find("@")
    return 0 if at < 0 else int(module[at + 1:])


def with_replica(module: str, replica: int) -> str:
    base = base_module(module)
    return base if replica == 0 else f"{base}@{replica}"


def is_llm(op: Op) -> bool:
    return base_module(op.module) == LLM


def format_op(op: Op) -> str:
    """Compact text like torch's `2F0`: `llm:2F0`, `vision:0BW3`, `llm:1W5#2` (step 2)."""
    mb = "" if op.mb == NO_MICROBATCH else str(op.mb)
    text = f"{op.module}:{op.chunk}{op.kind}{mb}"
    return text if op.step == 0 else f"{text}#{op.step}"
