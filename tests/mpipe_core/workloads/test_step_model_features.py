"""The cluster model on layouts that have each feature (cp > 1, grouped-query
attention, several microbatches, a group straddling nodes, sequence parallelism,
full recompute, the distributed optimizer): each test computes its expectation
from the documented formula at a small setting, so that a plausible wrong formula
(the mutation named in its docstring) fails it."""
from __future__ import annotations

import pytest

from mpipe_core.api import evaluate
from mpipe_core.simulation.step_figures import GRAD_ZERO_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM
from mpipe_core.workloads import layer_comm
from mpipe_core.workloads.cluster import LinkClass, group_link, parse_cluster, place
from mpipe_core.workloads.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, SEND
from mpipe_core.workloads.transformer_cost import DeviceModel, LayerShape, layer_flops, layer_times
from mpipe_core.workloads.workload import parse_workload

LINK = LinkClass("scale_up", 100.0, 1.0)
SMALL = {"hidden": 512, "layers": 4, "heads": 8, "kv_heads": 2, "seq_len": 256, "vocab": 1024, "ffn": 2048}


def test_a_group_that_crosses_nodes_for_some_of_its_ranks_is_priced_on_the_outer_link():
    """Mutation: `cluster._outermost` reversed (the innermost level crossed wins)."""
    # dp groups of 3 on nodes of 8: ranks 0-2 and 3-5 stay in node 0, 6-8 straddles nodes 0 and 1.
    placement = place(parse_cluster("dgx-a100"), 1, 1, 3, 8)
    assert placement.group_level["dp"] == "scale_out"
    assert group_link(parse_cluster("dgx-a100"), placement, "dp").name == "scale_out"  # the network, not NVLink


def test_sequence_parallel_element_wise_work_is_split_tp_ways_once():
    """Mutation: sequence parallelism divides the norm and dropout-add work by tp twice.

    Only that element-wise work depends on sp in the layer's compute, and it is 1/t of
    the hidden state with sp: time(sp) - time(no sp) = K (1/t - 1) for the same K at any
    t, so the difference at t = 4 is 1.5 times that at t = 2 ((1/4 - 1) / (1/2 - 1))."""
    dev = DeviceModel(peak_flops=312e12, hbm_bytes_per_s=1.8e12, gemm_max_efficiency=0.8, compute_units=108)

    def saving(t: int, kind: str) -> float:
        shape = dict(b=1, s=1024, h=1024, heads=8, kv_heads=8, ffn=4096, tp=t)
        return getattr(layer_times(LayerShape(**shape, sp=True), dev), kind) - \
            getattr(layer_times(LayerShape(**shape, sp=False), dev), kind)

    for kind in ("f", "b"):
        assert saving(2, kind) < 0
        assert saving(4, kind) / saving(2, kind) == pytest.approx(1.5, rel=1e-9)


@pytest.mark.parametrize("tp, cp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_on_an_ideal_device_a_layers_time_is_its_flops_over_the_split_and_peak(tp, cp):
    """Mutation: grouped-query attention ignored in the roofline's QKV GEMM (K and V as wide as Q).

    A device with no tile or wave loss (1x1 tiles, one compute unit), every fraction 1
    and memory for free runs F, B and W at exactly `layer_flops` / (t c peak)."""
    peak = 1e12
    dev = DeviceModel(peak_flops=peak, hbm_bytes_per_s=1e40, gemm_max_efficiency=1.0, compute_units=1,
                      tile=(1, 1), flash_efficiency=1.0)
    shape = LayerShape(1, 256, 512, 8, 2, 2048, True, tp, cp)  # 8 heads, 2 key/value heads, SwiGLU
    times = layer_times(shape, dev)
    f, b, w = layer_flops(shape)
    assert f == 4 * 256 * 512 ** 2 * (1 + 2 / 8) + 6 * 256 * 512 * 2048 + 4 * 256 ** 2 * 512
    assert (times.f, times.b, times.w) == pytest.approx((f / (tp * cp * peak), b / (tp * cp * peak),
                                                         w / (tp * cp * peak)), rel=1e-12)


def test_the_cp_ring_sends_each_ranks_k_and_v_of_its_key_value_heads():
    """Mutation: grouped-query attention ignored in the CP K/V exchange bytes.

    b=1, s=8 tokens over c=2 ranks, h=16 with 4 heads of which 1 key/value head: each
    rank's K and V are 4 tokens x 16/4 wide x 2 bytes = 32 bytes each, 64 a send; c-1 = 1
    send forward, its gradients too backward."""
    sends = layer_comm.cp_layer(LayerShape(1, 8, 16, 4, 1, 64, cp=2), LINK)
    assert [(c.kind, c.buffer_bytes) for c in sends["F"]] == [(SEND, 64.0)]
    assert [(c.kind, c.buffer_bytes) for c in sends["B"]] == [(SEND, 128.0)]


def test_the_sequence_parallel_head_gathers_forward_and_reduce_scatters_backward():
    """Mutation: the sp LM head's forward and backward collectives swapped (same seconds)."""
    head = layer_comm.tp_head(LayerShape(1, 8, 16, 4, 4, 64, tp=2, sp=True), LINK)
    assert [c.kind for c in head["F"]] == [ALL_GATHER]
    assert [c.kind for c in head["B"]] == [REDUCE_SCATTER]
    plain = layer_comm.tp_head(LayerShape(1, 8, 16, 4, 4, 64, tp=2), LINK)
    assert [c.kind for c in plain["F"]] == [] and [c.kind for c in plain["B"]] == [ALL_REDUCE]


def _cp_doc(**parallel) -> dict:
    return {"model": dict(SMALL), "device": "a100", "cluster": "dgx-a100", "parallel": {"cp": 2, **parallel}}


def test_the_cp_ring_hides_behind_the_attention_core():
    """Mutation: the CP K/V ring never hidden behind attention.

    On NVLink the ring of llama-sized blocks is far shorter than the attention core it
    runs beside: it adds nothing to the layer, though it is priced and drawn."""
    step = parse_workload({"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100",
                           "parallel": {"cp": 2}}).step
    sends = [c for kind, c in step.layer_collectives if c.kind == SEND]
    assert sends and all(c.seconds > 0 for c in sends)
    assert step.cp_layer == (0.0, 0.0, 0.0)


def test_devices_total_counts_cp_and_mfu_divides_by_it():
    """Mutation: `devices_total` without cp (MFU cp times too high)."""
    ev = evaluate("1f1b(p=2, m=4)", _cp_doc(tp=2, dp=2))
    step = ev.step
    assert step.devices_total == 2 * 2 * 2 * 2  # tp x cp x dp x pipeline devices
    assert step.mfu == pytest.approx(step.model_flops / (step.step_time_s * 16 * 312e12), rel=1e-12)


def test_the_distributed_optimizer_updates_and_holds_a_dp_cp_share():
    """Mutations: the distributed optimizer's Adam step not divided by dp·cp; its state
    sharded over dp instead of dp·cp.

    Adam moves OPTIMIZER_BYTES_PER_PARAM bytes per parameter it updates, 1/(dp cp) of
    the device's with the distributed optimizer, and every parameter the device holds
    has its gradient buffer zeroed (GRAD_ZERO_BYTES_PER_PARAM); the state per parameter
    is the same for dp=2, cp=2 as for dp=4, cp=1 (both shard it 4 ways)."""
    assert (OPTIMIZER_BYTES_PER_PARAM, GRAD_ZERO_BYTES_PER_PARAM) == (46.0, 4.0)  # the docstring's itemised bytes
    doc = _cp_doc(dp=2, distributed_optimizer=True)
    ev = evaluate("1f1b(p=2, m=4)", doc)
    hbm = ev.workload.step.hbm_bytes_per_s
    for d in ev.step.devices:
        assert d.optimizer == pytest.approx((46 * d.params / 4 + 4 * d.params) / hbm, rel=1e-12)
    four_dp = parse_workload({**doc, "parallel": {"dp": 4, "distributed_optimizer": True}})
    assert ev.workload.llm.static_layer == pytest.approx(four_dp.llm.static_layer, rel=1e-12)
    assert ev.workload.llm.static_layer < parse_workload({**doc, "parallel": {
        "dp": 2, "distributed_optimizer": True}}).llm.static_layer


def test_the_gradient_sync_runs_on_the_slower_of_the_dp_and_cp_links():
    """Mutation: the gradient sync priced on dp's link while cp's is slower.

    Order tp-dp-cp-pp on nodes of 4: a dp group of 4 fills a node, a cp pair spans two."""
    doc = {"model": dict(SMALL), "device": "a100", "parallel": {"dp": 4, "cp": 2},
           "cluster": {"preset": "dgx-a100", "devices_per_node": 4, "order": "tp-dp-cp-pp"}}
    ev = evaluate("1f1b(p=2, m=4)", doc)
    step = ev.workload.step
    placement = step.placement(2)
    assert (placement.group_level["dp"], placement.group_level["cp"]) == ("scale_up", "scale_out")
    assert step.gradient_link(2).name == "scale_out"
    assert {s["link"] for s in ev.step.breakdown["dp_sync"]} == {"scale_out"}


def test_the_gradient_reduction_hides_from_the_last_microbatchs_first_bucket_on():
    """Mutation: the DP overlap window counts every microbatch's backward.

    With overlap_grad_reduce the reduction may run from the moment the device's first
    backward op of the last microbatch has made the first bucket (that op's start + its
    time x 40e6 / its chunk's parameters) to the device's last op's end, beside the
    backward and through the cooldown's idle gaps: exposed = max(last bucket, reduction
    - that window), the last bucket being reduction x 40e6 / the device's parameters.
    One chunk a device, so a chunk's parameters are its device's."""
    doc = {"model": "llama2-7b", "device": "a100", "parallel": {"tp": 8, "dp": 2, "overlap_grad_reduce": True},
           "cluster": {"preset": "dgx-a100", "links": {"scale_out": {"GBps": 2}}}}
    ev = evaluate("1f1b(p=2, m=4)", doc)
    unit = ev.workload.step.seconds_per_unit
    first = {}  # device -> (start, end) of its first backward op of microbatch 3, seconds
    end = {d: 0.0 for d in range(2)}
    for op, d, s, e in ev.timeline.rows():
        end[d] = max(end[d], e * unit)
        if op.kind in ("B", "W", "BW") and op.mb == 3 and (d not in first or s * unit < first[d][0]):
            first[d] = (s * unit, e * unit)
    checked = 0
    for d, dev in enumerate(ev.step.devices):
        reduce = dev.sync[0].seconds
        bucket = reduce * min(1.0, 40e6 / dev.params)
        start, stop = first[d]
        window = end[d] - (start + (stop - start) * min(1.0, 40e6 / dev.params))
        assert dev.sync_parts[0] == pytest.approx(max(bucket, reduce - window), rel=1e-12)
        assert dev.sync_exposed == pytest.approx(sum(dev.sync_parts), rel=1e-12)
        checked += reduce - window > bucket  # the case the window decides
    assert checked


def test_a_fully_recomputed_backward_draws_its_forwards_collectives_too():
    """Mutation: the collectives of fully recomputed forwards missing from the comm timeline.

    llama2-7b on 2 stages: 16 layers a chunk; full recompute adds each layer's forward
    tp collectives to its backward op's."""
    doc = {"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100", "parallel": {"tp": 2}}

    def tp_counts(term: str) -> dict:
        # an op's tp collectives come in a slice of those it overlaps and one of those it adds in full
        ev = evaluate(term, doc)
        counts: dict = {}
        for s in ev.comm:
            if s.op is not None and s.op.kind in ("B", "BW") and s.group == "tp":
                counts[s.op.chunk, s.op.mb] = counts.get((s.op.chunk, s.op.mb), 0) + s.count
        return counts

    forward = sum(1 for kind, c in parse_workload(doc).step.layer_collectives if kind == "F" and c.kind != SEND)
    plain, recomputed = tp_counts("1f1b(p=2, m=2)"), tp_counts("recompute(1f1b(p=2, m=2))")
    assert plain.keys() == recomputed.keys() and len(plain) == 4
    assert all(recomputed[k] - plain[k] == 16 * forward for k in plain)
