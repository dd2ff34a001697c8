"""Chrome / Perfetto trace JSON (the Trace Event Format), predicted or measured.

With communication slices (`simulation.comm_timeline`, an analytic workload on
a cluster) each device gets two more rows below its ops: "device d comm" (the
collectives inside its ops and the gradient sync after the pipeline) and
"device d sends" (pipeline sends that do not hold the device); the optimizer
step sits on the device's own row.  Each slice's args carry its collective,
count, bytes, link class, ranks, seconds and exposed seconds.
"""
from __future__ import annotations

from typing import Any, Iterable

# One time unit of a workload becomes this many trace microseconds (1 unit = 1 ms).
US_PER_UNIT = 1000.0
COMM_ARGS = ("group", "collective", "count", "buffer_bytes", "moved_bytes", "link", "ranks", "seconds", "exposed",
             "op", "step")


def chrome_trace(rows: Iterable[dict[str, Any]], devices: int, title: str = "mpipe",
                 comm: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """rows: dicts with device, module, kind, chunk, microbatch, start, end (time units);
    comm: `CommSlice.as_dict()`s (none: the trace has one row per device)."""
    comm = list(comm)
    rows_per_device = 3 if comm else 1
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": title}},
    ]
    for d in range(devices):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": d, "args": {"name": f"device {d}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": d,
                       "args": {"sort_index": d * rows_per_device}})
    if comm:
        for d in range(devices):
            for row, label in ((1, "comm"), (2, "sends")):
                tid = row * devices + d
                events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid,
                               "args": {"name": f"device {d} {label}"}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": tid,
                               "args": {"sort_index": d * rows_per_device + row}})
    for r in rows:
        mb = r["microbatch"]
        name = f"{r['module']}:{r['chunk']}{r['kind']}" + (str(mb) if mb >= 0 else "")
        events.append({
            "ph": "X", "name": name, "cat": f"{r['module']},{r['kind']}", "pid": 0, "tid": r["device"],
            "ts": r["start"] * US_PER_UNIT, "dur": (r["end"] - r["start"]) * US_PER_UNIT,
            "args": {k: r[k] for k in ("module", "kind", "chunk", "microbatch", "step") if k in r},
        })
    for c in comm:
        d = c["device"]
        tid = d if c["group"] == "optimizer" else (2 if c.get("asynchronous") else 1) * devices + d
        events.append({
            "ph": "X", "name": c["name"], "cat": f"comm,{c['group']}", "pid": 0, "tid": tid,
            "ts": c["start"] * US_PER_UNIT, "dur": (c["end"] - c["start"]) * US_PER_UNIT,
            "args": {k: c[k] for k in COMM_ARGS if k in c},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}
