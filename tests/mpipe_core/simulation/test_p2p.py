"""Pipeline exchanges on a cluster (simulation/p2p.py): the receiving stage's
all-gather of the scattered hidden state, and Megatron-LM 2021's blocking
sends (`parallel.p2p_overlap: false`), against hand-computed times."""
import pytest

from mpipe_core.api import evaluate
from mpipe_core.simulation.p2p import p2p_extras
from mpipe_core.workloads.workload import parse_workload

# 4 devices per node, 2 nodes per domain: tp=4 fills a node, so the two stages'
# hop crosses the domain link (50 GB/s, 2 us) and the tp group sits on scale-up.
CLUSTER = {"devices_per_node": 4, "nodes_per_domain": 2,
           "links": {"scale_up": {"GBps": 100, "latency_us": 1, "efficiency": 1.0},
                     "domain": {"GBps": 50, "latency_us": 2, "efficiency": 1.0},
                     "scale_out": {"GBps": 10, "latency_us": 5, "efficiency": 0.5}}}
# The hidden state of one microbatch: 1024 tokens x 1024 x 2 bytes = 2 MiB; each of
# the 4 tp ranks sends a quarter, 524,288 bytes: 2 us + 524288 / 50e9 s.
SEND_MS = (2e-6 + 524288 / 50e9) * 1e3  # 0.01248576 ms
# The receiver's all-gather of 2 MiB over 4 ranks: NCCL's base latency (8.4 us, the a100's
# dgx-a100 cluster's, which these links override) + 3 steps of 1 us + 3/4 x 2 MiB / 100e9.
GATHER_MS = (8.4e-6 + 3e-6 + 0.75 * 2097152 / 100e9) * 1e3  # 0.02712864 ms


def _doc(p2p_overlap: bool) -> dict:
    return {"model": {"hidden": 1024, "layers": 2, "heads": 16, "seq_len": 1024, "vocab": 1024},
            "device": "a100", "cluster": CLUSTER, "parallel": {"tp": 4, "p2p_overlap": p2p_overlap}}


def _ops(term: str, doc: dict) -> dict:
    return {op[:4]: (d, s, e) for op, d, s, e in evaluate(term, doc).timeline.rows()}


def test_what_an_exchange_adds_to_the_ops_at_its_ends():
    blocking = p2p_extras(2, [0, 1], parse_workload(_doc(False)), 2)
    assert blocking["F"] == pytest.approx([SEND_MS, GATHER_MS])  # chunk 0 sends, chunk 1 gathers
    assert blocking["B"] == pytest.approx([GATHER_MS, SEND_MS])  # and back
    assert blocking["W"] == [0.0, 0.0]
    overlapped = p2p_extras(2, [0, 1], parse_workload(_doc(True)), 2)
    assert overlapped["F"] == pytest.approx([0.0, GATHER_MS])
    assert p2p_extras(2, [0, 0], parse_workload(_doc(False)), 1) is None  # one device: no exchange


def test_a_blocking_send_holds_the_sender_and_the_receiver_starts_when_it_ends():
    term = "1f1b(p=2, m=2)"
    free, held = _ops(term, _doc(True)), _ops(term, _doc(False))
    f0 = free[("llm", "F", 0, 0)]
    # Non-blocking: device 0 starts its next forward as soon as its first ends; the
    # receiver waits for the transfer.
    assert free[("llm", "F", 0, 1)][1] == pytest.approx(f0[2])
    assert free[("llm", "F", 1, 0)][1] == pytest.approx(f0[2] + SEND_MS)
    # Blocking: the first forward lasts SEND_MS longer and the receiver starts at its end.
    h0 = held[("llm", "F", 0, 0)]
    assert h0[2] - h0[1] == pytest.approx(f0[2] - f0[1] + SEND_MS)
    assert held[("llm", "F", 0, 1)][1] == pytest.approx(h0[2])
    assert held[("llm", "F", 1, 0)][1] == pytest.approx(h0[2])


def test_each_hop_is_priced_on_the_link_between_its_two_stages():
    # tp=2, pp=4 on 4-device nodes: stages 0 and 1 share node 0, stages 2 and 3 node 1,
    # so hop 0->1 and 2->3 stay on scale-up and hop 1->2 crosses the domain link.
    doc = {**_doc(True), "parallel": {"tp": 2}}
    doc["model"] = {**doc["model"], "layers": 4}
    wl = parse_workload(doc)
    assert [wl.step.stage_link(4, a, a + 1).name for a in range(3)] == ["scale_up", "domain", "scale_up"]
    # Half of 2 MiB per tp rank: 1 us + 1048576 / 100e9 s inside the node, 2 us + 1048576 / 50e9 across.
    inside, across = (1e-6 + 1048576 / 100e9) * 1e3, (2e-6 + 1048576 / 50e9) * 1e3
    ops = _ops("1f1b(p=4, m=4)", doc)
    lags = [ops[("llm", "F", c, 0)][1] - ops[("llm", "F", c - 1, 0)][2] for c in (1, 2, 3)]
    assert lags == pytest.approx([inside, across, inside])
    # The backward comes back over the same links.
    back = [ops[("llm", "BW", c - 1, 0)][1] - ops[("llm", "BW", c, 0)][2] for c in (3, 2, 1)]
    assert back == pytest.approx([inside, across, inside])
