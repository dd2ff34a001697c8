"""Per-rank Chrome/Kineto traces of a term as torch's pipelining runtime records
them (docs/trace-import.md), built here for the trace readers' tests: every
compute action a `PP:<chunk><action><microbatch>` range whose first child op (a
cpu_op) starts `wait` us in and computes for `cost(op, step)` us, optional SEND
ranges after forwards and device-side copies, ProfilerStep marks around steps."""
from __future__ import annotations

from typing import Callable

from mpipe_core.api import evaluate
from mpipe_core.formats.torch_csv import TO_TORCH

BASE_NS = 1_790_000_000_000_000_000


def X(name: str, ts: float, dur: float, cat: str = "user_annotation", tid: int = 1, pid: int = 1) -> dict:
    """One complete event ("ph": "X"), microseconds."""
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": {}}


def trace_doc(rank: int, events: list, world: int = 2, base: int = BASE_NS, info: bool = True,
              host_name: str | None = None, backend: str = "nccl") -> dict:
    out = {"schemaVersion": 1, "baseTimeNanoseconds": base, "traceEvents": events}
    if host_name is not None:
        out["host_name"] = host_name
    if info:
        out["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world}
    return out


def pipelining_traces(term: str, cost: Callable[[object, int], float], *, steps: int = 2, wait: float = 5.0,
                      after: float = 1.0, step_gap: float = 100.0, first_step: int = 0, sends: bool = False,
                      device: bool = False, marks: bool = True, offset: float = 0.0, child: str = "aten::mm",
                      pid: int = 1, **doc_options) -> list[dict]:
    """One trace document per rank of `term`'s schedule.  An action's range
    lasts `wait + cost(op, step)`; the next starts `after` us after it ends."""
    ev = evaluate(term)
    docs = []
    for rank, order in enumerate(ev.schedule.orders):
        events, t = [], offset
        for step in range(steps):
            start = t
            for op in order:
                name = f"PP:{op.chunk}{TO_TORCH[op.kind]}{op.mb}"
                compute = cost(op, step)
                events.append(X(name, t, wait + compute, pid=pid))
                events.append(X(child, t + wait, compute, cat="cpu_op", pid=pid))
                if device:
                    events.append(X(name, t + wait + 2.0, compute, cat="gpu_user_annotation", tid=99, pid=pid))
                t += wait + compute + after
                if sends and op.kind == "F":
                    events.append(X(f"PP:{op.chunk}SEND_F{op.mb}", t, 1.0, pid=pid))
                    t += 2.0
            if marks:
                events.append(X(f"ProfilerStep#{step + first_step}", start, t - start, pid=pid))
            t += step_gap
        docs.append(trace_doc(rank, events, world=ev.schedule.devices, **doc_options))
    return docs
