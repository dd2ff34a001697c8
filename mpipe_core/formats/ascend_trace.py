"""One rank's `trace_view.json` (what `torch_npu.profiler` and MindSpore's
profiler write in `ASCEND_PROFILER_OUTPUT/`) read into the ops it timed and
the communication it ran.

The format: a bare JSON array of Trace Event Format events.  `ts` is a
decimal string of microseconds (a number is accepted too), `dur` a number of
microseconds.  Lanes are processes named by `ph: "M"` `process_name` events:
`Python` (and `CANN`) hold the host side, `Ascend Hardware` the kernels as
the device ran them, `HCCL` or `Communication` the collectives and
point-to-point transfers (`hcom_allReduce_…`, `hcom_send_…`,
`hcom_BatchSendRecv_…`), `Overlap Analysis` the profiler's own summary.

What an op is, as for Kineto traces (`kineto.py`): ranges named `PP:<action>`,
`mpipe:` labels or a `--label-pattern`, on any host lane; `ProfilerStep#N`
ranges mark steps.  Its time (`docs/trace-import.md`):

* the device time of its range: from the first start to the last end of the
  `Ascend Hardware` kernels launched inside the range, as Kineto's
  `gpu_user_annotation` gives on CUDA.  A kernel's launch is the host end of
  the `async_npu` flow event that ends in it (the profiler links each launch
  to its kernel so); a kernel without one counts as launched when it started
  (host and device timestamps are on one clock in this file);
* where the file has no device lane, the host range whole, and the run's
  summary says so.  A range with no kernel launched inside it while the lane
  exists keeps its host range too (counted in `host_fallbacks`).
"""
from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.formats.kineto import STEP_NAME, RankTrace, TracedOp, _actions, _split, _step_of
from mpipe_core.formats.label_pattern import LabelPattern, convention
from mpipe_core.formats.pp_actions import OTHER, TRANSFER

HARDWARE = "Ascend Hardware"
COMM_LANES = ("HCCL", "Communication")
SUMMARY_LANES = ("Overlap Analysis",)
HCOM = re.compile(r"hcom_([A-Za-z]+)")
FLOW = "async_npu"  # flow events from a host launch ("s") to its kernel ("f", inside the kernel's slice)


@dataclass
class CommEvent:
    """One communication event of an `HCCL`/`Communication` lane, on the file's clock (us)."""

    kind: str  # the collective as hcom names it: allReduce, send, receive, BatchSendRecv, ...
    name: str
    start: float
    end: float
    step: int | None


@dataclass
class AscendRank:
    trace: RankTrace
    comm: list[CommEvent] = field(default_factory=list)
    device_lane: bool = False
    host_fallbacks: int = 0  # op ranges that launched no kernel (timed by their host range)


def _timestamp(value: Any, base: int | None) -> tuple[float | None, int | None]:
    """(microseconds after `base`, base): a decimal string keeps its digits exact
    (an epoch in microseconds as a float loses the sub-microsecond part)."""
    if isinstance(value, str):
        text = value.strip()
        whole, _, frac = text.partition(".")
        if not whole.lstrip("-").isdigit() or (frac and not frac.isdigit()):
            return None, base
        number = int(whole)
        fraction = float("0." + frac) if frac else 0.0
        if number < 0:
            fraction = -fraction
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            return None, base
        number = math.floor(value)
        fraction = float(value) - number
    else:
        return None, base
    if base is None:
        base = number
    return (number - base) + fraction, base


def _launch_times(kernels: list[tuple[float, float]], kernel_at: dict, launches: dict[Any, float],
                  lands: list[tuple[Any, Any, float]]) -> list[float]:
    """Each kernel's launch on the host: the start of the `async_npu` flow that ends inside it
    (on its lane and stream), else the kernel's own start."""
    out = [k[0] for k in kernels]
    for lane in kernel_at.values():
        lane.sort()
    for flow, where, ts in lands:
        lane = kernel_at.get(where)
        if flow not in launches or not lane:
            continue
        j = bisect.bisect_right(lane, (ts, math.inf, math.inf)) - 1
        if j >= 0 and lane[j][0] <= ts <= lane[j][1]:
            out[lane[j][2]] = launches[flow]
    return out


def parse_trace_view(doc: Any, source: str, rank: int, pattern: LabelPattern | None = None,
                     align_on: str | None = None, world_size: int | None = None) -> AscendRank:
    """The ops and communication of one rank's trace_view.json (already parsed JSON)."""
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events = doc["traceEvents"]
    elif isinstance(doc, list):
        events = doc
    else:
        raise MpipeError(f"{source}: not an Ascend trace_view.json (a JSON array of events)")
    lanes: dict[Any, str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args")
            if isinstance(args, dict) and isinstance(args.get("name"), str):
                lanes[e.get("pid")] = args["name"]
    patterns = [convention()] + ([pattern] if pattern is not None else [])
    base: int | None = None
    ranges: list[tuple[float, float, str, list]] = []
    kernels: list[tuple[float, float]] = []
    kernel_at: dict[Any, list[tuple[float, float, int]]] = {}  # (pid, tid) -> (start, end, index in kernels)
    launches: dict[Any, float] = {}  # async_npu flow id -> its host end (the launch)
    lands: list[tuple[Any, Any, float]] = []  # (flow id, (pid, tid), ts) of each flow's device end
    comm_raw: list[tuple[str, str, float, float]] = []
    steps: dict[int, tuple[float, float]] = {}
    align_ends: list[tuple[float, float]] = []
    transfers = others = 0
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            continue
        if e.get("ph") in ("s", "f") and e.get("cat") == FLOW:
            ts, base = _timestamp(e.get("ts"), base)
            if ts is not None and isinstance(e.get("id"), (int, str)):
                if e["ph"] == "s":
                    launches[e["id"]] = ts
                else:
                    lands.append((e["id"], (e.get("pid"), e.get("tid")), ts))
            continue
        if e.get("ph") != "X":
            continue
        name = e.get("name")
        name = name if isinstance(name, str) else str(name)
        where = f"{source}: event {i} ('{name[:60]}')"
        ts, base = _timestamp(e.get("ts"), base)
        if ts is None:
            raise MpipeError(f"{where}: ts {str(e.get('ts'))[:30]} is not a finite number")
        dur = e.get("dur")
        if isinstance(dur, str):
            try:
                dur = float(dur)
            except ValueError:
                dur = None
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or not math.isfinite(dur):
            raise MpipeError(f"{where}: dur {str(e.get('dur'))[:30]} is not a finite number")
        if dur < 0:
            raise MpipeError(f"{where}: dur {dur:g} is negative")
        lane = lanes.get(e.get("pid"), "")
        if align_on is not None and name == align_on:
            align_ends.append((ts, ts + dur))
        if lane == HARDWARE:
            kernel_at.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + dur, len(kernels)))
            kernels.append((ts, ts + dur))
            continue
        if lane in COMM_LANES:
            kind = HCOM.match(name)
            if kind:
                comm_raw.append((kind[1], name, ts, ts + dur))
            continue
        if lane in SUMMARY_LANES:
            continue
        step = STEP_NAME.match(name)
        if step:
            steps[int(step[1])] = (ts, ts + dur)
            continue
        try:
            actions = _actions(name, patterns)
        except MpipeError as error:
            raise MpipeError(f"{where}: {error.message}") from None
        if actions is None:
            continue
        roles = {a[0] for a in actions}
        if TRANSFER in roles:
            transfers += 1
        elif OTHER in roles:
            others += 1
        else:
            ranges.append((ts, ts + dur, name, actions))
    ranges.sort(key=lambda r: r[0])
    launched = _launch_times(kernels, kernel_at, launches, lands)
    kernels = sorted((launched[n], k[0], k[1]) for n, k in enumerate(kernels))  # (launch, start, end)
    starts = [k[0] for k in kernels]
    marks = sorted((s, e, n) for n, (s, e) in steps.items())
    device_lane = HARDWARE in lanes.values()
    ops: list[TracedOp] = []
    fallbacks = 0
    for ts, end, name, actions in ranges:
        first_k = bisect.bisect_left(starts, ts)
        last_k = bisect.bisect_right(starts, end)
        step = _step_of(ts, marks)
        if device_lane and last_k > first_k:
            first = min(k[1] for k in kernels[first_k:last_k])
            last = max(k[2] for k in kernels[first_k:last_k])
            ops.extend(_split(actions, first, last, first, step, name))
        else:
            fallbacks += device_lane
            ops.extend(_split(actions, ts, end, ts, step, name))
    ops.sort(key=lambda o: (o.start, o.end))
    comm = [CommEvent(kind, name, a, b, _step_of(a, marks)) for kind, name, a, b in sorted(comm_raw, key=lambda c: c[2])]
    trace = RankTrace(source, rank, world_size, "hccl", (base or 0) * 1000, ops, steps, device_lane, transfers,
                      others, len(events), [end for _, end in sorted(align_ends)])
    return AscendRank(trace, comm, device_lane, fallbacks)
