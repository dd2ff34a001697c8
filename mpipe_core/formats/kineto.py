"""One rank's Chrome / Kineto trace (what `torch.profiler` and torchtitan write)
read into the ops it timed.

The format: `{"schemaVersion", "distributedInfo": {"rank", "world_size",
"backend", ...}, "baseTimeNanoseconds", "traceEvents": [{"ph": "X", "cat",
"name", "ts", "dur", "pid", "tid", "args"}, ...]}`, `ts` and `dur` in
microseconds (`ts` counted from `baseTimeNanoseconds` when it is there).
`user_annotation` events are the CPU side of a `record_function`;
`gpu_user_annotation` events are the same ranges on the device's stream.

What an op is (the documented rule, `docs/trace-import.md`):

* Ranges named `PP:<action>` (torch's pipelining runtime, `pp_actions`), the
  `mpipe:` label convention or a `--label-pattern` (`label_pattern`).
* With device-side ranges (any `gpu_user_annotation` of those names), an
  op is its device range: start and end of that event.  The k-th device range
  of a name is the k-th CPU range of that name (for the step it belongs to).
* Otherwise the CPU range: it starts at its first child op (the first
  `cpu_op` event of the same thread that starts inside it) and ends with the
  range.  A forward or backward range also covers the wait for its input
  (posted earlier by a RECV); that wait, from the range's start to its first
  child, is left between the ops, where `compare-run --explain` counts it as a
  transfer wait.  A range with no child op is taken whole.
* OVERLAP_F_B runs its sub-actions one after another inside one range: they
  share its span in equal parts, in the order listed.
* `ProfilerStep#N` ranges mark steps: an op belongs to the step whose range
  holds its CPU range's start.
"""
from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from mpipe_core.errors import MpipeError
from mpipe_core.formats.label_pattern import LabelPattern, convention
from mpipe_core.formats.pp_actions import COMPUTE, OTHER, TRANSFER, parse_action

CPU_RANGE, DEVICE_RANGE, CPU_OP = "user_annotation", "gpu_user_annotation", "cpu_op"
STEP_NAME = re.compile(r"ProfilerStep#(\d+)\Z")
RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


@dataclass
class TracedOp:
    module: str
    kind: str
    chunk: int
    microbatch: int
    start: float  # microseconds on this file's clock
    end: float
    span_start: float  # where its range began (the wait for its input included)
    step: int | None  # the ProfilerStep number it belongs to (None: no step marks)
    name: str  # the range's name


@dataclass
class RankTrace:
    source: str
    rank: int
    world_size: int | None
    backend: str | None
    base_ns: int  # baseTimeNanoseconds (0 when absent)
    ops: list[TracedOp]
    steps: dict[int, tuple[float, float]]  # ProfilerStep number -> (start, end)
    device_side: bool
    transfers: int = 0  # PP: SEND/RECV ranges seen
    others: int = 0  # PP: UNSHARD / RESHARD / REDUCE_GRAD ranges seen
    events: int = 0
    align_ends: list[float] = field(default_factory=list)  # ends of the --align-on events, in order
    group: str = ""  # the folder of one profiling window (torchtitan's iteration_N)
    host_name: str = ""
    comm: list = field(default_factory=list)  # communication events (`ascend_trace.CommEvent`), if read


def rank_from_name(name: str) -> int | None:
    found = RANK_IN_NAME.findall(name)
    return int(found[-1]) if found else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _events(doc: Any, source: str) -> list:
    if isinstance(doc, list):  # the bare-array form of the Trace Event Format
        events = doc
    elif not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise MpipeError(f"{source}: not a Chrome/Kineto trace (no traceEvents list)")
    else:
        events = doc["traceEvents"]
    if events and not any(isinstance(e, dict) for e in events):
        raise MpipeError(f"{source}: not a Chrome/Kineto trace (none of its {len(events)} events is a JSON object)")
    return events


def parse_kineto(doc: Any, source: str, pattern: LabelPattern | None = None,
                 align_on: str | None = None) -> RankTrace:
    """The ops of one rank's trace document (already parsed JSON)."""
    events = _events(doc, source)
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    info = info if isinstance(info, dict) else {}
    rank = info.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        rank = rank_from_name(source.rsplit("/", 1)[-1])
    if rank is None:
        raise MpipeError(f"{source}: cannot tell the rank (no distributedInfo.rank, no rank<N> in the file name)")
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    base = doc.get("baseTimeNanoseconds", 0) if isinstance(doc, dict) else 0
    base = base if isinstance(base, int) and not isinstance(base, bool) else 0

    patterns = [convention()] + ([pattern] if pattern is not None else [])
    cpu_ranges: list[tuple[float, float, Any, str, list]] = []  # (ts, end, thread, name, actions)
    device_ranges: dict[str, list[tuple[float, float]]] = {}
    child_starts: dict[Any, list[float]] = {}
    steps: dict[int, tuple[float, float]] = {}
    align_ends: list[tuple[float, float]] = []
    transfers = others = 0
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = e.get("name")
        name = name if isinstance(name, str) else str(name)
        ts, dur = _number(e.get("ts")), _number(e.get("dur"))
        where = f"{source}: event {i} ('{name[:60]}')"
        if ts is None or not math.isfinite(ts):
            raise MpipeError(f"{where}: ts {str(e.get('ts'))[:30]} is not a finite number")
        if dur is None or not math.isfinite(dur):
            raise MpipeError(f"{where}: dur {str(e.get('dur'))[:30]} is not a finite number")
        if dur < 0:
            raise MpipeError(f"{where}: dur {dur:g} is negative")
        cat = e.get("cat")
        thread = (e.get("pid"), e.get("tid"))
        if cat == CPU_OP:
            child_starts.setdefault(thread, []).append(ts)
        if align_on is not None and name == align_on:
            align_ends.append((ts, ts + dur))
        if cat not in (CPU_RANGE, DEVICE_RANGE):
            continue
        step = STEP_NAME.match(name)
        if step and cat == CPU_RANGE:
            steps[int(step[1])] = (ts, ts + dur)
            continue
        try:
            actions = _actions(name, patterns)
        except MpipeError as error:
            raise MpipeError(f"{where}: {error.message}") from None
        if actions is None:
            continue
        if cat == DEVICE_RANGE:
            device_ranges.setdefault(name, []).append((ts, ts + dur))
            continue
        roles = {a[0] for a in actions}
        if TRANSFER in roles:
            transfers += 1
        elif OTHER in roles:
            others += 1
        else:
            cpu_ranges.append((ts, ts + dur, thread, name, actions))
    for starts in child_starts.values():
        starts.sort()
    cpu_ranges.sort(key=lambda r: r[0])
    step_marks = sorted((s, e, n) for n, (s, e) in steps.items())
    device_side = bool(device_ranges)
    seen: dict[str, int] = {}
    ops: list[TracedOp] = []
    for ts, end, thread, name, actions in cpu_ranges:
        k = seen.get(name, 0)
        seen[name] = k + 1
        step = _step_of(ts, step_marks)
        if device_side:
            ranges = device_ranges.get(name, [])
            if k >= len(ranges):
                raise MpipeError(f"{source}: '{name[:60]}' has {k + 1} CPU ranges but {len(ranges)} device "
                                 f"ranges (gpu_user_annotation); cannot match them")
            first, last = ranges[k]
            span = first
        else:
            starts = child_starts.get(thread, [])
            j = bisect.bisect_left(starts, ts)
            first = starts[j] if j < len(starts) and starts[j] <= end else ts
            last, span = end, ts
        ops.extend(_split(actions, first, last, span, step, name))
    if device_side:  # device ranges of compute actions with no CPU range at all
        for name, ranges in device_ranges.items():
            for first, last in ranges[seen.get(name, 0):]:
                actions = _actions(name, patterns)
                if actions and all(a[0] == COMPUTE for a in actions):
                    ops.extend(_split(actions, first, last, first, _step_of(first, step_marks), name))
    ops.sort(key=lambda o: (o.start, o.end))
    host = doc.get("host_name") if isinstance(doc, dict) else None
    return RankTrace(source, rank, world, backend, base, ops, steps, device_side, transfers, others,
                     len(events), [end for _, end in sorted(align_ends)],
                     host_name=host[:64] if isinstance(host, str) else "")


def _actions(name: str, patterns: Iterable[LabelPattern]):
    """[(role, kind, module, chunk, microbatch)] a range name stands for, or None."""
    torch_actions = parse_action(name)
    if torch_actions is not None:
        return [(a.role, a.kind, "llm", a.stage, a.microbatch) for a in torch_actions]
    for pattern in patterns:
        label = pattern.match(name)
        if label is not None:
            return [(COMPUTE, label.kind, label.module, label.chunk, label.microbatch)]
    return None


def _split(actions, first: float, last: float, span: float, step, name: str) -> list[TracedOp]:
    """The range's compute actions over [first, last] in equal consecutive parts."""
    compute = [a for a in actions if a[0] == COMPUTE]
    width = (last - first) / len(compute)
    out = []
    for n, (_, kind, module, chunk, mb) in enumerate(compute):
        a = first + n * width
        b = last if n == len(compute) - 1 else first + (n + 1) * width
        out.append(TracedOp(module, kind, chunk, mb, a, b, span if n == 0 else a, step, name))
    return out


def _step_of(ts: float, marks: list[tuple[float, float, int]]) -> int | None:
    """The ProfilerStep whose range holds `ts` (None: no step marks, or outside them all)."""
    j = bisect.bisect_right(marks, (ts, math.inf, 0)) - 1
    if j >= 0 and marks[j][0] <= ts <= marks[j][1]:
        return marks[j][2]
    return None
