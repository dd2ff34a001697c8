"""What the training stacks' own configs can say about a schedule: where each
LLM chunk runs and how many layers (LLM and folded encoder) it holds.  The
stack exporters (`torchtitan`, `megatron_layout`, `mindspeed`) share it, and
refuse, in one line naming the part and the format, what they cannot express."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.ir.ops import LLM
from mpipe_core.simulation.chunks import llm_layers, split_recompute

LOOP, V = "loop", "v"
# Combinators that put encoder work somewhere other than stage 0's device, or
# schedules no stack config states (several copies, several steps).
PLACERS = ("transpose", "encoder_stage", "disaggregate", "colocated", "encoder_batch")
SHAPERS = ("par", "overlay", "mirror", "repeat", "seq")


@dataclass
class Split:
    devices: int
    chunks: int
    placement: str  # LOOP (chunk c on device c mod P) or V (chunk c and 2P-1-c on device c)
    llm: list[int] | None  # LLM layers per chunk (None: the workload does not say)
    encoder: list[int] | None  # folded encoder layers per chunk (`balanced`), None: not folded
    fused_encoders: list[str]  # encoders whose ops run beside stage 0 (the generators' fused default)
    encoder_layers: dict[str, int]  # each encoder's layers (the workload's)
    generator: str
    recompute: tuple[str, int] | None = None  # `recompute_kind` of the LLM's layers
    encoder_recompute: bool = False  # folded encoder layers are recomputed
    encoder_batch: int = 1  # microbatches one encoder op serves (`encoder_batch`)


def calls_of(node: Any) -> list[str]:
    """Every call name in the term, outermost first."""
    out, stack = [], [node]
    while stack:
        n = stack.pop(0)
        name = getattr(n, "name", None)
        if name is None:
            continue
        out.append(name)
        stack.extend(v for v in getattr(n, "args", ()))
        stack.extend(v for _, v in getattr(n, "kwargs", ()))
    return out


def refuse(fmt: str, part: str, why: str) -> MpipeError:
    return MpipeError(f"--format {fmt} cannot express {part}: {why}")


def split_of(ev: Any, fmt: str) -> Split:
    schedule, wl = ev.schedule, ev.workload
    calls = calls_of(ev.ast)
    for name in calls:
        if name in SHAPERS:
            raise refuse(fmt, name, "a stack config holds one pipeline and one training step")
    if len(schedule.pipelines) != 1 or schedule.pipelines[0].steps != 1:
        raise refuse(fmt, "this term", "a stack config holds one pipeline and one training step")
    pipe = schedule.pipelines[0]
    p, chunks = schedule.devices, pipe.chunks
    where: dict[int, int] = {}
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op.module == LLM:
                where.setdefault(op.chunk, d)
    loop = all(where.get(c) == c % p for c in range(chunks))
    vee = chunks == 2 * p and all(where.get(c) == (c if c < p else 2 * p - 1 - c) for c in range(chunks))
    if not (loop or vee):
        part = next((n for n in calls if n in PLACERS), "this chunk placement")
        raise refuse(fmt, part, "the stacks place LLM chunk c on rank c mod P (looped) or in a V, "
                                "with the encoder inside the first stage")
    stage0 = where.get(0, 0)
    fused = []
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op.module == LLM:
                continue
            if d != stage0 or op.kind not in ("F", "B", "W", "BW") or op.chunk != 0:
                part = next((n for n in calls if n in PLACERS), f"the {op.module} encoder's placement")
                raise refuse(fmt, part, f"{op} runs on device {d}; the stacks run an encoder only inside "
                                        f"the first stage")
            if op.module not in fused:
                fused.append(op.module)
    layers = None
    if pipe.layers is not None or wl.llm.layers is not None:
        layers = llm_layers(pipe, wl)
    from mpipe_core.algebra.generators import GENERATORS

    generator = next((n for n in reversed(calls) if n in GENERATORS), "")
    encoder_part, llm_part = split_recompute(pipe)
    return Split(p, chunks, LOOP if loop else V, layers,
                 list(pipe.encoder_layers) if pipe.encoder_layers is not None else None, fused,
                 {e.name: e.layers for e in wl.encoders}, generator,
                 recompute_kind(llm_part, llm_layers(pipe, wl)), any(f or s for f, s in encoder_part),
                 pipe.encoder_batch)


def recompute_kind(counts: list[tuple[int, int]], held: list[int]) -> tuple[str, int] | None:
    """What the stacks can say of per-chunk (full, selective) recompute counts
    over chunks of `held` layers: None (nothing recomputed), ("full", 0) or
    ("selective", 0) (every layer), ("block", k) (every chunk's first k layers
    fully), or ("mixed", 0) (anything else)."""
    if all(f == 0 and s == 0 for f, s in counts):
        return None
    if all(s == 0 and f == n for (f, s), n in zip(counts, held)):
        return "full", 0
    if all(f == 0 and s == n for (f, s), n in zip(counts, held)):
        return "selective", 0
    fulls = {f for f, _ in counts}
    if len(fulls) == 1 and all(s == 0 for _, s in counts):
        return "block", fulls.pop()
    return "mixed", 0


def megatron_recompute(split: Split, fmt: str) -> list[str]:
    """The note giving the LLM's recompute as Megatron's options (none when
    nothing is recomputed); MpipeError where they cannot say it."""
    if split.recompute is None:
        return []
    kind, k = split.recompute
    if kind == "mixed":
        raise refuse(fmt, "recompute of different layers in different chunks",
                     "Megatron recomputes the same layers in every pipeline stage (--recompute-granularity "
                     "selective: all of them; full: the first --recompute-num-layers)")
    option = {"full": "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
              "selective": "--recompute-granularity selective",
              "block": f"--recompute-granularity full --recompute-method block --recompute-num-layers {k}"}[kind]
    return [f"recompute: pass {option}"]


def need_layers(split: Split, fmt: str) -> list[int]:
    if split.llm is None:
        raise refuse(fmt, "the layer split", "the workload does not say how many LLM layers there are "
                                              "(give one with llm.layers, or a partition(...) term)")
    return split.llm
