"""Per-rank traces (or Megatron's simulator output) assembled into one run's
timeline: `TimelineRecord`s in seconds on one clock, steps, and each rank's
op order, from which the term is inferred or against which a given term is
checked.  Pure: storing the run is `storage.imported_runs`' job.

Clocks (`docs/trace-import.md`): a Kineto timestamp is microseconds from the
file's `baseTimeNanoseconds`, i.e. the host's wall clock; ranks are put on
one clock by those bases (exact on one host; across hosts as good as their
clock sync).  `align_on=NAME` instead takes the end of the first event named
NAME (a barrier or collective every rank leaves together) as the same instant
on every rank.  Times are then seconds from the first op's start.

Steps: `ProfilerStep#N` marks (every rank of a profiling window must have
them; ops outside every mark are left out), else the k-th occurrence of each
op on a rank is step k.  Steps of several windows (torchtitan's
`iteration_N` folders) follow each other, renumbered from 0.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mpipe_core.errors import MpipeError
from mpipe_core.formats.ascend_trace import HARDWARE, parse_trace_view
from mpipe_core.formats.kineto import RankTrace, parse_kineto
from mpipe_core.formats.label_pattern import LabelPattern
from mpipe_core.formats.megatron_sim import looks_like_durations, looks_like_orders, parse_megatron
from mpipe_core.formats.rank_layout import Pipeline, RankLayout, one_pipeline
from mpipe_core.formats.trace_files import TraceFile, digest
from mpipe_core.ir.ops import LLM, Op
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.workloads.inputs import load_document

US = 1e-6
MAX_OPS = 5_000_000


@dataclass(frozen=True)
class CommRecord:
    """One communication event of a rank (an Ascend trace's HCCL lane), seconds on the run's clock."""

    device: int
    kind: str  # as hcom names it: allReduce, send, receive, BatchSendRecv, ...
    name: str
    step: int
    start: float
    end: float


@dataclass
class ImportedTrace:
    format: str  # "kineto" or "megatron-sim"
    files: list[str]
    digest: str
    ranks: int
    records: list[TimelineRecord]  # compute ops, seconds from the first op's start
    orders: list[list[Op]]  # each rank's op order in the reference step
    steps: list[dict[str, Any]]  # per stored step: its window and ProfilerStep number
    clock: str  # how the ranks were put on one clock, in words
    device_side: bool
    backend: str | None = None
    transfers: list[int] = field(default_factory=list)  # PP: SEND/RECV ranges per rank
    notes: list[str] = field(default_factory=list)
    wall_start: float | None = None  # epoch seconds of the first op (None: unknown)
    wall_end: float | None = None
    host_names: list[str] = field(default_factory=list)
    global_ranks: list[int] = field(default_factory=list)  # stage s came from global rank global_ranks[s]
    comm: list[CommRecord] = field(default_factory=list)  # communication rows (Ascend HCCL lanes)
    # each step_trace_time.csv beside the traces: (name, bytes, the rank of its trace)
    step_csvs: list[tuple[str, bytes, int]] = field(default_factory=list)

    @property
    def ops_per_rank(self) -> list[int]:
        counts = Counter(r.device for r in self.records)
        return [counts.get(d, 0) for d in range(self.ranks)]

    @property
    def microbatches(self) -> int:
        return 1 + max((op.mb for order in self.orders for op in order), default=0)

    @property
    def chunks(self) -> int:
        return 1 + max((op.chunk for order in self.orders for op in order if op.module == LLM), default=0)

    @property
    def encoders(self) -> dict[str, bool]:
        """Encoder modules seen, and whether any backward of theirs was timed (trainable)."""
        out: dict[str, bool] = {}
        for order in self.orders:
            for op in order:
                if op.module != LLM:
                    out[op.module] = out.get(op.module, False) or op.kind != "F"
        return out

    def summary(self) -> dict[str, Any]:
        return {"format": self.format, "files": self.files, "digest": self.digest, "ranks": self.ranks,
                "ops_per_rank": self.ops_per_rank, "steps": self.steps, "clock": self.clock,
                "device_side": self.device_side, "transfers_per_rank": self.transfers,
                "global_ranks": self.global_ranks or list(range(self.ranks)), "notes": self.notes,
                "communication_per_rank": self.comm_counts()}

    def comm_counts(self) -> list[dict[str, int]]:
        """Per rank, how many communication rows of each kind."""
        out: list[dict[str, int]] = [{} for _ in range(self.ranks)]
        for c in self.comm:
            out[c.device][c.kind] = out[c.device].get(c.kind, 0) + 1
        return [dict(sorted(d.items())) for d in out]


def _load(f: TraceFile) -> Any:
    if f.kind == "ascend" and not f.data.rstrip().endswith(b"]"):
        # the profiler writes trace_view.json in two phases: an interrupted export has no closing bracket
        raise MpipeError(f"{f.name}: cut off mid-write (no closing ']'); re-export the profiler data")
    return load_document(f.data, f.name, kind="JSON", hint="a truncated or damaged trace?")


def assemble(files: Sequence[TraceFile], pattern: LabelPattern | None = None, align_on: str | None = None,
             progress: Callable[[str], None] | None = None, layout: RankLayout | None = None) -> ImportedTrace:
    """One run out of the files; with `layout`, the files' ranks are global ranks of
    that world and one pipeline's files are kept (`formats.rank_layout`)."""
    if not files:
        raise MpipeError("no trace files given")
    docs = []
    for n, f in enumerate(files, 1):
        if progress is not None:
            progress(f"[{n}/{len(files)}] parsing {f.name} ({len(f.data) / 1e6:.1f} MB)")
        docs.append(_load(f))
    durations = [(f, d) for f, d in zip(files, docs) if looks_like_durations(d)]
    if durations:
        trace = _megatron(files, docs, durations)
        if layout is not None:
            trace.notes.append(f"{layout.source} not used: Megatron's simulator output is one pipeline's "
                               f"stages already")
        return trace
    ascend = [f for f in files if f.kind == "ascend"]
    if ascend and len(ascend) != len(files):
        raise MpipeError(f"{ascend[0].name} is an Ascend profiler folder's trace, "
                         f"{next(f.name for f in files if f.kind != 'ascend')} is not: import them apart")
    traces = []
    fallbacks: list[str] = []
    for f, doc in zip(files, docs):
        if ascend:
            got = parse_trace_view(doc, f.name, f.rank if f.rank is not None else 0, pattern, align_on)
            t = got.trace
            t.comm = got.comm
            if not got.device_lane:
                fallbacks.append(f"{f.name}: no '{HARDWARE}' lane; its ops are timed by their host ranges")
            elif got.host_fallbacks:
                fallbacks.append(f"{f.name}: {got.host_fallbacks} op range(s) launched no '{HARDWARE}' kernel; "
                                 f"timed by their host ranges")
        else:
            t = parse_kineto(doc, f.name, pattern, align_on)
        t.group = f.group
        traces.append(t)
    _check_ranges(traces, pattern)
    pipeline = None
    if layout is not None:
        files, traces, pipeline = _keep_one_pipeline(files, traces, layout)
    trace = _kineto(files, traces, align_on, pipeline)
    if pipeline is not None:
        trace.global_ranks = pipeline.ranks
        trace.notes.insert(0, pipeline.note())
    if ascend:
        trace.format = "ascend"
        if align_on is None:
            trace.clock = "as recorded: trace_view.json timestamps (microseconds of each host's clock)"
        trace.notes.extend(fallbacks)
        trace.step_csvs = [(*f.step_csv, t.rank) for f, t in zip(files, traces) if f.step_csv is not None]
    return trace


def _check_ranges(traces: list[RankTrace], pattern) -> None:
    """Said first: a file without pipeline ranges is the problem, not the ranks missing around it."""
    for t in traces:
        if not t.ops:
            hint = " (its PP: ranges are only sends, receives or FSDP actions)" if t.transfers or t.others else ""
            raise MpipeError(f"{t.source}: no pipeline ranges: no PP:<action> ranges of "
                             f"torch.distributed.pipelining, no mpipe:<module>:<kind>:<microbatch> labels"
                             + (", nothing matching the --label-pattern" if pattern else "")
                             + hint + "; give --label-pattern REGEX for other names")


def _keep_one_pipeline(files: Sequence[TraceFile], traces: list[RankTrace], layout: RankLayout):
    """The files of the lowest rank's pipeline, their ranks renumbered as its stages."""
    _check_duplicates(traces)
    worlds = [(t.world_size, t.source) for t in traces if t.world_size is not None]
    world, world_from = worlds[0] if worlds else (None, "")
    for size, source in worlds:
        if size != world:
            raise MpipeError(f"{source}: world size {size}, but {world_from} has {world}")
    pipeline = one_pipeline([(t.rank, t.source) for t in traces], layout, world, world_from)
    stage_of = {rank: s for s, rank in enumerate(pipeline.ranks)}
    kept_files, kept = [], []
    for f, t in zip(files, traces):
        if t.rank in stage_of:
            t.rank, t.world_size = stage_of[t.rank], len(pipeline.ranks)
            kept_files.append(f)
            kept.append(t)
    return kept_files, kept, pipeline


def _check_duplicates(traces: list[RankTrace]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for t in traces:
        if (t.group, t.rank) in seen:
            raise MpipeError(f"two files for rank {t.rank}" + (f" in {t.group}" if t.group else "")
                             + f": {seen[t.group, t.rank]} and {t.source}")
        seen[t.group, t.rank] = t.source


def _megatron(files, docs, durations) -> ImportedTrace:
    orders = [(f, d) for f, d in zip(files, docs) if looks_like_orders(d)]
    others = [f.name for f, d in zip(files, docs) if not looks_like_orders(d) and not looks_like_durations(d)]
    if len(durations) != 1 or len(orders) != 1 or others:
        raise MpipeError("Megatron's simulator output is two files: task_durations.json and pp_task_orders.json "
                         f"(got {len(durations)} durations, {len(orders)} orders"
                         + (f", and {', '.join(others[:3])}" if others else "") + ")")
    traces = parse_megatron(durations[0][1], orders[0][1], durations[0][0].name, orders[0][0].name)
    records, orders_out, steps = [], [], [{"step": 0, "window": "", "profiler_step": None}]
    for t in traces:
        records += [TimelineRecord(t.rank, o.module, o.kind, o.chunk, o.microbatch, 0, o.start * US, o.end * US)
                    for o in t.ops]
        orders_out.append([Op(o.module, o.kind, o.chunk, o.microbatch) for o in t.ops])
    return ImportedTrace("megatron-sim", [f.name for f in files], digest(files), len(traces), records,
                         orders_out, steps, "one timeline built from the measured task durations (no clocks)",
                         False, transfers=[0] * len(traces),
                         notes=["task durations measured alone by Megatron's simulator; starts follow its "
                                "analyzer's rule (in order, as soon as inputs are done, no transfer time)"])


def _check_window(label: str, window: str, group: list[RankTrace], pipeline: Pipeline | None) -> int:
    """The window's rank count: one file per rank 0..P-1 (with a layout, per stage of its pipeline)."""
    _check_duplicates(group)
    seen = {t.rank: t.source for t in group}
    present = sorted(seen)
    if pipeline is not None:
        missing = [s for s in range(len(pipeline.ranks)) if s not in seen]
        if missing:
            given = ", ".join(str(pipeline.ranks[s]) for s in present) or "none"
            raise MpipeError(f"{label}: no trace for stage {missing[0]} of pipeline {pipeline.slice}: global rank "
                             f"{pipeline.ranks[missing[0]]} ({pipeline.layout.describe()}; its ranks given: "
                             f"{given})")
        return len(pipeline.ranks)
    world = next((t.world_size for t in group if t.world_size), None)
    expected = world if world is not None else present[-1] + 1
    if present[-1] >= expected:
        raise MpipeError(f"{seen[present[-1]]}: rank {present[-1]} is outside the world size {expected}")
    missing = [r for r in range(expected) if r not in seen]
    if missing:
        hint = "; for one pipeline of a larger world give --layout tp=..,dp=..,pp=.." if world is not None else ""
        raise MpipeError(f"{label}: no trace for rank {missing[0]} (world size {expected}; "
                         f"ranks given: {', '.join(map(str, present))}){hint}")
    return expected


def _kineto(files, traces: list[RankTrace], align_on, pipeline: Pipeline | None) -> ImportedTrace:
    order_of = {f.group: f.order for f in files}
    windows = sorted({(order_of.get(t.group, 0), t.group) for t in traces})
    base_min = min(t.base_ns for t in traces)
    ranks = None
    notes: list[str] = []
    found: list[tuple[int, int, str, bool]] = []  # (window index, local step, window, from marks)
    raw: list[tuple[int, int, int, Any, float]] = []  # (window index, local step, rank, op, shift)
    clock = ""
    shift_of: dict[int, float] = {}
    for w, (_, window) in enumerate(windows):
        group = sorted((t for t in traces if t.group == window), key=lambda t: t.rank)
        label = window or "the traces"
        expected = _check_window(label, window, group, pipeline)
        if ranks is not None and ranks != expected:
            raise MpipeError(f"{label}: {expected} ranks, but another window has {ranks}")
        ranks = expected
        shifts, clock = _shifts(group, base_min, align_on)
        shift_of.update((id(t), shift) for t, shift in zip(group, shifts))
        marks = all(t.steps for t in group)
        if any(t.steps for t in group) and not marks:
            notes.append(f"{label}: some ranks have no ProfilerStep marks; steps taken from op repetitions")
        local: set[int] = set()
        for t, shift in zip(group, shifts):
            occurrence: Counter = Counter()
            dropped = 0
            for op in t.ops:
                if marks:
                    if op.step is None:
                        dropped += 1
                        continue
                    step = op.step
                else:
                    key = (op.module, op.kind, op.chunk, op.microbatch)
                    step = occurrence[key]
                    occurrence[key] += 1
                local.add(step)
                raw.append((w, step, t.rank, op, shift))
            if dropped:
                notes.append(f"{t.source}: {dropped} ops outside every ProfilerStep range left out")
        found += [(w, n, window, marks) for n in sorted(local)]
    assert ranks is not None
    if len(raw) > MAX_OPS:
        raise MpipeError(f"the traces hold {len(raw)} pipeline ops; the limit is {MAX_OPS}")
    number = {(w, n): k for k, (w, n, _, _) in enumerate(found)}
    steps = [{"step": k, "window": window, "profiler_step": n if marks else None}
             for k, (w, n, window, marks) in enumerate(found)]
    origin = min(op.start + shift for _, _, _, op, shift in raw)
    last = max(op.end + shift for _, _, _, op, shift in raw)
    host = {t.rank: t.host_name for t in traces}
    records = sorted((TimelineRecord(rank, op.module, op.kind, op.chunk, op.microbatch, number[(w, n)],
                                     (op.start + shift - origin) * US, (op.end + shift - origin) * US,
                                     host.get(rank, ""))
                      for w, n, rank, op, shift in raw), key=lambda r: (r.step, r.device, r.start, r.end))
    comm = _comm_records(traces, windows, raw, number, shift_of, origin)
    orders, note = _reference_orders(records, ranks)
    if note:
        notes.append(note)
    backends = {t.backend for t in traces if t.backend}
    wall = base_min / 1e9 + origin * US if base_min else None
    return ImportedTrace(
        "kineto", [f.name for f in files], digest(files), ranks, records, orders, steps, clock,
        any(t.device_side for t in traces), backend=backends.pop() if len(backends) == 1 else None,
        transfers=[sum(t.transfers for t in traces if t.rank == r) for r in range(ranks)], notes=notes,
        wall_start=wall, wall_end=None if wall is None else wall + (last - origin) * US,
        host_names=sorted({t.host_name for t in traces if t.host_name}), comm=comm)


def _comm_records(traces: list[RankTrace], windows, raw, number, shift_of, origin: float) -> list[CommRecord]:
    """The ranks' communication events on the run's clock: each in the step whose
    ProfilerStep mark holds it (left out outside every mark), else in the last of
    the rank's steps whose first op began before it (left out before every step)."""
    window_index = {window: w for w, (_, window) in enumerate(windows)}
    firsts: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)  # (window, rank) -> step -> first op start
    for w, step, rank, op, _ in raw:
        mine = firsts[(w, rank)]
        mine[step] = min(mine.get(step, math.inf), op.start)
    out = []
    for t in traces:
        if not t.comm:
            continue
        w = window_index[t.group]
        shift = shift_of[id(t)]
        starts = sorted((a, n) for n, a in firsts[(w, t.rank)].items())
        for c in t.comm:
            if t.steps:
                step = c.step if c.step is not None and (w, c.step) in number else None
            else:
                j = bisect.bisect_right(starts, (c.start, math.inf)) - 1
                step = starts[j][1] if j >= 0 else None
            if step is None:
                continue
            out.append(CommRecord(t.rank, c.kind, c.name, number[(w, step)], (c.start + shift - origin) * US,
                                  (c.end + shift - origin) * US))
    return sorted(out, key=lambda c: (c.step, c.device, c.start))


def _shifts(group: list[RankTrace], base_min: int, align_on: str | None) -> tuple[list[float], str]:
    """Microseconds to add to each rank's timestamps to put them on one clock."""
    by_base = [(t.base_ns - base_min) / 1000.0 for t in group]  # exact: integers of nanoseconds
    if align_on is None:
        same = len({t.base_ns for t in group}) == 1
        return by_base, ("as recorded: every file has the same baseTimeNanoseconds" if same else
                         "as recorded: each file's timestamps counted from its own baseTimeNanoseconds "
                         "(the hosts' wall clocks)")
    for t in group:
        if not t.align_ends:
            raise MpipeError(f"{t.source}: no event named '{align_on[:60]}' to align the clocks on (--align-on)")
    # rank 0's event end, on its own clock, is where every rank's event end goes
    ref = group[0].align_ends[0] + by_base[0]
    shifts = [ref - t.align_ends[0] for t in group]
    return shifts, f"aligned on the end of the first '{align_on[:60]}' event of every rank"


def _reference_orders(records: list[TimelineRecord], ranks: int) -> tuple[list[list[Op]], str]:
    """Each rank's op order in the first step that every rank ran whole (the step
    whose per-rank op counts are the most common), and a note if steps differ."""
    per_step: dict[int, list[list[TimelineRecord]]] = defaultdict(lambda: [[] for _ in range(ranks)])
    for r in records:
        per_step[r.step][r.device].append(r)
    shapes = {s: tuple(len(rows) for rows in per) for s, per in per_step.items()}
    common = Counter(shapes.values()).most_common(1)[0][0]
    ref = min(s for s, shape in shapes.items() if shape == common)
    orders = [[Op(r.module, r.kind, r.chunk, r.microbatch) for r in rows] for rows in per_step[ref]]
    odd = sorted(s for s, shape in shapes.items() if shape != common)
    differ = [s for s, per in per_step.items() if shapes[s] == common and
              [[Op(r.module, r.kind, r.chunk, r.microbatch) for r in rows] for rows in per] != orders]
    parts = []
    if odd:
        parts.append(f"steps {', '.join(map(str, odd))} have other op counts than step {ref} (incomplete?)")
    if differ:
        parts.append(f"steps {', '.join(map(str, differ))} ran the ops in another order than step {ref}")
    return orders, "; ".join(parts)


# --------------------------------------------------------------------------- the term

# Generators whose per-rank orders an import is matched against, with how many
# chunks each holds per rank (None: any v, given as v=).
_CANDIDATES = (("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("zb_h2", 1), ("interleaved", None),
               ("looped_bfs", None), ("zbv", 2), ("dualpipev", 2))


def default_workload(trace: ImportedTrace) -> dict[str, Any]:
    """The workload an import is stored with when none is given: unit costs, and
    each encoder the traces timed (trainable when any backward of it was)."""
    doc: dict[str, Any] = {"name": "imported", "llm": {"layers": None}}
    encoders = trace.encoders
    if encoders:
        doc["encoders"] = [{"name": name, "f": 1.0, "b": 1.0, "w": 1.0, "trainable": trainable}
                           for name, trainable in sorted(encoders.items())]
    return doc


def _orders_of(evaluation) -> list[list[Op]]:
    return [[Op(op.module, op.kind, op.chunk, op.mb) for op in order] for order in evaluation.schedule.orders]


def infer_term(trace: ImportedTrace, workload: Any) -> str | None:
    """The first generator term whose orders on `workload` are exactly the traces' (None: none is)."""
    from mpipe_core.api import evaluate

    p, m, chunks = trace.ranks, trace.microbatches, trace.chunks
    if chunks % p:
        return None
    v = chunks // p
    for name, per_rank in _CANDIDATES:
        if per_rank is not None and per_rank != v:
            continue
        text = f"{name}(p={p}, m={m}" + (f", v={v})" if per_rank is None else ")")
        try:
            ev = evaluate(text, workload)
        except MpipeError:
            continue
        if _orders_of(ev) == trace.orders:
            return ev.term
    return None


def check_term(trace: ImportedTrace, term: str, workload: Any) -> str:
    """The term's canonical text, or MpipeError naming the first op where its
    orders and the traces' differ."""
    from mpipe_core.api import evaluate
    from mpipe_core.ir.ops import format_op

    ev = evaluate(term, workload)
    if len(ev.schedule.pipelines) != 1 or ev.schedule.pipelines[0].steps != 1:
        raise MpipeError(f"--term {ev.term}: an imported run is one pipeline repeated step by step "
                         f"(no par/overlay/repeat)")
    mine = _orders_of(ev)
    if len(mine) != trace.ranks:
        raise MpipeError(f"--term {ev.term} runs on {len(mine)} devices; the traces have {trace.ranks} ranks")
    for r, (want, got) in enumerate(zip(mine, trace.orders)):
        for k in range(max(len(want), len(got))):
            a = format_op(want[k]) if k < len(want) else "nothing"
            b = format_op(got[k]) if k < len(got) else "nothing"
            if a != b:
                raise MpipeError(f"--term {ev.term}: rank {r}, op {k}: the traces ran {b} where the term "
                                 f"runs {a}")
    return ev.term
