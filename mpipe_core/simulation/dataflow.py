"""The workload's dataflow: which op each op waits for, what it costs, what it moves.

Dependencies never come from the term; they follow from op identities:

* LLM: ``F(c,m) -> F(c+1,m)``; last ``F -> B``; ``B(c+1,m) -> B(c,m)``;
  ``B(c,m) -> W(c,m)`` (B here is ``B`` or fused ``BW``).
* Encoder ``E`` (shard k of microbatch m): ``E.F(k,m) -> llm F(0,m)``;
  ``llm B(0,m) -> E.B(k,m) -> E.W(k,m)``; a recompute ``E.R(k,m)`` (on the
  LLM's first device) needs ``E.F(k,m)``'s shipped input and precedes ``E.B``;
  ``E.BCAST(d)`` (parameter broadcast) precedes every ``E.F`` on device d;
  ``E.AR(d)`` (gradient all-reduce) needs every ``E.W``.
* Encoder groups (`encoder_batch` k): one encoder op serves microbatches
  g..g+k-1 and carries microbatch g; ``llm F(0,m)`` needs the F of m's group,
  and the group's ``E.B`` needs ``llm B(0,m)`` of every microbatch in it.
* Phase barriers (`colocated`): ``E.GATHER`` on the device of LLM chunk 0
  needs every ``E.F`` of the step (their features shipped there); on any other
  device it needs that one.  ``E.SCATTER`` on chunk 0's device needs chunk 0's
  backward of every microbatch; elsewhere it needs that one.  What follows a
  barrier in a device's order waits for it by the order itself.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from operator import itemgetter

from mpipe_core.errors import ScheduleError
from mpipe_core.ir.ops import (
    ALLREDUCE,
    BCAST,
    BW,
    COLLECTIVE_KINDS,
    GATHER,
    LLM,
    NO_MICROBATCH,
    SCATTER,
    B,
    F,
    Op,
    R,
    W,
    base_module,
    format_op,
    replica_of,
    with_replica,
)
from mpipe_core.ir.schedule import Schedule
from mpipe_core.workloads.workload import Workload

# Edge kinds (what crosses the link when producer and consumer sit on different devices).
EDGE_LOCAL, EDGE_BOUNDARY, EDGE_FEATURES, EDGE_INPUT = 0, 1, 2, 3


@dataclass
class ScheduleFacts:
    """Per-schedule facts the dependency rules need, computed once."""

    chunks: dict[str, int]  # LLM module -> chunk count
    microbatches: dict[str, int]  # LLM module -> microbatches per step
    shards: dict[tuple[str, int, int], int]  # (encoder module, mb, step) -> shard count
    encoders_of: dict[int, list[str]]  # replica -> encoder modules present
    has_bcast: set[tuple[str, int]]  # (encoder module, device) with a broadcast op
    weight_ops: dict[str, list[Op]]  # encoder module -> its weight-gradient ops
    # LLM module -> microbatches per encoder group (`encoder_batch`; 1 for most schedules).
    encoder_batch: dict[str, int] = field(default_factory=dict)
    # (encoder module, step) -> its forward ops, for schedules with a GATHER barrier.
    forward_ops: dict[tuple[str, int], list[Op]] = field(default_factory=dict)
    # (encoder module, step) -> how many devices take part in its all-reduce.
    ring: dict[tuple[str, int], int] = field(default_factory=dict)


def collect_facts(schedule: Schedule) -> ScheduleFacts:
    chunks = {p.module: p.chunks for p in schedule.pipelines}
    mbs = {p.module: p.microbatches for p in schedule.pipelines}
    shards: dict[tuple[str, int, int], int] = {}
    encoders_of: dict[int, list[str]] = {}
    has_bcast: set[tuple[str, int]] = set()
    weight_ops: dict[str, list[Op]] = {}
    forwards: dict[tuple[str, int], list[Op]] = {}
    ring: dict[tuple[str, int], int] = {}
    gathered: set[tuple[str, int]] = set()
    for device, order in enumerate(schedule.orders):
        for op in order:
            module = op[0]
            if module in chunks:
                continue
            kind = op[1]
            if kind == F:
                key = (module, op[3], op[4])
                if op[2] + 1 > shards.get(key, 0):
                    shards[key] = op[2] + 1
                rep = replica_of(module)
                lst = encoders_of.setdefault(rep, [])
                if module not in lst:
                    lst.append(module)
                forwards.setdefault((module, op[4]), []).append(op)
            elif kind == BCAST:
                has_bcast.add((module, device))
            elif kind in (W, BW):
                weight_ops.setdefault(module, []).append(op)
            elif kind == ALLREDUCE:
                ring[(module, op[4])] = ring.get((module, op[4]), 0) + 1
            elif kind == GATHER:
                gathered.add((module, op[4]))
    batch = {p.module: p.encoder_batch for p in schedule.pipelines if p.encoder_batch != 1}
    forward_ops = {key: ops for key, ops in forwards.items() if key in gathered}
    return ScheduleFacts(chunks, mbs, shards, encoders_of, has_bcast, weight_ops, batch, forward_ops, ring)


def backward_of(index: dict, module: str, chunk: int, mb: int, step: int):
    """The op producing the input gradient of (module, chunk, mb): B, else fused BW."""
    key = (module, B, chunk, mb, step)
    if key in index:
        return key
    return (module, BW, chunk, mb, step)


def predecessors(op: tuple, device: int, facts: ScheduleFacts, index: dict) -> list[tuple[tuple, int]]:
    """(producer op, edge kind) pairs op must wait for.  Producers may be missing
    from `index` (an incomplete schedule); the caller reports that."""
    module, kind, chunk, mb, step = op
    chunks = facts.chunks.get(module)
    if chunks is not None:  # an LLM op
        if kind == F:
            if chunk > 0:
                return [((module, F, chunk - 1, mb, step), EDGE_BOUNDARY)]
            deps = []
            group = mb - mb % facts.encoder_batch.get(module, 1)
            for enc in facts.encoders_of.get(replica_of(module), ()):
                for k in range(facts.shards.get((enc, group, step), 0)):
                    deps.append(((enc, F, k, group, step), EDGE_FEATURES))
            return deps
        if kind == B or kind == BW:
            if chunk == chunks - 1:
                return [((module, F, chunk, mb, step), EDGE_LOCAL)]
            return [(backward_of(index, module, chunk + 1, mb, step), EDGE_BOUNDARY)]
        if kind == W:
            return [((module, B, chunk, mb, step), EDGE_LOCAL)]
        raise ScheduleError(f"op {format_op(Op(*op))}: kind {kind} is not an LLM op kind")
    # An encoder op: "vision@1" feeds "llm@1" (`with_replica(LLM, replica_of(module))`, spelled out: hot).
    at = module.find("@")
    llm = LLM if at < 0 else LLM + module[at:]
    if kind == F:
        if (module, device) in facts.has_bcast:
            return [((module, BCAST, device, NO_MICROBATCH, step), EDGE_LOCAL)]
        return []
    if kind == R:
        return [((module, F, chunk, mb, step), EDGE_INPUT)]
    if kind == B or kind == BW:
        k = facts.encoder_batch.get(llm, 1)
        if k == 1:
            deps = [(backward_of(index, llm, 0, mb, step), EDGE_FEATURES)]
        else:  # the group's gradient: every microbatch's in it
            last = min(mb + k, facts.microbatches[llm])
            deps = [(backward_of(index, llm, 0, m, step), EDGE_FEATURES) for m in range(mb, last)]
        recompute = (module, R, chunk, mb, step)
        if recompute in index:
            deps.append((recompute, EDGE_LOCAL))
        return deps
    if kind == W:
        return [((module, B, chunk, mb, step), EDGE_LOCAL)]
    if kind == BCAST:
        return []
    if kind == ALLREDUCE:
        return [(tuple(w), EDGE_LOCAL) for w in facts.weight_ops.get(module, ()) if w[4] == step]
    if kind == GATHER or kind == SCATTER:
        root = index.get((llm, F, 0, 0, step))
        if device != root:  # the barrier opens here when it has closed on the first stage's device
            return [((module, kind, root, NO_MICROBATCH, step), EDGE_LOCAL)]
        if kind == GATHER:  # every share's features have arrived
            return [(tuple(f), EDGE_FEATURES) for f in facts.forward_ops.get((module, step), ())]
        return [(backward_of(index, llm, 0, m, step), EDGE_LOCAL) for m in range(facts.microbatches[llm])]
    raise ScheduleError(f"op {format_op(Op(*op))}: unknown kind {kind}")


def check_complete(schedule: Schedule, workload: Workload, index: dict) -> None:
    """Every op the workload needs appears once; no op the workload doesn't have.

    A fast set-based pass accepts complete schedules; anything it cannot accept
    goes through the op-by-op pass below, which names what is wrong."""
    if len(index) == schedule.num_ops and _complete_fast(schedule, workload, index):
        return
    _check_complete_slowly(schedule, workload, index)


def _complete_fast(schedule: Schedule, workload: Workload, index: dict) -> bool:
    """True if a single pipeline is complete: its LLM ops checked with C-speed
    counting (ops are unique (dict keys), all in range, F and backward counts
    match the pipeline, and split B/W cover the same (chunk, mb, step) keys),
    its encoder ops (a few per microbatch) by the op-by-op pass."""
    if len(schedule.pipelines) != 1:
        return False  # the slow pass handles these
    pipe = schedule.pipelines[0]
    if not workload.encoders and not schedule.encoders:
        return _llm_complete(pipe, index)
    if not schedule.encoders:
        return False
    module = pipe.module
    llm = [op for op in index if op[0] == module]
    if not _llm_complete(pipe, llm):
        return False
    try:
        _check_ops(schedule, workload, [op for op in index if op[0] != module], llm_too=False)
    except ScheduleError:
        return False  # the slow pass says it in its order
    return True


def _llm_complete(pipe, ops) -> bool:
    module = pipe.module
    counts = Counter(map(_MODULE_KIND, ops))
    if not set(counts) <= {(module, F), (module, B), (module, W), (module, BW)}:
        return False
    n = pipe.chunks * pipe.microbatches * pipe.steps
    f, b, w, bw = (counts.get((module, k), 0) for k in (F, B, W, BW))
    if f != n or b != w or b + bw != n:
        return False
    for getter, size in ((_CHUNK, pipe.chunks), (_MB, pipe.microbatches), (_STEP, pipe.steps)):
        if min(map(getter, ops)) < 0 or max(map(getter, ops)) >= size:
            return False
    if b:
        b_keys = {op[2:] for op in ops if op[1] == B}
        if b_keys != {op[2:] for op in ops if op[1] == W}:
            return False
        if bw and not b_keys.isdisjoint({op[2:] for op in ops if op[1] == BW}):
            return False
    return True


_MODULE_KIND = itemgetter(0, 1)
_CHUNK, _MB, _STEP = itemgetter(2), itemgetter(3), itemgetter(4)


def _check_complete_slowly(schedule: Schedule, workload: Workload, index: dict) -> None:
    if len(index) != schedule.num_ops:
        seen: set = set()
        for d, order in enumerate(schedule.orders):
            for op in order:
                if op in seen:
                    where = [dd for dd, o in enumerate(schedule.orders) if op in o]
                    raise ScheduleError(
                        f"op {format_op(op)} appears more than once (devices {where})"
                    )
                seen.add(op)
    _check_ops(schedule, workload, index, llm_too=True)


def _check_ops(schedule: Schedule, workload: Workload, index, llm_too: bool) -> None:
    counts: dict[tuple, int] = {}
    pipelines = {p.module: p for p in schedule.pipelines}
    trainable = {e.name: e.trainable for e in workload.encoders}
    for op in index:
        module, kind, chunk, mb, step = op
        pipe = pipelines.get(module)
        if pipe is not None:
            if not (0 <= chunk < pipe.chunks and 0 <= mb < pipe.microbatches and 0 <= step < pipe.steps):
                raise ScheduleError(
                    f"op {format_op(Op(*op))} is outside the pipeline "
                    f"({pipe.chunks} chunks, {pipe.microbatches} microbatches, {pipe.steps} steps)"
                )
            key = (module, chunk, mb, step)
        else:
            name = base_module(module)
            if name not in trainable:
                raise ScheduleError(f"op {format_op(Op(*op))}: the workload has no module '{name}'")
            if kind in COLLECTIVE_KINDS:
                continue
            pipe = pipelines.get(with_replica(LLM, replica_of(module)))
            if pipe is not None and pipe.encoder_batch != 1 and mb != pipe.group_of(mb):
                raise ScheduleError(
                    f"op {format_op(Op(*op))}: encoder ops serve groups of {pipe.encoder_batch} microbatches "
                    f"and carry the group's first microbatch ({pipe.group_of(mb)}, not {mb})"
                )
            if kind in (B, W, BW, R) and not trainable[name]:
                raise ScheduleError(
                    f"op {format_op(Op(*op))}: encoder '{name}' is frozen and has no backward"
                )
            key = (module, chunk, mb, step)
        counts[key] = counts.get(key, 0) | _KIND_BITS.get(kind, 0)
    # Every LLM (chunk, mb, step) needs F and a full backward.
    for pipe in schedule.pipelines if llm_too else ():
        for step in range(pipe.steps):
            for mb in range(pipe.microbatches):
                for chunk in range(pipe.chunks):
                    bits = counts.get((pipe.module, chunk, mb, step), 0)
                    if bits not in _COMPLETE:
                        raise ScheduleError(
                            f"chunk {chunk} microbatch {mb}"
                            + (f" step {step}" if step else "")
                            + f" of {pipe.module}: {_missing(bits, True)}"
                        )
    # Every encoder of the workload runs for every microbatch of every LLM copy
    # (inside the chunks when `balanced` folded it into the chain).
    for pipe in schedule.pipelines:
        for enc in workload.encoders if pipe.encoder_layers is None else ():
            module = with_replica(enc.name, pipe.replica)
            for step in range(pipe.steps):
                for mb, _ in pipe.groups():
                    bits = counts.get((module, 0, mb, step), 0)
                    if not bits & _BIT_F:
                        raise ScheduleError(
                            f"encoder '{enc.name}' has no forward for microbatch {mb}"
                            + (f" step {step}" if step else "")
                        )
    for key, bits in counts.items():
        module = key[0]
        if module in pipelines:
            continue
        if trainable[base_module(module)] and bits & ~_BIT_R not in _COMPLETE:
            raise ScheduleError(f"encoder op group {key}: {_missing(bits & ~_BIT_R, True)}")
        if not trainable[base_module(module)] and bits != _BIT_F:
            raise ScheduleError(f"encoder op group {key}: {_missing(bits, False)}")


_BIT_F, _BIT_B, _BIT_W, _BIT_BW, _BIT_R = 1, 2, 4, 8, 16
_KIND_BITS = {F: _BIT_F, B: _BIT_B, W: _BIT_W, BW: _BIT_BW, R: _BIT_R}
_COMPLETE = {_BIT_F | _BIT_BW, _BIT_F | _BIT_B | _BIT_W}


def _missing(bits: int, needs_backward: bool) -> str:
    parts = []
    if not bits & _BIT_F:
        parts.append("no F")
    if needs_backward:
        if bits & _BIT_BW and bits & (_BIT_B | _BIT_W):
            parts.append("both a fused BW and split B/W")
        elif not bits & _BIT_BW:
            if not bits & _BIT_B:
                parts.append("no B (or BW)")
            if not bits & _BIT_W:
                parts.append("no W (or BW)")
    return ", ".join(parts) or "inconsistent ops"
