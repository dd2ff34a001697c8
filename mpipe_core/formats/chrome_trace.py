"""Chrome / Perfetto trace JSON (the Trace Event Format), predicted or measured."""
from __future__ import annotations

from typing import Any, Iterable

# One time unit of a workload becomes this many trace microseconds (1 unit = 1 ms).
US_PER_UNIT = 1000.0


def chrome_trace(rows: Iterable[dict[str, Any]], devices: int, title: str = "mpipe") -> dict[str, Any]:
    """rows: dicts with device, module, kind, chunk, microbatch, start, end (time units)."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": title}},
    ]
    for d in range(devices):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": d, "args": {"name": f"device {d}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": d, "args": {"sort_index": d}})
    for r in rows:
        mb = r["microbatch"]
        name = f"{r['module']}:{r['chunk']}{r['kind']}" + (str(mb) if mb >= 0 else "")
        events.append({
            "ph": "X", "name": name, "cat": f"{r['module']},{r['kind']}", "pid": 0, "tid": r["device"],
            "ts": r["start"] * US_PER_UNIT, "dur": (r["end"] - r["start"]) * US_PER_UNIT,
            "args": {k: r[k] for k in ("module", "kind", "chunk", "microbatch", "step") if k in r},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}
