"""The memory model: Korthikanti et al.'s activation formulas and Megatron's
static bytes against figures computed by hand, where static memory sits per
device, device capacity, and what `mpipe eval` reports about fitting."""
import contextlib
import io
import json

import pytest

from mpipe_cli.main import main
from mpipe_core.api import evaluate
from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.memory_model import (
    activation_bytes,
    bytes_per_parameter,
    embedding_parameters,
    encoder_tensor_parallel,
    layer_parameters,
)
from mpipe_core.workloads.presets import preset_document
from mpipe_core.workloads.units import human
from mpipe_core.workloads.workload import explicit_dict, parse_workload, preset, with_parallel

# GPT-3 175B (Brown et al. 2020), the paper's own example: s=2048, h=12288, a=96, t=8, b=1.
S, H, A, T = 2048, 12288, 96, 8
SBH = 2048 * 12288  # 25,165,824


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------ activations (Korthikanti et al. 2022)

@pytest.mark.parametrize("t, sp, flash, mode, expected", [
    # no parallelism: sbh(34 + 5as/h); 5as/h = 5 * 96 * 2048 / 12288 = 80
    (1, False, False, "none", SBH * 114),
    # tensor parallel: sbh(10 + 24/t + 5as/(ht)) = sbh(10 + 3 + 10)
    (8, False, False, "none", SBH * 23),
    # tensor + sequence parallel: sbh(34/t + 5as/(ht)) = sbh(4.25 + 10)
    (8, True, False, "none", SBH * 57 // 4),
    # selective recompute: sbh(10 + 24/t); with sequence parallel sbh * 34/t
    (8, False, False, "selective", SBH * 13),
    (8, True, False, "selective", SBH * 34 // 8),
    # full recompute: the layer's input only, 2sbh (/t with sequence parallel)
    (8, False, False, "full", 2 * SBH),
    (8, True, False, "full", 2 * SBH // 8),
    # flash attention drops the 5as/h term: TP + SP is then sbh * 34/t, as selective is
    (8, True, True, "none", SBH * 34 // 8),
    (8, False, True, "none", SBH * 13),
    (1, False, True, "none", SBH * 34),
])
def test_activation_bytes_per_layer_and_microbatch_on_gpt3_175b(t, sp, flash, mode, expected):
    assert activation_bytes(S, 1, H, A, t, sp, flash, mode) == expected


def test_selective_recompute_with_sequence_parallel_is_sbh_34_over_t_in_the_analytic_workload():
    doc = preset_document("gpt3-175b")
    doc["parallel"] = {"tp": 8, "sp": True, "flash_attention": False}
    llm = parse_workload(doc).llm
    assert llm.kept_activation("selective") == 106_954_752 / 1e9  # 2048 * 12288 * 34 / 8 bytes, in GB
    assert llm.kept_activation("full") == 6_291_456 / 1e9
    assert llm.activation == 358_612_992 / 1e9  # sbh(34/8 + 80/8)
    # the microbatch size multiplies b
    doc["model"] = {"preset": "gpt3-175b", "microbatch_size": 2}
    assert parse_workload(doc).llm.kept_activation("selective") == 2 * 106_954_752 / 1e9


# ------------------------------------------------------------------ static memory (Megatron)

def test_bytes_per_parameter_follow_megatron_mixed_precision():
    assert bytes_per_parameter() == 18  # 2 bf16 + 4 fp32 grad + 4 master + 4 + 4 Adam moments
    assert bytes_per_parameter(dp=8, distributed_optimizer=True) == 6 + 12 / 8
    assert bytes_per_parameter(dp=8) == 18  # data parallel alone shards nothing
    assert bytes_per_parameter(trainable=False) == 2


def test_parameter_counts_match_the_published_models():
    # GPT-3 175B: 12h^2 per layer; 96 layers + the token embedding = 174.56B ("175B")
    assert layer_parameters(12288, 49152, 96) == 12 * 12288 ** 2 == 1_811_939_328
    assert 96 * 1_811_939_328 + embedding_parameters(50257, 12288) == 174_563_733_504
    # Llama-2-7B (SwiGLU): 6,738,415,616 published = ours + the 65 RMSNorm weight vectors
    llama = 32 * layer_parameters(4096, 11008, 32, gated_mlp=True) + 2 * embedding_parameters(32000, 4096)
    assert llama == 6_738_149_376 and llama + 65 * 4096 == 6_738_415_616
    # InternLM2-20B (GQA, 8 key/value heads): 19.86B
    internlm = 48 * layer_parameters(6144, 16384, 48, kv_heads=8, gated_mlp=True) \
        + 2 * embedding_parameters(92544, 6144)
    assert internlm == 19_860_553_728


def test_static_memory_per_device_on_gpt3_175b_with_tensor_parallelism():
    doc = preset_document("gpt3-175b")
    doc["parallel"] = {"tp": 8}
    ev = evaluate("1f1b(p=8, m=8)", doc)
    layer = 1_811_939_328 // 8 * 18  # one layer's shard: 226,492,416 parameters x 18 bytes
    vocab = 50257 * 12288 // 8 * 18  # the embedding's (and the head's) shard
    expected = [12 * layer] * 8
    expected[0] += vocab
    expected[-1] += vocab
    assert ev.metrics.static_memory == pytest.approx([x / 1e9 for x in expected], rel=1e-12)
    assert ev.metrics.static_memory[1] == pytest.approx(48.922361856)
    # the distributed optimizer over 8 data-parallel replicas: 6 + 12/8 = 7.5 bytes per parameter
    doc["parallel"] = {"tp": 8, "dp": 8, "distributed_optimizer": True}
    assert evaluate("1f1b(p=8, m=8)", doc).metrics.static_memory[1] == pytest.approx(12 * 226_492_416 * 7.5 / 1e9)


def test_a_frozen_encoder_holds_its_bf16_parameters_only():
    ev = evaluate("1f1b(p=4, m=4)", "llava-7b")  # CLIP ViT-L frozen, fused on chunk 0's device
    vit = 24 * (4 * 1024 ** 2 + 2 * 1024 * 4096)  # 301,989,888 parameters
    llama_layer = layer_parameters(4096, 11008, 32, gated_mlp=True)
    vocab = 32000 * 4096
    assert ev.metrics.static_memory == pytest.approx(
        [(8 * llama_layer + vocab) * 18 / 1e9 + vit * 2 / 1e9, 8 * llama_layer * 18 / 1e9,
         8 * llama_layer * 18 / 1e9, (8 * llama_layer + vocab) * 18 / 1e9], rel=1e-12)


def test_encoder_tensor_parallel_defaults_to_what_divides_both():
    assert encoder_tensor_parallel(8, 16) == 8  # ViT-L's 16 heads: the LLM's degree
    assert encoder_tensor_parallel(8, 25) == 1  # InternViT-6B's 25 heads: replicated over the group
    assert encoder_tensor_parallel(4, 6) == 2
    assert encoder_tensor_parallel(8, 16, override=2) == 2
    doc = preset_document("llava-7b")
    doc["parallel"] = {"tp": 8}
    enc = parse_workload(doc).encoders[0]
    assert enc.static == pytest.approx(301_989_888 / 8 * 2 / 1e9)
    doc["encoders"][0]["tp"] = 2
    assert parse_workload(doc).encoders[0].static == pytest.approx(301_989_888 / 2 * 2 / 1e9)


# An explicit workload with round figures: 8 layers of static 1, embedding 10, head 20;
# a trainable encoder whose trained copy holds 100 and a forward-only replica 7.
STATIC = {
    "llm": {"layers": 8, "static": {"layer": 1.0, "embed": 10.0, "head": 20.0}},
    "encoders": [{"name": "vision", "f": 2.0, "b": 1.0, "w": 1.0, "trainable": True, "layers": 4,
                  "static": 100.0, "replica_static": 7.0, "activation": 1.0}],
    "device": {"memory": 200.0},
}


@pytest.mark.parametrize("term, expected", [
    # fused: the encoder on chunk 0's device, 2 layers per device
    ("1f1b(p=4, m=4)", [2 + 10 + 100, 2, 2, 2 + 20]),
    # transpose, recompute backward: other devices run forwards only (a replica each)
    ("transpose(1f1b(p=4, m=4))", [112, 2 + 7, 2 + 7, 22 + 7]),
    # owner backward: every device runs the encoder's backward (a trained copy each)
    ("transpose(1f1b(p=4, m=4), backward=owner)", [112, 102, 102, 122]),
    # the encoder's own device ahead of the LLM's (8 layers over 3 devices: 3, 3, 2)
    ("encoder_stage(1f1b(p=3, m=4))", [100, 3 + 10, 3, 2 + 20]),
    # two copies of the model, each on its own devices
    ("par(1f1b(p=2, m=2), 1f1b(p=2, m=2))", [4 + 10 + 100, 4 + 20, 114, 24]),
])
def test_static_memory_sits_where_the_parameters_are(term, expected):
    assert evaluate(term, STATIC).metrics.static_memory == expected


def test_balanced_holds_a_share_of_the_encoder_per_folded_layer():
    ev = evaluate("balanced(1f1b(p=4, m=4))", STATIC)
    pipe = ev.schedule.pipelines[0]
    expected = [n * 1.0 + e * 25.0 for n, e in zip(pipe.layers, pipe.encoder_layers)]
    expected[0] += 10
    expected[-1] += 20
    assert sum(pipe.encoder_layers) == 4 and ev.metrics.static_memory == expected


def test_peak_memory_is_static_plus_activations_and_the_chart_starts_at_static():
    ev = evaluate("1f1b(p=4, m=4)", STATIC)
    m = ev.metrics
    assert m.peak_memory == [s + a for s, a in zip(m.static_memory, m.peak_activation_memory)]
    assert [series[0] for series in ev.memory_over_time] == [(0.0, s) for s in m.static_memory]
    assert [max(v for _, v in series) for series in ev.memory_over_time] == m.peak_memory
    assert [max(v for _, v in series) for series in ev.activation_over_time] == m.peak_activation_memory
    assert m.capacity == 200 and m.headroom == [200 - p for p in m.peak_memory] and m.fits is True


# ------------------------------------------------------------------ capacity

@pytest.mark.parametrize("name, gb", [("ascend-910c", 64), ("a100", 80), ("h100", 80), ("h200", 141)])
def test_device_presets_know_their_memory(name, gb):
    assert parse_workload({"model": "llama2-7b", "device": name}).capacity == gb


def test_capacity_unknown_without_a_device():
    ev = evaluate("1f1b(p=2, m=2)")
    s = ev.summary()
    assert (s["capacity"], s["fits"], s["headroom"], s["static_memory"]) == (None, None, None, [0.0, 0.0])


def test_explicit_memory_keys_round_trip():
    doc = {"llm": {"layers": 4, "activation": 2.0, "static": {"layer": 0.5, "embed": 1.0, "head": 1.5},
                   "recompute": {"selective": {"activation": 1.0, "f": 0.25}, "full": {"activation": 0.1}}},
           "encoders": [{"name": "vision", "static": 3.0, "replica_static": 1.0, "activation": 1.0,
                         "recompute": {"full": {"activation": 0.2, "f": 0.5}}}],
           "device": {"memory": 16.0}, "units": {"time": "ms", "memory": "GB"}}
    wl = parse_workload(doc)
    assert (wl.llm.static_layer, wl.llm.static_embed, wl.llm.static_head) == (0.5, 1.0, 1.5)
    assert wl.llm.kept_activation("selective") == 1.0 and wl.llm.recompute_f("full") is None
    assert wl.capacity == 16.0 and wl.encoders[0].static_of_copy(False) == 1.0
    again = parse_workload(explicit_dict(wl))
    assert (again.llm, again.encoders, again.capacity) == (wl.llm, wl.encoders, wl.capacity)
    # an analytic workload's explicit form carries the same figures
    analytic = preset("internvl-26b")
    explicit = parse_workload(explicit_dict(analytic))
    assert (explicit.llm, explicit.encoders, explicit.capacity) == (analytic.llm, analytic.encoders, 64.0)


def test_parallel_section_of_a_preset_from_the_cli_form():
    wl = with_parallel(preset("internvl-26b"), {"tp": 8, "sp": True})
    assert wl.source["parallel"] == {"tp": 8, "sp": True}
    assert wl.llm.activation == pytest.approx(4096 * 6144 * 34 / 8 / 1e9)
    with pytest.raises(WorkloadError, match=r"^--parallel needs an analytic workload .*'vit-heavy-small'"):
        with_parallel(preset("vit-heavy-small"), {"tp": 2})


@pytest.mark.parametrize("doc, message", [
    ({"model": "llama2-7b", "device": "a100", "parallel": {"tp": 3}},
     "parallel.tp: 3 does not divide the model's 32 attention heads"),
    ({"model": "internlm2-20b", "device": "a100", "parallel": {"tp": 3}},
     "parallel.tp: 3 does not divide the model's 8 key/value heads (kv_heads)"),
    ({"model": "llama2-7b", "device": "a100", "parallel": {"tp": 0}},
     "parallel.tp: expected an integer from 1 to 1000000, got 0"),
    ({"model": "llama2-7b", "device": "a100", "parallel": {"sp": "yes"}},
     "parallel.sp: expected true or false, got 'yes'"),
    ({"model": "llama2-7b", "device": "a100", "parallel": {"pp": 2}},
     "parallel: unknown key 'pp' (known: cp, distributed_optimizer, dp, encoder_shard, flash_attention, "
     "grad_accumulation_fusion, grad_reduce_fp32, overlap_grad_reduce, p2p_overlap, sp, tp, tp_backward_overlap, "
     "tp_comm_overlap)"),
    ({"model": "llama2-7b", "device": {"preset": "a100", "memory": -80}}, "device.memory: must be > 0 or null, got -80"),
    ({"device": {"memory": -64}}, "device.memory: must be > 0 or null, got -64"),
    ({"device": {"memory": "big"}}, "device.memory: expected a number, got 'big'"),
    ({"device": "a100"}, 'device: an explicit workload takes {"memory": capacity}; a device preset or profile goes '
                         'with a "model" (the analytic form)'),
    ({"llm": {"activation": 1.0, "recompute": {"full": {"activation": 2.0}}}},
     "llm.recompute.full.activation: 2 is more than llm.activation (1): a recompute keeps at most what is kept "
     "without one"),
    ({"llm": {"recompute": {"partial": {}}}}, "llm.recompute: unknown key 'partial' (known: full, selective)"),
    ({"llm": {"static": {"layer": -1}}}, "llm.static.layer: must be >= 0, got -1"),
    ({"llm": {"static": {"optimizer": 1}}}, "llm.static: unknown key 'optimizer' (known: embed, head, layer)"),
    ({"model": "llama2-7b", "device": "a100", "encoders": [{"name": "v", "vit": "intern-vit-6b", "tp": 5}],
      "parallel": {"tp": 8}}, "encoders[0].tp: 5 does not divide parallel.tp (8)"),
    ({"model": "llama2-7b", "device": "a100", "encoders": [{"name": "v", "vit": "intern-vit-6b", "tp": 2}],
      "parallel": {"tp": 8}}, "encoders[0].tp: 2 does not divide the encoder's 25 attention heads"),
    ({"model": "llama2-7b", "device": "a100", "units": {"time": "ms"}},
     "workload: unknown key 'units' in the analytic form (known: cluster, data, description, device, encoders, "
     "model, name, parallel)"),
])
def test_bad_memory_input_says_what_and_where(doc, message):
    with pytest.raises(WorkloadError) as info:
        parse_workload(doc)
    assert info.value.message == message


# ------------------------------------------------------------------ mpipe eval

def test_eval_json_reports_static_memory_headroom_capacity_and_fits():
    code, out, _ = cli("eval", "balanced(zbv(p=8, m=16))", "-w", "internvl-26b", "--parallel", "tp=8,sp", "--json")
    s = json.loads(out)
    assert code == 0 and s["capacity"] == 64.0 and s["fits"] is True
    assert len(s["static_memory"]) == len(s["headroom"]) == 8
    assert s["headroom"] == [64.0 - p for p in s["peak_memory"]]
    assert all(p > st > 0 for p, st in zip(s["peak_memory"], s["static_memory"]))


def test_eval_of_a_schedule_that_does_not_fit_still_evaluates_and_says_so_in_one_line():
    code, out, err = cli("eval", "1f1b(p=8, m=16)", "-w", "internvl-26b")
    ev = evaluate("1f1b(p=8, m=16)", "internvl-26b")
    peaks = ev.metrics.peak_memory
    assert code == 0 and err == "" and ev.metrics.fits is False
    lines = [line for line in out.splitlines() if line.startswith("capacity")]
    over = sum(p > 64 for p in peaks)
    assert lines == [f"capacity     64    does not fit: device 0 needs {peaks[0]:.4g}, {peaks[0] - 64:.3g} over "
                     f"({over} of 8 devices over)"]
    assert f"static       {ev.metrics.static_memory[0]:.3g} " in out


def test_memory_fit_says_what_eval_says_in_one_line_with_units():
    from mpipe_core.simulation.metrics import memory_fit

    over = with_parallel(preset("gpt3-175b"), {"tp": 8, "sp": True, "flash_attention": False})
    m = evaluate("1f1b(p=8, m=8)", over).metrics
    fit = memory_fit(m.peak_memory, m.capacity)
    assert (fit.fits, fit.worst, set(fit.over)) == (False, 0, {0}) and fit.capacity == 80
    assert fit.over[0] == pytest.approx(m.peak_memory[0] - 80) and fit.least_headroom == -fit.over[0]
    assert fit.text("GB") == "does not fit in 80 GB: device 0 needs 84.74 GB, 4.739 GB over (1 of 8 devices over)"
    m = evaluate("recompute(1f1b(p=8, m=8), mode=selective)", over).metrics
    fit = memory_fit(m.peak_memory, m.capacity)
    assert fit.fits and fit.over == {} and fit.least_headroom == pytest.approx(min(m.headroom))
    assert fit.text("GB") == f"fits in 80 GB (least headroom {human(80 - max(m.peak_memory))} GB, device 0)"
    assert memory_fit(m.peak_memory, None) is None  # capacity unknown: nothing to say


# ---- a replicated encoder's state sharded over its trained copies (parallel.encoder_shard)

def test_encoder_bytes_per_parameter_follow_zero_stages_with_fp32_gradients():
    from mpipe_core.workloads.memory_model import encoder_bytes_per_parameter
    # none: the LLM's accounting (18, or 6 + 12/d with the distributed optimizer), nothing over the copies
    assert encoder_bytes_per_parameter(True, 8, False) == (18.0, 0.0)
    assert encoder_bytes_per_parameter(True, 8, True) == (6.0 + 12 / 8, 0.0)
    # optimizer (ZeRO-1 / Megatron's distributed optimizer over the copies): 6 + 12/N, N = k x dp
    assert encoder_bytes_per_parameter(True, 8, True, "optimizer") == (6.0, 12 / 8)
    # gradients (ZeRO-2 / Megatron FSDP optim_grads): 2 + 16/N
    assert encoder_bytes_per_parameter(True, 8, False, "gradients") == (2.0, 16 / 8)
    # frozen: the 16-bit weights whatever the setting
    assert encoder_bytes_per_parameter(False, 8, True, "gradients") == (2.0, 0.0)


SHARDED = {**STATIC, "encoders": [dict(STATIC["encoders"][0], static=100.0, sharded_static=80.0)]}


@pytest.mark.parametrize("term, expected", [
    # owner backward: 4 trained copies, each 20 + 80/4
    ("transpose(1f1b(p=4, m=4), backward=owner)", [2 + 10 + 40, 2 + 40, 2 + 40, 2 + 20 + 40]),
    # recompute backward: one trained copy (rank 0) holds it all, the others a forward replica
    ("transpose(1f1b(p=4, m=4))", [112, 2 + 7, 2 + 7, 22 + 7]),
    ("colocated(1f1b(p=4, m=4))", [52, 42, 42, 62]),
    # disaggregate: 2 encoder devices, 20 + 80/2 each
    ("disaggregate(1f1b(p=2, m=4), encoder_devices=2)", [4 + 10, 4 + 20, 60, 60]),
])
def test_a_sharded_encoder_copy_holds_its_share_of_the_sharded_state(term, expected):
    assert evaluate(term, SHARDED).metrics.static_memory == pytest.approx(expected)


def test_sharded_static_round_trips_and_cannot_exceed_static():
    wl = parse_workload(SHARDED)
    assert wl.encoders[0].sharded_static == 80.0
    assert parse_workload(explicit_dict(wl)).encoders == wl.encoders
    bad = {**STATIC, "encoders": [dict(STATIC["encoders"][0], sharded_static=101.0)]}
    with pytest.raises(WorkloadError, match=r"encoders\[0\]\.sharded_static: 101 is more than"):
        parse_workload(bad)


def _internvl(shard: str, tp=2, cp=2, dp=32):
    doc = preset_document("internvl-26b")
    doc["cluster"] = "cloudmatrix384"
    doc["parallel"] = {"tp": tp, "sp": True, "cp": cp, "dp": dp, "distributed_optimizer": True,
                       "encoder_shard": shard}
    return parse_workload(doc)


def test_internvl_tower_sharded_over_its_copies_by_hand():
    params = 45 * (4 * 3200 ** 2 + 2 * 3200 * 12800)  # InternViT-6B, encoder tp = gcd(2, 25) = 1
    none, opt, grads = (_internvl(s).encoders[0] for s in ("none", "optimizer", "gradients"))
    assert none.static == pytest.approx(params * (6 + 12 / 64) / 1e9) and none.sharded_static is None
    assert opt.static == none.static and opt.sharded_static == pytest.approx(params * 12 / 64 / 1e9)
    assert grads.static == pytest.approx(params * (2 + 16 / 64) / 1e9)
    # four trained copies (transpose's owner backward at pp=4): N = 4 x 64 copies
    assert grads.static_of_copy(True, 4) == pytest.approx(params * (2 + 16 / 256) / 1e9)
    assert opt.static_of_copy(True, 4) == pytest.approx(params * (6 + 12 / 256) / 1e9)


def test_a_sharded_tower_syncs_by_reduce_scatter_and_all_gather():
    """The copies' AR op becomes a reduce-scatter of fp32 gradients + an all-gather of 16-bit weights
    over the pipeline's copies; the step's sync moves 1/k of the tower over dp x cp, and Adam updates
    1/(k dp cp) of it."""
    from mpipe_core.workloads.collectives import all_gather, reduce_scatter

    term = "colocated(1f1b(p=4, m=16))"
    plain, sharded = (evaluate(term, _internvl(s)) for s in ("none", "optimizer"))
    enc = sharded.workload.encoders[0]
    link = sharded.workload.link_for(4)
    ar = [e - s for op, _, s, e in sharded.timeline.rows() if op.kind == "AR"]
    by_hand = 3 * (link.transfer(enc.gradient_bytes / 4) + link.transfer(enc.param_bytes / 4))
    assert ar and ar[0] == pytest.approx(by_hand)
    assert by_hand < 2 * 3 * link.transfer(enc.gradient_bytes / 4)  # cheaper than the all-reduce it replaces
    step = sharded.workload.step
    tower = step.encoders[0].params
    dev = sharded.step.critical_device
    kinds = [c["kind"] for c in sharded.step.breakdown["dp_sync"]]
    assert kinds == ["reduce-scatter", "all-gather", "reduce-scatter", "all-gather"]
    tower_rs = sharded.step.breakdown["dp_sync"][2]
    n, glink = 64, step.gradient_link(4)
    assert tower_rs["buffer_bytes"] == pytest.approx(4 * tower / 4)
    assert tower_rs["seconds"] == pytest.approx(reduce_scatter(n, 4 * tower / 4, glink).seconds)
    assert sharded.step.breakdown["dp_sync"][3]["seconds"] == pytest.approx(
        all_gather(n, 2 * tower / 4, glink).seconds)
    assert sharded.step.step_time_s < plain.step.step_time_s
    assert dev in range(4)
