"""The communication of an analytic workload on a cluster, on its timeline.

The costs already hold it (`workloads/analytic.py` adds each layer's tensor-
and context-parallel collectives to its op's time, `p2p.py` a pipeline
exchange's, `step_figures` prices the gradient sync and the optimizer after
the pipeline); this module says where on the timeline each one sits, from
the very `Collective`s that priced it, so the Gantt, the Chrome trace and a
reader of the API see the same seconds and bytes the step time is made of.

Per op (`module, kind, chunk`): its chunk's n layers repeat the layer's
collectives of that kind n times (a B or BW also the forward's of its fully
recomputed layers), the first chunk adds the embedding's, the last the
head's; one `CommSlice` per (group, collective, buffer) with its count.
Inside the op's span:

* the receiving stage's all-gather of the hidden state over its tp ranks
  (Megatron's scatter/gather optimization; group `pp`, as it is part of the
  pipeline exchange) opens the op: the op cannot start without it;
* what adds to the op in full (tp without `tp_comm_overlap`, the embedding's
  and head's collectives, a blocking send with `p2p_overlap: false`) closes
  it, back to back, the send last (the layers interleave their collectives
  with their GEMMs; drawn as one block, their total is exact, their place
  within the op is not);
* what overlaps compute (cp's K/V ring beside the attention core; tp with
  `tp_comm_overlap`, and a backward's tp collectives behind their partner
  GEMMs, `layer_comm.tp_partners`) runs from the op's start for its full
  time; only what outlasts the compute it hides behind is in the op's time
  (`exposed`, shared among the overlapping slices of a group in proportion
  to their seconds).

A pipeline send that does not hold its sender (the default) starts when the
sending op ends and lasts what the dataflow charges the edge
(`Workload.boundary_transfer_between`): `exposed` 0, the receiver waits.
In a drawn batch the send and the all-gather move the microbatch's own
hidden state (`LLM.token_ratio`).

After each device's last op (`StepFigures.devices`): the exposed part of its
gradient sync (reduce-scatter, or all-reduce, then the distributed
optimizer's all-gather, a sharded encoder's, the tied embedding's all-reduce
between the first and last stage) and the optimizer step.  With one training step the
latest of these ends at `step_time_s`; with several, each step pays its own
tail (`step_time_s` = (makespan + steps x tail) / steps) but only the last
step's is drawn, after the whole timeline (the simulator's step barrier has
none).

Encoder ops keep their tp collectives inside their time (not split out); an
explicit workload, or one without a cluster, has no slices.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpipe_core.ir.ops import B, BW, W, is_llm
from mpipe_core.simulation.chunks import llm_layers, split_recompute
from mpipe_core.simulation.p2p import chunk_devices
from mpipe_core.workloads.collectives import SEND, Collective, send

# What a slice is part of, its `group`: a layer's tensor or context parallelism, a
# pipeline hop, the data-parallel gradient sync, the optimizer step (no collective).
TP, CP, PP, DP, OPTIMIZER = "tp", "cp", "pp", "dp", "optimizer"


@dataclass(frozen=True)
class CommSlice:
    """`count` collectives of one kind and size on one device, drawn as one slice.

    Times are workload time units (the timeline's); seconds and bytes are the
    priced collectives': `seconds` = count x each one's time, of which
    `exposed` adds to the op (or to the step, after the pipeline)."""

    device: int
    start: float
    end: float
    group: str  # TP, CP, PP, DP or OPTIMIZER
    collective: str  # all-reduce, all-gather, reduce-scatter, send; "" for the optimizer
    count: int
    buffer_bytes: float  # each collective's buffer (the whole tensor, nccl-tests' S)
    moved_bytes: float  # what each rank sends per collective
    link: str  # scale_up, domain, scale_out; "hbm" for the optimizer (its memory traffic)
    ranks: int
    seconds: float
    exposed: float
    op: tuple | None  # the op it is part of (a pp send: the sending op); None after the pipeline
    step: int = 0
    # A pipeline send after its op that does not hold its device (it may overlap what
    # the device does next, so a trace gives it a row of its own).
    asynchronous: bool = False

    @property
    def name(self) -> str:
        """"tp all-reduce", "cp send", "dp reduce-scatter", "optimizer"."""
        return self.group if self.group == OPTIMIZER else f"{self.group} {self.collective}"

    def as_dict(self) -> dict:
        return {"device": self.device, "start": self.start, "end": self.end, "name": self.name,
                "group": self.group, "collective": self.collective, "count": self.count,
                "buffer_bytes": self.buffer_bytes, "moved_bytes": self.moved_bytes, "link": self.link,
                "ranks": self.ranks, "seconds": self.seconds, "exposed": self.exposed,
                "op": None if self.op is None else str(self.op), "step": self.step,
                "asynchronous": self.asynchronous}


def _grouped(parts: list[tuple[str, Collective, int]]) -> list[tuple[str, Collective, int]]:
    """(group, collective, count) with equal collectives of a group merged, first seen first."""
    out: dict[tuple, list] = {}
    for group, c, n in parts:
        if n <= 0 or c.seconds <= 0:
            continue
        key = (group, c)
        if key in out:
            out[key][2] += n
        else:
            out[key] = [group, c, n]
    return [tuple(v) for v in out.values()]


def comm_slices(schedule, workload, timeline, figures) -> list[CommSlice]:
    """Every communication slice of the timeline and the step's tail, device by device
    (empty without a cluster)."""
    model = workload.step
    if model is None or model.cluster is None or figures is None:
        return []
    unit = model.seconds_per_unit
    pp = schedule.devices
    layer = {k: [c for kind, c in model.layer_collectives if kind == k] for k in "FBW"}
    embed = {k: [c for kind, c in model.embed_collectives if kind == k] for k in "FBW"}
    head = {k: [c for kind, c in model.head_collectives if kind == k] for k in "FBW"}
    tp_exposed, cp_exposed = dict(zip("FBW", model.tp_layer)), dict(zip("FBW", model.cp_layer))
    pipes = {}
    for pipe in schedule.pipelines:
        layers = llm_layers(pipe, workload)
        pipes[pipe.module] = (layers, split_recompute(pipe)[1], chunk_devices(schedule, pipe.module, pipe.chunks))
    out: list[CommSlice] = []
    for op, d, s, e in timeline.rows():
        if not is_llm(op) or op[0] not in pipes or op[1] not in ("F", B, W, BW):
            continue
        layers, recompute, where = pipes[op[0]]
        kind, chunk, last = op[1], op[2], len(layers) - 1
        kinds = (B, W) if kind == BW else (kind,)
        n = layers[chunk]
        full = recompute[chunk][0] if kind in (B, BW) else 0
        tp_full, tp_over, cp_parts, closing = [], [], [], []
        exposed = {TP: 0.0, CP: 0.0}  # of what overlaps compute

        def add(k: str, count: int) -> None:
            # A kind's tp collectives close the op when they add in full, else they overlap it.
            tp_total = sum(c.seconds for c in layer[k] if c.kind != SEND)
            hidden = model.tp_comm_overlap or tp_exposed[k] < tp_total * (1 - 1e-12)
            for c in layer[k]:
                if c.kind == SEND:
                    cp_parts.append((CP, c, count))
                else:
                    (tp_over if hidden else tp_full).append((TP, c, count))
            if hidden:
                exposed[TP] += count * tp_exposed[k]
            exposed[CP] += count * cp_exposed[k]

        for k in kinds:
            add(k, n)
            closing += [(TP, c, 1) for c in (embed[k] if chunk == 0 else []) + (head[k] if chunk == last else [])]
        if full:
            add("F", full)

        def apart(a: int, b: int) -> bool:
            return 0 <= b <= last and where[a] is not None and where[b] is not None and where[a] != where[b]

        # A forward's input comes from the chunk before and its output goes to the next;
        # a backward's the other way; a weight gradient exchanges nothing.
        towards, source = (chunk + 1, chunk - 1) if kind == "F" else (chunk - 1, chunk + 1)
        exchanges = kind != W
        gather = model.boundary_gather
        if gather is not None and workload.llm.token_ratio is not None:  # a drawn batch: this microbatch's
            gather = model.boundary_gather_at(workload.llm.token_ratio[op[3]])
        opening = [(PP, gather, 1)] if gather is not None and exchanges \
            and apart(chunk, source) else []
        hop = None
        if exchanges and apart(chunk, towards):
            link = model.stage_link(pp, where[chunk], where[towards])
            hop = send(workload.llm.boundary_bytes_of(op[3]), link)
        overlapped = _grouped(cp_parts + tp_over)
        in_full = _grouped(tp_full + closing)
        blocking = hop is not None and not model.p2p_overlap and hop.seconds > 0
        totals = {TP: sum(c.seconds * m for _, c, m in _grouped(tp_over)),
                  CP: sum(c.seconds * m for _, c, m in _grouped(cp_parts))}

        def slice_(group, c, count, start, end, exposed_s, asynchronous=False):
            return CommSlice(d, start, end, group, c.kind, count, c.buffer_bytes, c.moved_bytes, c.link,
                             c.ranks, c.seconds * count, exposed_s, op, op[4], asynchronous)

        cursor = s
        for group, c, count in _grouped(opening):
            length = c.seconds * count / unit
            out.append(slice_(group, c, count, cursor, cursor + length, c.seconds * count))
            cursor += length
        tail = e - (sum(c.seconds * m for _, c, m in in_full) + (hop.seconds if blocking else 0.0)) / unit
        for group, c, count in overlapped:
            seconds = c.seconds * count
            share = exposed[group] * seconds / totals[group] if totals[group] else 0.0
            end = min(cursor + seconds / unit, max(tail, cursor))
            out.append(slice_(group, c, count, cursor, end, share))
            cursor = end
        cursor = tail
        for group, c, count in in_full:
            length = c.seconds * count / unit
            out.append(slice_(group, c, count, cursor, cursor + length, c.seconds * count))
            cursor += length
        if hop is not None and hop.seconds > 0:
            length = hop.seconds / unit
            start = e - length if blocking else e
            out.append(slice_(PP, hop, 1, start, start + length, hop.seconds if blocking else 0.0, not blocking))
    out.extend(_tail(figures, unit, model.hbm_bytes_per_s, max((op[4] for op in timeline.ops), default=0)))
    return out


def _tail(figures, unit: float, hbm_bytes_per_s: float, step: int) -> list[CommSlice]:
    """Each device's exposed gradient sync and its optimizer step, after its last op."""
    out = []
    for d, dev in enumerate(figures.devices):
        cursor = dev.end / unit
        for c, exposed in zip(dev.sync, dev.sync_parts):
            if exposed <= 0:
                continue
            out.append(CommSlice(d, cursor, cursor + exposed / unit, DP, c.kind, 1, c.buffer_bytes,
                                 c.moved_bytes, c.link, c.ranks, c.seconds, exposed, None, step))
            cursor += exposed / unit
        if dev.optimizer > 0:
            # The optimizer's HBM traffic (`step_figures`: per parameter updated, and the zeroing per held).
            traffic = dev.optimizer * hbm_bytes_per_s
            out.append(CommSlice(d, cursor, cursor + dev.optimizer / unit, OPTIMIZER, "", 1, traffic, traffic,
                                 "hbm", 1, dev.optimizer, dev.optimizer, None, step))
    return out
