"""A real Kineto trace (torch.profiler on CPU) rewritten in the layout an Ascend
cluster leaves behind (`docs/trace-import.md`, "From an Ascend cluster"), so
the Ascend readers are tested on what a real pipelining run did:

    <host>_<pid>_<stamp>_ascend_pt/profiler_info_<rank>.json
    <host>_<pid>_<stamp>_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json
    <host>_<pid>_<stamp>_ascend_pt/ASCEND_PROFILER_OUTPUT/step_trace_time.csv

`trace_view.json` is a bare array with `ts` as decimal strings of epoch
microseconds; lanes `Python`, `CANN`, `Ascend Hardware`, `HCCL` and `Overlap
Analysis` are named by `process_name` events.  The host ranges and torch ops go
to `Python`; every torch op (`cpu_op`) that starts inside a compute range
(on any thread: the backward's run on autograd's) becomes a kernel of `Ascend
Hardware` that starts `LAG` us after the op did and lasts as long, linked to
its launch by an `async_npu` flow as torch_npu links them (so a range's device
time is its first op's start to its last op's end, shifted by LAG: the
kernels of a range's last ops run after the range has ended); each
`PP:` send and receive range becomes an `hcom_send_…` / `hcom_receive_…` on
`HCCL`.  Folder names sort in the reverse of the rank order."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

LAG = 40.0  # us from a kernel's launch to its start on the device: past its range's end, often
LANES = {"Python": 1, "CANN": 2, "Ascend Hardware": 3, "HCCL": 4, "Overlap Analysis": 5}
STEP_HEADER = ["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication",
               "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing"]


def _ts(base_us: int, rel: float) -> str:
    """A decimal string of epoch microseconds, as the Ascend profiler writes them."""
    whole = int(rel // 1)
    return f"{base_us + whole}.{round((rel - whole) * 1000):03d}" if rel - whole else f"{base_us + whole}"


def _is_compute(name: str) -> bool:
    return name.startswith("PP:") and "_" not in name and name[4:5] in "FIWB" and name[5:6].isdigit()


def _union(spans: list[tuple[float, float]]) -> float:
    """Length of the union of intervals (nested torch ops counted once)."""
    total, reach = 0.0, -float("inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def to_trace_view(doc: dict) -> tuple[list, dict[int, dict[str, float]]]:
    """The trace_view.json events of one Kineto document, and per ProfilerStep its step_trace figures (us)."""
    base_us = doc["baseTimeNanoseconds"] // 1000
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    out: list = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": lane}}
                 for lane, pid in LANES.items()]
    out += [{"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
            for pid in LANES.values()]
    ranges = [e for e in events if e.get("cat") == "user_annotation" and _is_compute(e["name"])]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    kernels = []
    for e in ranges:
        end = e["ts"] + e["dur"]
        kernels += [o for o in ops if e["ts"] <= o["ts"] <= end]  # any thread's: autograd's too
    for e in events:
        if e.get("cat") in ("user_annotation", "cpu_op"):
            out.append({"ph": "X", "name": e["name"], "pid": LANES["Python"], "tid": e["tid"],
                        "ts": _ts(base_us, e["ts"]), "dur": e["dur"], "cat": e["cat"], "args": {}})
    seen: set[int] = set()
    for n, k in enumerate(kernels):
        if id(k) in seen:
            continue
        seen.add(id(k))
        device_ts = k["ts"] + LAG  # the device runs it after the host launched it
        out.append({"ph": "X", "name": k["name"].replace("aten::", "").title() + "AiCore", "pid": LANES["Ascend Hardware"],
                    "tid": 2, "ts": _ts(base_us, device_ts), "dur": k["dur"], "args": {"Task Id": n}})
        out.append({"ph": "s", "cat": "async_npu", "name": "async_npu", "id": n, "pid": LANES["Python"],
                    "tid": k["tid"], "ts": _ts(base_us, k["ts"]), "bp": "e"})
        out.append({"ph": "f", "cat": "async_npu", "name": "async_npu", "id": n, "pid": LANES["Ascend Hardware"],
                    "tid": 2, "ts": _ts(base_us, device_ts), "bp": "e"})
        out.append({"ph": "X", "name": "Computing", "pid": LANES["Overlap Analysis"], "tid": 0,
                    "ts": _ts(base_us, device_ts), "dur": k["dur"]})
    comms = []
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith("PP:") and ("SEND" in e["name"] or "RECV" in e["name"]):
            kind = "send" if "SEND" in e["name"] else "receive"
            comms.append((kind, e))
            out.append({"ph": "X", "name": f"hcom_{kind}__{len(comms)}_0_1", "pid": LANES["HCCL"], "tid": 0,
                        "ts": _ts(base_us, e["ts"]), "dur": e["dur"], "args": {}})
    steps = {}
    for mark in (e for e in events if e["name"].startswith("ProfilerStep#")):
        a, b = mark["ts"], mark["ts"] + mark["dur"]
        computing = _union([(k["ts"] + LAG, k["ts"] + LAG + k["dur"]) for k in kernels if a <= k["ts"] <= b])
        sends = sum(e["dur"] for kind, e in comms if kind == "send" and a <= e["ts"] <= b)
        receives = sum(e["dur"] for kind, e in comms if kind == "receive" and a <= e["ts"] <= b)
        comm = sends + receives
        free = max(0.0, mark["dur"] - computing - comm)
        steps[int(mark["name"].split("#")[1])] = {
            "Computing": computing, "Communication(Not Overlapped)": comm, "Overlapped": 0.0, "Communication": comm,
            "Free": free, "Stage": computing + comm + free - receives, "Bubble": receives,
            "Communication(Not Overlapped and Exclude Receive)": sends, "Preparing": 0.0}
    return out, steps


def step_trace_csv(rank: int, steps: dict[int, dict[str, float]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(STEP_HEADER)
    for step, row in sorted(steps.items()):
        writer.writerow([rank, step] + [f"{row[c]:.3f}" for c in STEP_HEADER[2:]])
    return buf.getvalue()


def write_ascend_folder(doc: dict, root: Path, folder_name: str, *, with_info: bool = True,
                        with_step_csv: bool = True, cut: bool = False) -> Path:
    """One rank's profiler folder under `root`; `cut` writes its trace_view.json without the closing `]`."""
    rank = doc["distributedInfo"]["rank"]
    folder = root / folder_name
    (folder / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    if with_info:
        (folder / f"profiler_info_{rank}.json").write_text(json.dumps(
            {"config": {"common_config": {"activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"]}},
             "start_info": {"syscnt_enable": True}, "rank_id": rank}))
    events, steps = to_trace_view(doc)
    text = json.dumps(events)
    (folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(text[:-1] if cut else text)
    if with_step_csv:
        (folder / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv").write_text(step_trace_csv(rank, steps))
    return folder


def folder_name(rank: int, ranks: int) -> str:
    """A torch_npu-style name whose sort order is the reverse of the rank order."""
    return f"node{ranks - rank:02d}_{4100 + rank}_20261207131500{rank:03d}_ascend_pt"


def write_job(docs: list[dict], root: Path, **options) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        rank = doc["distributedInfo"]["rank"]
        write_ascend_folder(doc, root, folder_name(rank, len(docs)), **options)
    return root
