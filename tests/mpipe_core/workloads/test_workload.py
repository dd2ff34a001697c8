"""Workloads: explicit and analytic forms, files, presets, and exact errors."""
import pytest

from mpipe_core.api import evaluate
from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.analytic import layer_flops
from mpipe_core.workloads.presets import PRESETS
from mpipe_core.workloads.workload import load_workload, parse_workload, preset
from timeline_checks import timeline_problems


def test_json_and_toml_files_give_the_same_workload(tmp_path):
    (tmp_path / "w.json").write_text(
        '{"llm": {"layers": 8, "f": 1.5, "b": 2.0, "w": 1.0, "activation": 0.5},'
        ' "encoders": [{"name": "vision", "f": [1, 2], "trainable": true}],'
        ' "link": {"latency": 0.1, "bandwidth": 100}}')
    (tmp_path / "w.toml").write_text(
        '[llm]\nlayers = 8\nf = 1.5\nb = 2.0\nw = 1.0\nactivation = 0.5\n'
        '[[encoders]]\nname = "vision"\nf = [1, 2]\ntrainable = true\n'
        '[link]\nlatency = 0.1\nbandwidth = 100\n')
    a, b = load_workload(str(tmp_path / "w.json")), load_workload(str(tmp_path / "w.toml"))
    assert (a.llm, a.encoders, a.link) == (b.llm, b.encoders, b.link)
    assert evaluate("1f1b(p=2, m=2)", a).summary() == evaluate("1f1b(p=2, m=2)", b).summary()


def test_analytic_costs_follow_the_flop_formula():
    # Without a cluster: FLOPs at peak x efficiency; the head's logits on the last chunk only.
    wl = parse_workload({"model": {"hidden": 1024, "layers": 4, "heads": 8, "ffn": 4096, "seq_len": 512,
                                   "vocab": 1000, "microbatch_size": 2},
                         "device": {"peak_tflops": 100, "efficiency": 0.5, "link_gbps": 10,
                                    "link_latency_us": 20}})
    b, s, h = 2, 512, 1024
    per_ms = 100e12 * 0.5 / 1e3
    dense = 24 * b * s * h * h  # QKV + output 8bsh^2, MLP (4h wide, two matrices) 16bsh^2
    core = 4 * b * s * s * h
    assert wl.llm.f == pytest.approx((dense + core) / per_ms)
    assert wl.llm.b == pytest.approx((dense + 2 * core) / per_ms)  # the core's backward is twice its forward
    assert wl.llm.w == pytest.approx(dense / per_ms)
    head = 2 * b * s * h * 1000 / per_ms
    assert wl.llm.head == pytest.approx({"F": head, "B": head, "W": head})
    table = wl.llm.chunk_cost_table(2)
    assert table["F"] == pytest.approx([2 * wl.llm.f, 2 * wl.llm.f + head])
    assert wl.link.latency == pytest.approx(0.02) and wl.link.bandwidth == pytest.approx(10e9 / 1e3)
    assert wl.llm.boundary_bytes == 512 * 2 * 1024 * 2


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_evaluates(name):
    wl = preset(name)
    layers = wl.llm.layers or 8
    p = 4 if layers >= 8 else 2
    ev = evaluate(f"transpose(1f1b(p={p}, m=8))" if wl.encoders else f"1f1b(p={p}, m=8)", wl)
    # a valid execution of its schedule, checked from the outside (tests/timeline_checks.py)
    assert timeline_problems(ev) == []
    assert len(ev.timeline) == ev.schedule.num_ops and ev.timeline.makespan >= ev.metrics.lower_bound > 0


def test_images_per_sample_scale_encoder_cost_per_microbatch():
    wl = parse_workload({"encoders": [{"name": "vision", "f": 2.0, "images": {"min": 1, "max": 4, "seed": 5}}]})
    counts = wl.encoders[0].image_counts(8)
    assert wl.encoders[0].costs("F", 8) == [2.0 * n for n in counts]
    assert len(set(counts)) > 1 and all(1 <= n <= 4 for n in counts)
    assert counts == wl.encoders[0].image_counts(8)  # seeded: the same every time


@pytest.mark.parametrize("doc, message", [
    ({"llm": {"layers": 0}}, "llm.layers: expected an integer from 1 to 1000000, got 0"),
    ({"llm": {"f": -1}}, "llm.f: must be >= 0, got -1"),
    ({"llm": {"f": "fast"}}, "llm.f: expected a number, got 'fast'"),
    ({"lm": {}}, "workload: unknown key 'lm' (known: data, description, device, encoders, host, link, llm, name, "
                   "origin, units)"),
    ({"encoders": [{"name": "llm"}]}, "encoders[0].name: expected an identifier other than 'llm', got 'llm'"),
    ({"encoders": [{"name": "v", "trainable": "yes"}]}, "encoders[0].trainable: expected true or false, got 'yes'"),
    ({"encoders": [{"name": "v", "size": 3}]}, "encoders[0]: unknown key 'size' (known: activation, b, f, grad_bytes, "
                                                "images, input_bytes, layers, name, output_bytes, param_bytes, recompute, "
                                                "replica_static, sharded_static, static, tp_sharded, trainable, vit, w)"),
    ({"encoders": [{"name": "v"}, {"name": "v"}]}, "encoders: duplicate encoder name in ['v', 'v']"),
    ({"link": {"bandwidth": 0}}, "link.bandwidth: must be > 0 or null, got 0.0"),
    ({"model": "llama-9b", "device": "a100"}, "model: unknown preset 'llama-9b' (known: gpt3-175b, internlm2-20b, "
                                              "llama2-13b, llama2-7b, llama3-405b)"),
    ({"model": {"hidden": 64}, "device": "a100"}, "model: missing required key 'layers'"),
])
def test_broken_workloads_say_what_and_where(doc, message):
    with pytest.raises(WorkloadError) as info:
        parse_workload(doc)
    assert info.value.message == message


def test_broken_file_names_the_file_and_keeps_position(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[llm]\nlayers = = 3\n")
    with pytest.raises(WorkloadError, match=r"bad.toml.*not valid toml"):
        load_workload(str(bad))
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"llm": {"layers": -2}}')
    with pytest.raises(WorkloadError, match=r"wrong.json: llm.layers: expected an integer from 1 to 1000000, got -2"):
        load_workload(str(wrong))


def test_measured_layer_costs_and_embed_head_add_up_per_chunk():
    from mpipe_core.workloads.workload import explicit_dict, parse_workload

    doc = {"llm": {"layers": 4, "layer_costs": {"F": [1, 2, 3, 4], "B": [1, 1, 1, 1], "W": [2, 2, 2, 2]},
                   "embed": {"F": 0.5}, "head": {"F": 1, "B": 2}},
           "origin": {"model": "hf:llava"}}
    wl = parse_workload(doc)
    assert wl.llm.chunk_cost_table(2) == {"F": [3.5, 8.0], "B": [2.0, 4.0], "W": [4.0, 4.0], "BW": [6.0, 8.0]}
    assert parse_workload(explicit_dict(wl)).llm == wl.llm


def test_layer_costs_need_one_entry_per_layer():
    import pytest

    from mpipe_core.errors import WorkloadError
    from mpipe_core.workloads.workload import parse_workload

    with pytest.raises(WorkloadError, match=r"llm.layer_costs: need one entry per layer \(3\)"):
        parse_workload({"llm": {"layers": 3, "layer_costs": {"F": [1, 2], "B": [1, 1], "W": [1, 1]}}})


def test_a_saved_workload_is_not_looked_for_as_a_file():
    with pytest.raises(WorkloadError) as raised:
        load_workload("saved:team")
    assert raised.value.message == ("workload 'saved:team': saved workloads live in the team library, which the "
                                    "core does not read (the CLI's -w and storage.resolve_workload do)")
