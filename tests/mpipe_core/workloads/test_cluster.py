"""The cluster model (issue 29): collectives on a two-level cluster, a layer's
TP traffic, the DP sync with and without overlap, FLOPs by hand, MFU by hand,
the encoder's fp32 gradient bytes, three laws, and the bad-input messages."""
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from mpipe_core.api import evaluate
from mpipe_core.errors import WorkloadError
from mpipe_core.workloads import layer_comm
from mpipe_core.workloads.cluster import group_link, parse_cluster, place
from mpipe_core.workloads.collectives import all_gather, all_reduce, reduce_scatter
from mpipe_core.workloads.transformer_cost import LayerShape, layer_flops
from mpipe_core.workloads.workload import parse_workload, preset, with_parallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "mpipe_cli"))
from cli_runner import run_cli  # noqa: E402

# Two levels of scale-up (4 devices per node, 2 nodes per domain) and a scale-out network.
TWO_LEVEL = {"devices_per_node": 4, "nodes_per_domain": 2,
             "links": {"scale_up": {"GBps": 100, "latency_us": 1, "efficiency": 1.0},
                       "domain": {"GBps": 50, "latency_us": 2, "efficiency": 1.0},
                       "scale_out": {"GBps": 10, "latency_us": 5, "efficiency": 0.5}}}
GB = 1e9


def _link(tp, dp, dim):
    cluster = parse_cluster(TWO_LEVEL)
    return group_link(cluster, place(cluster, tp, 1, dp, 1), dim)


def test_each_collective_inside_a_node_across_nodes_and_across_domains():
    inside = _link(4, 4, "tp")  # ranks 0-3: one node
    assert inside.name == "scale_up"
    assert all_reduce(4, GB, inside).seconds == pytest.approx(6 * 1e-6 + 1.5 * GB / 100e9)  # 0.015006 s
    assert all_gather(4, GB, inside).seconds == pytest.approx(3 * 1e-6 + 0.75 * GB / 100e9)
    assert reduce_scatter(4, GB, inside).seconds == pytest.approx(3 * 1e-6 + 0.75 * GB / 100e9)
    across_nodes = _link(4, 2, "dp")  # ranks 0 and 4: nodes 0 and 1 of domain 0
    assert across_nodes.name == "domain"
    assert all_reduce(2, GB, across_nodes).seconds == pytest.approx(2 * 2e-6 + 1.0 * GB / 50e9)  # 0.020004 s
    across_domains = _link(4, 4, "dp")  # ranks 0, 4, 8, 12: two domains; 10 GB/s at 50%
    assert across_domains.name == "scale_out"
    assert all_reduce(4, GB, across_domains).seconds == pytest.approx(6 * 5e-6 + 1.5 * GB / 5e9)  # 0.30003 s
    # A group with 4 ranks on each of its nodes runs a ring through each rank's link:
    # 4 x 50 GB/s between the nodes, capped by the 100 GB/s inside them.
    whole_nodes = _link(1, 8, "dp")
    assert (whole_nodes.name, whole_nodes.gbps) == ("domain", 100)


def test_a_tensor_parallel_group_spanning_nodes_is_priced_on_the_slower_link_and_noted():
    cluster = parse_cluster(TWO_LEVEL)
    placement = place(cluster, 8, 1, 1, 1)
    assert group_link(cluster, placement, "tp").name == "domain"
    assert placement.notes == ("the tensor-parallel group of 8 spans nodes (4 devices per node): priced on the "
                               "domain link",)


def test_a_layers_tensor_parallel_traffic_with_and_without_sequence_parallelism():
    link = _link(4, 1, "tp")
    size = 1 * 1024 * 1024 * 2  # b * s * h * 2 bytes: 2 MiB
    plain = layer_comm.tp_layer(LayerShape(1, 1024, 1024, 8, 8, 4096, tp=4), link)
    # the backward all-reduces hide behind the weight gradient: counted with W
    assert [c.kind for c in plain["F"]] == ["all-reduce", "all-reduce"] == [c.kind for c in plain["W"]]
    assert plain["B"] == ()
    assert [c.moved_bytes for c in plain["F"]] == [1.5 * size] * 2  # 2(n-1)/n S each
    sp = layer_comm.tp_layer(LayerShape(1, 1024, 1024, 8, 8, 4096, tp=4, sp=True), link)
    assert [c.kind for c in sp["F"]] == ["all-gather", "reduce-scatter"] * 2
    assert [c.moved_bytes for c in sp["F"]] == [0.75 * size] * 4
    # the same bytes and latency steps per layer either way: 2 x (6 us + 1.5 S / 100 GB/s)
    expected = 2 * (6e-6 + 1.5 * size / 100e9)
    assert layer_comm.seconds(plain)["F"] == pytest.approx(expected)
    # backward, per block: dY gathered, the saved input re-gathered (B), dX reduce-scattered (W)
    assert [c.kind for c in sp["B"]] == ["all-gather"] * 4 and [c.kind for c in sp["W"]] == ["reduce-scatter"] * 2
    assert sum(layer_comm.seconds(sp)[k] for k in "BW") == pytest.approx(1.5 * expected)


def test_flops_of_llama2_7b_and_internlm2_20b_by_hand():
    # Llama-2-7B, one sequence of 4096: dense 8bsh^2 + 6bshf = 549,755,813,888 + 1,108,101,562,368;
    # the attention core 4bs^2h = 274,877,906,944 forward, twice that backward.
    f, b, w = layer_flops(LayerShape(1, 4096, 4096, 32, 32, 11008, gated=True))
    assert (f, b, w) == (1_932_735_283_200, 2_207_613_190_144, 1_657_857_376_256)
    # InternLM2-20B (8 of 48 heads for K/V): 4bsh^2 (1 + 8/48) = 721,554,505,728, 6bshf = 2,473,901,162,496,
    # core 412,316,860,416.
    f, b, w = layer_flops(LayerShape(1, 4096, 6144, 48, 8, 16384, gated=True))
    assert (f, b, w) == (3_607_772_528_640, 4_020_089_389_056, 3_195_455_668_224)


def test_the_heads_cost_sits_on_the_last_chunk_only():
    wl = preset("llama2-7b")  # no cluster: FLOPs at 312 TFLOP/s x 0.5
    table = wl.llm.chunk_cost_table(4)
    head = 2 * 4096 * 4096 * 32000 / (312e12 * 0.5 / 1e3)  # 2bshV, in ms: 6.883
    assert table["F"][3] - table["F"][0] == pytest.approx(head)
    assert table["F"][0] == table["F"][1] == table["F"][2]
    assert table["W"][3] - table["W"][2] == pytest.approx(head)


def test_the_encoder_gradient_all_reduce_moves_fp32_gradients():
    wl = with_parallel(preset("optimus-vit22b-gpt175b"), {"tp": 8})
    vit = wl.encoder("vision")
    params = 48 * (4 * 6144 ** 2 + 2 * 6144 * 24576) / 8  # ViT-22B's layers over tp = gcd(8, 48) = 8
    assert (vit.param_bytes, vit.grad_bytes) == (2 * params, 4 * params)
    ev = evaluate("colocated(1f1b(p=8, m=16))", wl)
    ar = [e - s for op, d, s, e in ev.timeline.rows() if op.kind == "AR"]
    # ring over 8 devices at 25 GB/s, 10 us per step: 14 x (0.01 + 4 params / 8 / 25e6 bytes per ms)
    assert ar[0] == pytest.approx(14 * (0.01 + 4 * params / 8 / 25e6))  # 761.2 ms (2 bytes gave 380.6)
    assert ar[0] == pytest.approx(761.2, abs=0.1)


def _published(overlap=False, tp_overlap=False, links=None):
    doc = {"model": {"hidden": 2304, "layers": 24, "heads": 24, "seq_len": 2048, "vocab": 51200,
                     "microbatch_size": 16},
           "device": "a100", "cluster": {"preset": "dgx-a100", **({"links": links} if links else {})},
           "parallel": {"tp": 1, "dp": 32, "flash_attention": False, "overlap_grad_reduce": overlap,
                        "tp_comm_overlap": tp_overlap}}
    return parse_workload(doc)


def test_mfu_of_a_published_configuration_from_its_step_time_by_hand():
    # Narayanan et al. 2021 Table 1, first row: 1.7B on 32 A100s, global batch 512.
    ev = evaluate("recompute(1f1b(p=1, m=1), mode=full)", _published())
    step = ev.step
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    model = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))  # fwd + bwd, no recompute
    hardware = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))  # the paper's Eq. 3
    assert step.devices_total == 32
    assert step.mfu == pytest.approx(model / (step.step_time_s * 32 * 312e12))
    assert step.hfu == pytest.approx(hardware / (step.step_time_s * 32 * 312e12))
    assert step.samples_per_s == pytest.approx(512 / step.step_time_s)
    assert step.tokens_per_s == pytest.approx(512 * 2048 / step.step_time_s)


def test_dp_exposed_time_with_overlap_off_and_on():
    off = evaluate("recompute(1f1b(p=1, m=1), mode=full)", _published()).step
    params = 24 * 12 * 2304 ** 2 + 2 * 51200 * 2304  # layers, embedding and head on the one stage
    link = _published().step.gradient_link(1)
    assert link.name == "scale_out" and link.gbps == 200  # 8 ranks per node: 8 x 25 GB/s
    expected = all_reduce(32, 4 * params, link).seconds
    assert off.breakdown["dp_comm"] == pytest.approx(expected)
    ev = evaluate("recompute(1f1b(p=1, m=1), mode=full)", _published(overlap=True))
    window = sum((e - s) * 1e-3 for op, d, s, e in ev.timeline.rows() if op.kind in ("B", "BW", "W"))
    assert ev.step.breakdown["dp_comm"] == pytest.approx(max(expected * 40e6 / params, expected - window))
    assert ev.step.breakdown["dp_comm"] < off.breakdown["dp_comm"]


def test_the_step_time_is_the_sum_of_its_breakdown_on_the_critical_device():
    step = evaluate("recompute(1f1b(p=1, m=1), mode=full)", _published()).step
    parts = ("compute", "tp_comm", "cp_comm", "encoder_comm", "bubble", "dp_comm", "optimizer")
    assert sum(step.breakdown[k] for k in parts) == pytest.approx(step.step_time_s)


LLAMA = {"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100"}


@settings(max_examples=12, deadline=None)
@given(level=st.sampled_from(["scale_up", "domain", "scale_out"]), factor=st.floats(0.05, 1.0),
       tp=st.sampled_from([1, 2, 8]), dp=st.sampled_from([1, 2, 4]))
def test_law_lowering_a_links_bandwidth_never_shortens_the_step(level, factor, tp, dp):
    base = parse_cluster("dgx-a100").link(level).gbps
    doc = {**LLAMA, "parallel": {"tp": tp, "dp": dp, "sp": tp > 1}}
    slow = {**doc, "cluster": {"preset": "dgx-a100", "links": {level: {"GBps": base * factor}}}}
    term = "1f1b(p=2, m=4)"
    assert evaluate(term, slow).step.step_time_s >= evaluate(term, doc).step.step_time_s * (1 - 1e-12)


@settings(max_examples=8, deadline=None)
@given(dp=st.sampled_from([1, 2, 4]), more=st.sampled_from([2, 4]))
def test_law_more_data_parallel_devices_at_a_fixed_global_batch_never_raise_a_devices_compute(dp, more):
    batch = 32  # sequences per step: m = batch / dp microbatches per pipeline
    def compute(d):
        ev = evaluate(f"1f1b(p=2, m={batch // d})", {**LLAMA, "parallel": {"dp": d}})
        return ev.step.breakdown["compute"]
    assert compute(dp * more) <= compute(dp) * (1 + 1e-12)


@settings(max_examples=8, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), m=st.integers(2, 6), cluster=st.booleans())
def test_law_mfu_times_step_time_devices_and_peak_is_the_model_flops(tp, m, cluster):
    doc = {"model": "llama2-7b", "device": "a100", "parallel": {"tp": tp, "dp": 2}}
    if cluster:
        doc["cluster"] = "dgx-a100"
    step = evaluate(f"1f1b(p=2, m={m})", doc).step
    layer = layer_flops(LayerShape(1, 4096, 4096, 32, 32, 11008, gated=True))
    model = 2 * m * (32 * sum(layer) + 3 * 2 * 4096 * 4096 * 32000)  # dp x m x (layers + head)
    assert step.mfu * step.step_time_s * step.devices_total * 312e12 == pytest.approx(model)


def test_explicit_workloads_have_no_step_figures_and_keep_their_json():
    summary = evaluate("1f1b(p=2, m=4)").summary()
    assert "step_time_s" not in summary and "mfu" not in summary


@pytest.mark.parametrize("doc, message", [
    ({**LLAMA, "cluster": "dgx-z100"},
     "cluster: unknown preset 'dgx-z100' (known: atlas-910b, cloudmatrix384, dgx-a100, dgx-h100)"),
    ({**LLAMA, "cluster": {"preset": "dgx-a100", "links": {"scale_out": {"GBps": 0}}}},
     "cluster.links.scale_out.GBps: expected a positive finite number, got 0"),
    ({**LLAMA, "cluster": {"preset": "dgx-a100", "links": {"scale_up": {"efficiency": 1.5}}}},
     "cluster.links.scale_up.efficiency: expected a fraction in (0, 1], got 1.5"),
    ({**LLAMA, "cluster": {"preset": "dgx-a100", "order": "tp-dp-pp"}},
     "cluster.order: expected tp, cp, dp and pp once each joined by '-' (e.g. \"tp-cp-dp-pp\"), got 'tp-dp-pp'"),
    ({**LLAMA, "parallel": {"cp": 3}}, "parallel.cp: 3 does not divide the sequence length (4096 tokens)"),
])
def test_bad_cluster_input_is_one_error_line(doc, message, tmp_path):
    with pytest.raises(WorkloadError) as info:
        parse_workload(doc)
    assert info.value.message == message
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    out = run_cli(["eval", "1f1b(p=2, m=2)", "-w", str(path)])
    assert (out.code, out.traceback, out.error_lines) == (2, None, [f"error: {path}: {message}"])


def test_a_layout_beyond_a_node_needs_whole_nodes(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({**LLAMA, "parallel": {"tp": 2, "dp": 3}}))
    out = run_cli(["eval", "1f1b(p=2, m=2)", "-w", str(path), "--json"])
    assert (out.code, out.traceback) == (2, None)
    assert out.error_lines == ["error: cluster: 12 devices (tp·cp·dp·pp = 2·1·3·2) is not a multiple of "
                               "devices_per_node (8): a layout beyond one node needs whole nodes"]


def test_a_layout_beyond_the_clusters_declared_nodes_is_refused(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({**LLAMA, "cluster": {"preset": "dgx-a100", "nodes": 1}, "parallel": {"tp": 8}}))
    out = run_cli(["eval", "1f1b(p=2, m=2)", "-w", str(path)])
    assert (out.code, out.traceback) == (2, None)
    assert out.error_lines == ["error: cluster: 16 devices (tp·cp·dp·pp = 8·1·1·2) do not fit the cluster's 1 node "
                               "of 8 (8 devices)"]
    path.write_text(json.dumps({**LLAMA, "cluster": {"preset": "dgx-a100", "nodes": 2}, "parallel": {"tp": 8}}))
    assert run_cli(["eval", "1f1b(p=2, m=2)", "-w", str(path)]).code == 0
