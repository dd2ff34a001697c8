"""Communication on the timeline (simulation/comm_timeline.py): a tp=2 layer's
all-reduces with the bytes and seconds of the ring formula, the step's tail
(gradient sync and optimizer) as long as the breakdown says and ending at
step_time_s, every slice inside its op, the Chrome trace's comm rows, and
nothing at all without a cluster."""
import json
from collections import defaultdict

import pytest

from mpipe_core.api import evaluate
from mpipe_core.formats.chrome_trace import chrome_trace
from mpipe_core.formats.export import export_text

# 4 devices per node: tp=2 sits on scale-up (100 GB/s, 1 us, efficiency 1), the
# two pipeline stages' hop and the dp group cross nodes (scale_out 10 GB/s x 0.5).
CLUSTER = {"devices_per_node": 4, "nodes_per_domain": 1,
           "links": {"scale_up": {"GBps": 100, "latency_us": 1, "efficiency": 1.0},
                     "scale_out": {"GBps": 10, "latency_us": 5, "efficiency": 0.5}}}
MODEL = {"hidden": 1024, "layers": 4, "heads": 16, "seq_len": 1024, "vocab": 1024}
# One layer's activation: 1024 tokens x 1024 x 2 bytes = 2 MiB.  A ring all-reduce
# over 2 ranks: NCCL's base latency (8.4 us, from the a100's dgx-a100 cluster these
# links override), 2 steps of 1 us, each rank moving 2 (2-1)/2 x 2 MiB = 2 MiB.
ACTIVATION = 1024 * 1024 * 2
ALL_REDUCE_S = 8.4e-6 + 2 * 1e-6 + ACTIVATION / 100e9


def _doc(**parallel) -> dict:
    return {"model": MODEL, "device": "a100", "cluster": CLUSTER, "parallel": {"tp": 2, **parallel}}


def _ops(ev) -> dict:
    return {op: (d, s, e) for op, d, s, e in ev.timeline.rows()}


def test_a_tp2_layers_all_reduces_carry_the_ring_formulas_bytes_and_seconds():
    ev = evaluate("1f1b(p=2, m=2)", _doc())
    ops = _ops(ev)
    # Chunk 1 (2 layers, the head) forward: 2 all-reduces per layer, the head's F has none.
    [tp] = [c for c in ev.comm if str(c.op) == "llm:1F0" and c.group == "tp"]
    assert (tp.collective, tp.count, tp.ranks, tp.link) == ("all-reduce", 4, 2, "scale_up")
    assert tp.buffer_bytes == tp.moved_bytes == ACTIVATION
    assert tp.seconds == pytest.approx(4 * ALL_REDUCE_S) and tp.exposed == tp.seconds  # not overlapped
    d, start, end = ops[tp.op]
    assert tp.device == d and tp.end == pytest.approx(end)  # it closes the op
    assert tp.end - tp.start == pytest.approx(4 * ALL_REDUCE_S * 1e3)  # ms on the timeline
    # The backward: each layer's 2 input-gradient all-reduces run behind their partner weight-
    # gradient GEMMs (from the op's start, partly exposed); the head's input-gradient all-reduce,
    # with no partner, closes the op in full.
    layers, head = [c for c in ev.comm if str(c.op) == "llm:1BW0" and c.group == "tp"]
    _, bstart, bend = ops[layers.op]
    assert (layers.count, layers.start) == (4, bstart) and layers.exposed < layers.seconds
    assert head.count == 1 and head.exposed == head.seconds and head.end == pytest.approx(bend)
    # Chunk 1's forward opens with the all-gather of the hidden state chunk 0 scattered.
    [gather] = [c for c in ev.comm if str(c.op) == "llm:1F0" and c.group == "pp"]
    assert (gather.collective, gather.start) == ("all-gather", start)


def test_every_slice_sits_inside_its_op_and_the_exposed_parts_are_the_breakdowns():
    for doc in (_doc(cp=2, dp=2), _doc(sp=True, tp_comm_overlap=True, cp=2), _doc(p2p_overlap=False)):
        ev = evaluate("interleaved(p=2, m=4, v=2)", doc)
        ops = _ops(ev)
        for c in ev.comm:
            if c.op is not None and not c.asynchronous:
                _, start, end = ops[c.op]
                assert start - 1e-9 <= c.start <= c.end <= end + 1e-9, c
        step = ev.step
        crit = step.critical_device
        for group, key in (("tp", "tp_comm"), ("cp", "cp_comm"), ("dp", "dp_comm"), ("optimizer", "optimizer")):
            exposed = sum(c.exposed for c in ev.comm if c.device == crit and c.group == group)
            assert exposed == pytest.approx(step.breakdown[key], abs=1e-15), (doc, group)


def test_an_asynchronous_pipeline_send_lasts_what_the_edge_charges():
    ev = evaluate("1f1b(p=2, m=2)", _doc(dp=2))  # 8 ranks, tp-cp-dp-pp: the two stages on two nodes
    [send] = [c for c in ev.comm if str(c.op) == "llm:0F0" and c.group == "pp"]
    assert send.asynchronous and send.exposed == 0.0 and send.link == "scale_out"
    assert send.start == pytest.approx(_ops(ev)[send.op][2])  # from the sending op's end
    assert send.end - send.start == pytest.approx(ev.workload.boundary_transfer_between(2, 0, 1))
    assert send.buffer_bytes == ACTIVATION / 2  # each tp rank sends its half


@pytest.mark.parametrize("distributed", [False, True])
def test_the_steps_tail_is_the_gradient_sync_then_the_optimizer_and_ends_at_the_step_time(distributed):
    ev = evaluate("1f1b(p=2, m=4)", _doc(dp=2, distributed_optimizer=distributed))
    step = ev.step
    tail = [c for c in ev.comm if c.op is None]
    crit = [c for c in tail if c.device == step.critical_device]
    sync = [c for c in crit if c.group == "dp"]
    assert [c.collective for c in sync] == (["reduce-scatter", "all-gather"] if distributed else ["all-reduce"])
    assert sum(c.end - c.start for c in sync) * 1e-3 == pytest.approx(step.breakdown["dp_comm"])
    # tp x dp = 4 ranks fill one node: the dp pair talks over scale-up
    assert [c.ranks for c in sync] == [2] * len(sync) and {c.link for c in sync} == {"scale_up"}
    [opt] = [c for c in crit if c.group == "optimizer"]
    assert opt.start == pytest.approx(sync[-1].end) and opt.seconds == pytest.approx(step.breakdown["optimizer"])
    assert max(c.end for c in tail) * 1e-3 == pytest.approx(step.step_time_s)  # the Gantt's right edge
    for d, dev in enumerate(step.devices):  # each device's tail starts where its pipeline ends
        assert min(c.start for c in tail if c.device == d) == pytest.approx(dev.end * 1e3)


def test_the_chrome_trace_has_comm_rows_with_bytes_and_link_class():
    ev = evaluate("1f1b(p=2, m=2)", _doc(dp=2))
    trace = json.loads(export_text(ev, "chrome-trace")[0])
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {0: "device 0", 1: "device 1", 2: "device 0 comm", 3: "device 1 comm",
                     4: "device 0 sends", 5: "device 1 sends"}
    comm = [e for e in trace["traceEvents"] if e.get("cat", "").startswith("comm,")]
    assert len(comm) == len(ev.comm)
    tp = next(e for e in comm if e["cat"] == "comm,tp" and e["args"]["op"] == "llm:1F0")
    assert tp["tid"] == 3 and tp["name"] == "tp all-reduce"
    assert tp["args"]["link"] == "scale_up" and tp["args"]["buffer_bytes"] == ACTIVATION
    assert tp["dur"] == pytest.approx(4 * ALL_REDUCE_S * 1e6)  # microseconds
    opt = [e for e in comm if e["cat"] == "comm,optimizer"]
    assert {e["tid"] for e in opt} == {0, 1}  # the optimizer runs on the device's own row
    # Slices on one row nest or follow each other (Perfetto draws them as a stack).
    rows = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            rows[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in rows.values():
        open_ends: list[float] = []
        for s, e in sorted(spans):
            while open_ends and open_ends[-1] <= s + 1e-6:
                open_ends.pop()
            assert not open_ends or e <= open_ends[-1] + 1e-6
            open_ends.append(e)


@pytest.mark.parametrize("workload", ["vit-heavy-small", {"model": MODEL, "device": "a100", "parallel": {"tp": 2}}])
def test_without_a_cluster_there_is_no_communication_and_the_trace_is_unchanged(workload):
    ev = evaluate("1f1b(p=2, m=2)", workload)
    assert ev.comm == []
    text = export_text(ev, "chrome-trace")[0]
    assert json.loads(text) == chrome_trace(ev.timeline_rows(), 2, title=ev.term)
    assert "comm" not in text
