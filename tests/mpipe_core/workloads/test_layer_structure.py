"""The layer as Megatron-LM runs it (issue 40), each item against a figure
computed by hand: the backward tp collectives behind their partner GEMMs
(and all exposed with 2021's setting), SP's re-gather of the saved input, the
memory-bound kernels' own bytes at their own efficiency, the optimizer's
bytes, NCCL's ring latency, 2021's unfused gradient accumulation; and the
laws that a higher efficiency never lengthens a step."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mpipe_core.api import evaluate
from mpipe_core.workloads.cluster import group_link, parse_cluster, place
from mpipe_core.workloads.collectives import all_reduce
from mpipe_core.workloads.transformer_cost import LayerShape, memory_bytes
from mpipe_core.workloads.workload import parse_workload

US = 1e-6
# A device whose GEMMs are exactly FLOP-bound at 50 TFLOP/s (tile 1x1 on one compute
# unit: no quantization; HBM so fast that no GEMM is byte-bound) and whose memory-bound
# kernels run at memory_efficiency x 1000 TB/s.
DEVICE = {"peak_tflops": 100, "efficiency": 0.5, "gemm_efficiency": 0.5, "attention_efficiency": 0.5,
          "hbm_TBps": 1000, "hbm_efficiency": 1.0, "memory_efficiency": 1.0, "compute_units": 1,
          "tile": [1, 1], "link_gbps": 10, "memory": 80}
GEMM = 100e12 * 0.5
# tp=2 on one node: 10 GB/s, 1 us per hop, no base latency.
CLUSTER = {"devices_per_node": 8, "collective_latency_us": 0,
           "links": {"scale_up": {"GBps": 10, "latency_us": 1, "efficiency": 1.0},
                     "scale_out": {"GBps": 10, "latency_us": 1, "efficiency": 1.0}}}
MODEL = {"hidden": 1024, "layers": 2, "heads": 8, "seq_len": 1024, "vocab": 1024}
S = 1024 * 1024 * 2  # one layer's activation: 1024 tokens x 1024 x 2 bytes
AR = 2 * US + S / 10e9  # a ring all-reduce over 2 ranks: 2 steps, each rank moves S
HALF = 1 * US + S / 2 / 10e9  # an all-gather or reduce-scatter over 2 ranks
# The column-parallel GEMMs at tp=2, 1024 tokens: QKV (n = 3 x 1024 / 2, k = 1024) and MLP up
# (n = 4096 / 2); their weight and input gradients have the forward's FLOPs.
QKV = 2 * 1024 * 1536 * 1024 / GEMM  # 64.4 us
UP = 2 * 1024 * 2048 * 1024 / GEMM  # 85.9 us


def _step(**parallel):
    doc = {"model": MODEL, "device": DEVICE, "cluster": CLUSTER, "parallel": {"tp": 2, **parallel}}
    return parse_workload(doc).step


def test_the_backward_all_reduces_hide_behind_their_weight_gradient_gemms():
    step = _step()
    # exposed = max(0, all-reduce - partner): 211.7 - 64.4 and 211.7 - 85.9 us, counted with
    # the weight gradient (W) they hide behind
    assert AR == pytest.approx(211.7152 * US)
    assert step.tp_layer == pytest.approx((2 * AR, 0.0, (AR - QKV) + (AR - UP)))  # the forward's have no partner
    # Megatron-LM 2021 waited for each: both in full, in the input gradient (B) that issues them
    assert _step(tp_backward_overlap=False).tp_layer == pytest.approx((2 * AR, 2 * AR, 0.0))


def test_a_fast_link_hides_the_backward_all_reduce_entirely():
    fast = {**CLUSTER, "links": {"scale_up": {"GBps": 1000, "latency_us": 1, "efficiency": 1.0},
                                 "scale_out": {"GBps": 10, "latency_us": 1, "efficiency": 1.0}}}
    doc = {"model": MODEL, "device": DEVICE, "cluster": fast, "parallel": {"tp": 2}}
    assert 2 * US + S / 1000e9 < QKV  # 4.1 us against 64.4
    assert parse_workload(doc).step.tp_layer[1:] == (0.0, 0.0)


def test_sequence_parallel_backward_gathers_dy_exposed_and_the_input_again_behind_dgrad():
    step = _step(sp=True)
    # per block: all-gather dY in full; the re-gather of the saved input against the column
    # GEMM's input gradient (B); the reduce-scatter of dX against its weight gradient (W)
    assert HALF - UP > 0  # 105.9 us against 85.9: each partly exposed
    assert step.tp_layer[1] == pytest.approx(2 * HALF + (HALF - QKV) + (HALF - UP))
    assert step.tp_layer[2] == pytest.approx((HALF - QKV) + (HALF - UP))
    backward = [(k, c.kind) for k, c in step.layer_collectives if k in "BW"]
    # 2 all-gathers more than the forward: the re-gathers
    assert backward == [("B", "all-gather")] * 4 + [("W", "reduce-scatter")] * 2
    assert _step(sp=True, tp_backward_overlap=False).tp_layer[1:] == pytest.approx((6 * HALF, 0.0))


def test_the_re_gathers_are_drawn_on_the_backwards_comm_timeline():
    doc = {"model": MODEL, "device": DEVICE, "cluster": CLUSTER, "parallel": {"tp": 2, "sp": True}}
    ev = evaluate("1f1b(p=2, m=2)", doc)
    slices = [c for c in ev.comm if str(c.op) == "llm:0BW0" and c.group == "tp"]
    counts = {c.collective: c.count for c in slices}
    # chunk 0 holds 1 layer: 2 all-gathers of dY + 2 re-gathers of the input, 2 reduce-scatters
    assert counts == {"all-gather": 4, "reduce-scatter": 2}
    assert sum(c.exposed for c in slices) == pytest.approx(sum(ev.workload.step.tp_layer[1:]))


def test_the_memory_bound_kernels_own_bytes_by_hand():
    shape = LayerShape(1, 1024, 1024, 8, 8, 4096, tp=2, flash=False)
    hidden, qkv, up, context, scores = 1024 * 1024, 1024 * 1536, 1024 * 2048, 1024 * 512, 1024 * 1024 * 4
    fwd, bwd = memory_bytes(shape)
    # forward: norms + bias-dropout-adds 22 B, QKV bias add 4, bias-GeLU 4, softmax + dropout 9, permute 4
    assert fwd == 22 * hidden + 4 * qkv + 4 * up + 9 * scores + 4 * context
    # backward: 46 B per hidden element (not 2 x 22), QKV bias gradient 2, GeLU + its bias 8,
    # softmax + dropout 11 per score (not 18), permute 4
    assert bwd == 46 * hidden + 2 * qkv + 8 * up + 11 * scores + 4 * context
    sp_fwd, sp_bwd = memory_bytes(LayerShape(1, 1024, 1024, 8, 8, 4096, tp=2, sp=True, flash=False))
    assert (fwd - sp_fwd, bwd - sp_bwd) == (22 * hidden / 2, 46 * hidden / 2)  # only the hidden part splits


def test_memory_bound_kernels_run_at_memory_efficiency_not_the_gemms():
    slow = {**DEVICE, "memory_efficiency": 0.25}
    a = parse_workload({"model": MODEL, "device": DEVICE, "cluster": CLUSTER, "parallel": {"tp": 2}})
    b = parse_workload({"model": MODEL, "device": slow, "cluster": CLUSTER, "parallel": {"tp": 2}})
    fwd, _ = memory_bytes(LayerShape(1, 1024, 1024, 8, 8, 4096, tp=2))
    # 1000 TB/s x 1 vs x 0.25: only the kernels' bytes slow down (GEMMs stay FLOP-bound)
    assert (b.llm.f - a.llm.f) * 1e-3 == pytest.approx(fwd / 250e12 - fwd / 1000e12)


def test_without_gradient_accumulation_fusion_a_hook_adds_each_weight_gradient():
    fused, unfused = _step(), _step(grad_accumulation_fusion=False)
    a = parse_workload({"model": MODEL, "device": DEVICE, "cluster": CLUSTER, "parallel": {"tp": 2}})
    b = parse_workload({"model": MODEL, "device": DEVICE, "cluster": CLUSTER,
                        "parallel": {"tp": 2, "grad_accumulation_fusion": False}})
    weights = 1024 * 1536 + 1024 * 512 + 1024 * 2048 + 2048 * 1024  # per device at tp=2
    assert (b.llm.w - a.llm.w) * 1e-3 == pytest.approx(10 * weights / 1000e12)  # read 2 + 4, write 4
    # the head's weight gradient too: 1024 x 1024 / 2 weights of the vocab-parallel logits
    assert (b.llm.head["W"] - a.llm.head["W"]) * 1e-3 == pytest.approx(10 * 1024 * 512 / 1000e12)
    assert fused.layer_flops == unfused.layer_flops


def test_the_optimizer_moves_46_bytes_per_updated_and_4_per_held_parameter():
    for distributed in (False, True):
        doc = {"model": MODEL, "device": DEVICE, "cluster": CLUSTER,
               "parallel": {"tp": 2, "dp": 2, "distributed_optimizer": distributed}}
        ev = evaluate("1f1b(p=2, m=2)", doc)
        for dev in ev.step.devices:
            updated = dev.params / (2 if distributed else 1)
            assert dev.optimizer == pytest.approx((46 * updated + 4 * dev.params) / 1000e12)


def test_a_ring_over_two_nodes_pays_two_inter_node_hops_and_a_base():
    cluster = parse_cluster({"devices_per_node": 4, "collective_latency_us": 3,
                             "links": {"scale_up": {"GBps": 100, "latency_us": 1, "efficiency": 1.0},
                                       "scale_out": {"GBps": 10, "latency_us": 5, "efficiency": 0.5}}})
    link = group_link(cluster, place(cluster, 1, 1, 8, 1), "dp")  # 4 ranks on each of 2 nodes
    assert (link.nodes, link.inner_latency_us, link.base_latency_us) == (2, 1, 3)
    c = all_reduce(8, 8e6, link)
    # 14 steps: 2 (N - 1) = 2 between nodes at 5 us, 12 inside at 1 us, plus the base;
    # bandwidth 4 NICs x 10 GB/s x 0.5
    assert c.seconds == pytest.approx((3 + 12 * 1 + 2 * 5) * US + 2 * 7 / 8 * 8e6 / 20e9)
    inside = group_link(cluster, place(cluster, 1, 1, 4, 1), "dp")
    assert all_reduce(4, 8e6, inside).seconds == pytest.approx((3 + 6 * 1) * US + 2 * 3 / 4 * 8e6 / 100e9)


EFFICIENCIES = ("gemm_efficiency", "memory_efficiency", "attention_efficiency", "hbm_efficiency")


@settings(max_examples=25, deadline=None)
@given(key=st.sampled_from(EFFICIENCIES), low=st.floats(0.05, 0.95), up=st.floats(1.0, 2.0),
       sp=st.booleans(), overlap=st.booleans(), term=st.sampled_from(["1f1b(p=2, m=4)", "zbv(p=2, m=4)"]))
def test_law_a_higher_efficiency_never_lengthens_a_step(key, low, up, sp, overlap, term):
    def step_time(value: float) -> float:
        doc = {"model": {**MODEL, "layers": 4}, "device": {"preset": "a100", key: value},
               "cluster": "dgx-a100",
               "parallel": {"tp": 2, "dp": 2, "sp": sp, "tp_backward_overlap": overlap,
                            "flash_attention": False}}
        return evaluate(term, doc).step.step_time_s

    assert step_time(min(1.0, low * up)) <= step_time(low) * (1 + 1e-12)


def test_a_tied_embeddings_gradient_is_all_reduced_between_the_first_and_last_stage():
    def run(tied: bool):
        doc = {"model": {**MODEL, "tied_embeddings": tied}, "device": DEVICE, "cluster": CLUSTER,
               "parallel": {"tp": 1}}
        return evaluate("1f1b(p=2, m=2)", doc).step

    untied, tied = run(False), run(True)
    # 1024 x 1024 fp32 gradients over the 2 stages: 2 hops of 1 us, each rank moves the 4 MiB once
    ar = 2 * US + 4 * 1024 * 1024 / 10e9
    for before, after in zip(untied.devices, tied.devices):
        assert after.sync_exposed - before.sync_exposed == pytest.approx(ar)
        assert after.sync[-1].kind == "all-reduce" and after.sync[-1].ranks == 2
    assert tied.step_time_s - untied.step_time_s == pytest.approx(ar)
    one_stage = {"model": {**MODEL, "tied_embeddings": True}, "device": DEVICE, "cluster": CLUSTER}
    # both ends on one device: only its (single-rank) data-parallel sync
    assert [c.ranks for c in evaluate("1f1b(p=1, m=2)", one_stage).step.devices[0].sync] == [1]


def test_the_overlapped_gradient_sync_runs_through_the_cooldowns_idle_gaps():
    slow = {**CLUSTER, "devices_per_node": 2}  # dp crosses nodes: 10 GB/s
    doc = {"model": {**MODEL, "layers": 8}, "device": DEVICE, "cluster": slow,
           "parallel": {"tp": 1, "dp": 2, "overlap_grad_reduce": True}}
    ev = evaluate("interleaved(p=2, m=4, v=2)", doc)
    step, unit = ev.step, 1e-3
    for d, dev in enumerate(step.devices):
        backward = sorted((s, e) for op, dd, s, e in ev.timeline.rows()
                          if dd == d and op[0] == "llm" and op[1] in ("B", "BW", "W") and op[3] == 3)
        (s, e), gaps_and_all = backward[0], dev.end - backward[0][0] * unit
        reduce = dev.sync[0].seconds
        # the chunks hold < 40M parameters: the first bucket is ready when that op ends
        last_bucket = reduce * min(1.0, 40e6 / dev.params)
        assert dev.sync_exposed == pytest.approx(max(last_bucket, reduce - (dev.end - e * unit)))
        busy = sum(ee - ss for ss, ee in backward) * unit
        assert dev.end - e * unit > busy - (e - s) * unit  # the window holds idle time, not only backward
        assert gaps_and_all > busy


def test_a_slower_scale_up_link_never_shortens_a_ring_across_nodes():
    def ring(scale_up_gbps: float) -> float:
        cluster = parse_cluster({"devices_per_node": 4,
                                 "links": {"scale_up": {"GBps": scale_up_gbps, "latency_us": 1, "efficiency": 1.0},
                                           "scale_out": {"GBps": 10, "latency_us": 5, "efficiency": 1.0}}})
        return all_reduce(8, 1e3, group_link(cluster, place(cluster, 1, 1, 8, 1), "dp")).seconds

    # at 30 GB/s the node's own link is the slowest (4 NICs give 40): the bandwidth moves to it, but the
    # 2 hops between nodes still pay the network's 5 us (not the node's 1 us)
    assert ring(30) == pytest.approx((12 * 1 + 2 * 5) * US + 2 * 7 / 8 * 1e3 / 30e9)
    assert ring(30) >= ring(100)
