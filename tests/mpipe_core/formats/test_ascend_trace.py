"""One rank's trace_view.json (`mpipe_core.formats.ascend_trace`): `ts` as a
decimal string or a number, ops timed by the Ascend Hardware kernels inside
their ranges, the host range where there is no device lane (and where a range
has no kernel), hcom_ events as communication of their kind."""
from __future__ import annotations

import pytest

from mpipe_core.errors import MpipeError
from mpipe_core.formats.ascend_trace import parse_trace_view

BASE = 1_790_000_000_000_000  # epoch microseconds


def lanes(*names: str) -> list[dict]:
    return [{"ph": "M", "name": "process_name", "pid": n, "tid": 0, "args": {"name": name}}
            for n, name in enumerate(names, 1)]


def X(name: str, ts: float, dur: float, pid: int, as_text: bool = True) -> dict:
    stamp = f"{BASE + int(ts)}.{round((ts % 1) * 1000):03d}" if as_text else BASE + ts
    return {"ph": "X", "name": name, "pid": pid, "tid": 1, "ts": stamp, "dur": dur}


def doc(as_text: bool = True, hardware: bool = True) -> list[dict]:
    events = lanes("Python", "CANN", "Ascend Hardware", "HCCL", "Overlap Analysis")
    events += [X("ProfilerStep#4", 0.0, 100.0, 1, as_text), X("PP:0F0", 10.0, 20.0, 1, as_text),
               X("PP:0B0", 40.0, 30.0, 1, as_text), X("PP:0F1", 75.0, 5.0, 1, as_text)]
    if hardware:
        events += [X("MatMulV2", 12.25, 5.0, 3, as_text), X("Add", 18.0, 14.5, 3, as_text),  # ends past its range
                   X("MatMulV2", 45.0, 10.0, 3, as_text), X("Computing", 12.25, 5.0, 5, as_text)]
    events += [X("hcom_allReduce__123_0_1", 80.0, 6.0, 4, as_text), X("hcom_send__7_0_1", 31.0, 1.0, 4, as_text),
               X("hcom_BatchSendRecv__9_0_1", 71.0, 2.0, 4, as_text), X("Communication", 80.0, 6.0, 5, as_text)]
    return events


@pytest.mark.parametrize("as_text", [True, False])
def test_ops_are_their_kernels_first_start_to_last_end(as_text):
    got = parse_trace_view(doc(as_text), "rank0/trace_view.json", rank=3)
    t = got.trace
    assert t.rank == 3 and got.device_lane and t.device_side
    ops = {(o.kind, o.chunk, o.microbatch): (o.start, o.end, o.step) for o in t.ops}
    assert ops[("F", 0, 0)] == pytest.approx((12.25, 32.5, 4))  # the second kernel ends after the range
    assert ops[("BW", 0, 0)] == pytest.approx((45.0, 55.0, 4))
    assert ops[("F", 0, 1)] == pytest.approx((75.0, 80.0, 4))  # no kernel inside: its host range
    assert got.host_fallbacks == 1
    assert t.base_ns == BASE * 1000
    assert [(c.kind, c.start, c.end, c.step) for c in got.comm] == [
        ("send", 31.0, 32.0, 4), ("BatchSendRecv", 71.0, 73.0, 4), ("allReduce", 80.0, 86.0, 4)]


def test_without_a_device_lane_ops_are_their_host_ranges():
    events = [e for e in doc(hardware=False) if e.get("args", {}).get("name") != "Ascend Hardware"]
    got = parse_trace_view(events, "t.json", rank=0)
    assert not got.device_lane and got.host_fallbacks == 0 and not got.trace.device_side
    assert len(got.comm) == 3
    assert [(o.start, o.end) for o in got.trace.ops] == [(10.0, 30.0), (40.0, 70.0), (75.0, 80.0)]


def test_string_timestamps_keep_their_sub_microsecond_digits():
    events = lanes("Python") + [{"ph": "X", "name": "PP:0F0", "pid": 1, "tid": 1,
                                 "ts": "1790000000123456.789", "dur": 1.5}]
    (op,) = parse_trace_view(events, "t.json", rank=0).trace.ops
    assert op.start == pytest.approx(0.789, abs=1e-9) and op.end == pytest.approx(2.289, abs=1e-9)


@pytest.mark.parametrize("ts, message", [
    ("12x", "t.json: event 1 ('PP:0F0'): ts 12x is not a finite number"),
    (None, "t.json: event 1 ('PP:0F0'): ts None is not a finite number"),
])
def test_a_bad_timestamp_names_the_event(ts, message):
    events = lanes("Python") + [{"ph": "X", "name": "PP:0F0", "pid": 1, "tid": 1, "ts": ts, "dur": 1.0}]
    with pytest.raises(MpipeError) as refused:
        parse_trace_view(events, "t.json", rank=0)
    assert refused.value.message == message


def test_a_document_that_is_no_array_is_refused():
    with pytest.raises(MpipeError) as refused:
        parse_trace_view({"events": []}, "t.json", rank=0)
    assert refused.value.message == "t.json: not an Ascend trace_view.json (a JSON array of events)"


def test_an_import_without_a_device_lane_says_so_in_its_summary():
    import json

    from mpipe_core.formats.trace_files import TraceFile
    from mpipe_core.formats.trace_import import assemble

    def one(rank: int) -> TraceFile:
        events = lanes("Python", "HCCL") + [X(f"PP:{rank}F0", 10.0 + 30 * rank, 20.0, 1),
                                            X(f"PP:{rank}BW0", 100.0 - 30 * rank, 20.0, 1),
                                            X("hcom_send__1_0_1", 31.0 + 30 * rank, 1.0, 2)]
        return TraceFile(f"r{rank}/trace_view.json", json.dumps(events).encode(), rank=rank, kind="ascend")

    trace = assemble([one(1), one(0)])
    assert trace.format == "ascend" and not trace.device_side and trace.ranks == 2
    assert trace.notes == [f"r{r}/trace_view.json: no 'Ascend Hardware' lane; its ops are timed by their host ranges"
                           for r in (1, 0)]
    assert trace.comm_counts() == [{"send": 1}, {"send": 1}]
    assert trace.summary()["device_side"] is False


def test_a_kernel_belongs_to_the_range_that_launched_it_by_its_async_npu_flow():
    """Kernels run after the host launched them: one launched at the end of PP:0F0 runs after the range
    ended (inside PP:0B0's time); the flow puts it in PP:0F0, and PP:0B0 keeps only its own."""
    def flow(ph: str, ident: int, ts: float, pid: int) -> dict:
        return {"ph": ph, "cat": "async_npu", "name": "async_npu", "id": ident, "pid": pid, "tid": 1 if pid == 1 else 2,
                "ts": f"{BASE + int(ts)}.{round((ts % 1) * 1000):03d}", "bp": "e"}

    events = lanes("Python", "CANN", "Ascend Hardware") + [
        X("ProfilerStep#0", 0.0, 100.0, 1), X("PP:0F0", 10.0, 20.0, 1), X("PP:0B0", 40.0, 30.0, 1),
        X("MatMulV2", 15.0, 10.0, 3), flow("s", 1, 12.0, 1), flow("f", 1, 15.0, 3),
        X("Add", 42.0, 8.0, 3), flow("s", 2, 29.0, 1), flow("f", 2, 42.0, 3),  # launched in F, ran in B's time
        X("MatMulV2", 55.0, 10.0, 3), flow("s", 3, 45.0, 1), flow("f", 3, 55.5, 3)]  # f inside the kernel
    for e in events:
        if e.get("pid") == 3 and e.get("ph") == "X":
            e["tid"] = 2
    ops = {o.kind: (o.start, o.end) for o in parse_trace_view(events, "t.json", rank=0).trace.ops}
    assert ops["F"] == pytest.approx((15.0, 50.0))
    assert ops["BW"] == pytest.approx((55.0, 65.0))
