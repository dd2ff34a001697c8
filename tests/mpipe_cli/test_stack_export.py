"""Export to the stacks: torchtitan's CSV + TOML (loaded by torch's own
`_PipelineScheduleRuntime`), Megatron's `--pipeline-model-parallel-layout`,
MindSpeed's `layer_placement`; and the one-line refusals of what a stack cannot
express."""
from __future__ import annotations

import json
import tomllib

import pytest
from cli_runner import run_cli

from mpipe_core.api import evaluate
from mpipe_core.formats.megatron_layout import layout_string, parse_layout
from mpipe_core.formats.torch_csv import TO_TORCH

LLAMA8 = {"llm": {"layers": 8}}


def cli(*argv):
    out = run_cli(list(argv))
    assert out.traceback is None, out.traceback
    return out


def export_torchtitan(tmp_path, term, workload=None, *more):
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps(workload or LLAMA8))
    out = tmp_path / "tt"
    got = cli("export", term, "-w", str(wl), "--format", "torchtitan", "-o", str(out), *more)
    assert got.code == 0, got.err
    return out, got


@pytest.mark.parametrize("term", ["interleaved(p=2, m=4)", "partition(1f1b(p=4, m=8), [1, 3, 2, 2])",
                                  "zbv(p=2, m=4)", "zb_h1(p=2, m=4)", "balanced(interleaved(p=2, m=4))",
                                  "dualpipev(p=2, m=4)"])
def test_torch_loads_the_torchtitan_csv_and_runs_our_orders(tmp_path, term):
    folder, _ = export_torchtitan(tmp_path, term)
    config = tomllib.loads((folder / "torchtitan.toml").read_text())
    par = config["parallelism"]
    ev = evaluate(term, LLAMA8)
    p, chunks = ev.schedule.devices, ev.schedule.pipelines[0].chunks
    m = config["training"]["local_batch_size"] // par["pipeline_parallel_microbatch_size"]
    assert par["pipeline_parallel_degree"] == p and m == ev.schedule.pipelines[0].microbatches
    assert par["pipeline_parallel_schedule_csv"] == str(folder / "schedule.csv")
    # rank 0's stages as torchtitan places them for this schedule name (looped, or a V)
    mine = [0, 2 * p - 1] if par["pipeline_parallel_schedule"] == "ZBVZeroBubble" else list(range(0, chunks, p))
    # torch imported here, not while every test process collects this file
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from benchmarks.torch_construction import MockStage

    sched = _PipelineScheduleRuntime([MockStage(s, chunks, p) for s in mine], m)
    sched._load_csv(par["pipeline_parallel_schedule_csv"])  # torch's loader validates the schedule
    loaded = [[str(a) for a in sched.pipeline_order[r] if a is not None] for r in range(p)]
    ours = [[f"{op.chunk}{TO_TORCH[op.kind]}{op.mb}" for op in order] for order in ev.schedule.orders]
    assert loaded == ours
    # every layer once, in order, split as the schedule splits them
    fqns = par["module_fqns_per_model_part"]
    layers = [[f for f in stage if f.startswith("layers.")] for stage in fqns]
    assert [f for stage in layers for f in stage] == [f"layers.{i}" for i in range(8)]
    from mpipe_core.simulation.chunks import llm_layers

    assert [len(s) for s in layers] == llm_layers(ev.schedule.pipelines[0], ev.workload)
    assert fqns[0][0] == "tok_embeddings" and fqns[-1][-2:] == ["norm", "output"]


def test_the_fqn_template_names_other_models_and_folded_encoders(tmp_path):
    workload = {"llm": {"layers": 4},
                "encoders": [{"name": "vision", "f": 8.0, "b": 8.0, "w": 8.0, "layers": 4, "trainable": True}]}
    folder, _ = export_torchtitan(tmp_path, "balanced(1f1b(p=2, m=4))", workload, "--fqn-template",
                                  "vision.blocks.{},embed,model.layers.{},head")
    fqns = tomllib.loads((folder / "torchtitan.toml").read_text())["parallelism"]["module_fqns_per_model_part"]
    pipe = evaluate("balanced(1f1b(p=2, m=4))", workload).schedule.pipelines[0]
    assert [sum(f.startswith("vision.") for f in s) for s in fqns] == list(pipe.encoder_layers)
    assert [sum(f.startswith("model.layers.") for f in s) for s in fqns] == list(pipe.layers)
    flat = [f for s in fqns for f in s]
    assert flat == [f"vision.blocks.{i}" for i in range(4)] + ["embed"] + [f"model.layers.{i}" for i in range(4)] + ["head"]
    got = cli("export", "balanced(1f1b(p=2, m=4))", "-w", str(tmp_path / "w.json"), "--format", "torchtitan",
              "-o", str(tmp_path / "x"))
    assert got.code == 2 and "name them with a second {} entry" in got.err


def test_the_megatron_layout_of_an_uneven_split_exactly():
    got = cli("export", "partition(1f1b(p=4, m=8), [3, 5, 4, 4])", "--format", "megatron-layout")
    assert got.code == 0 and got.out == "Et*3|t*5|t*4|t*4,L\n"
    assert [stage.count("t") for stage in parse_layout(got.out)] == [3, 5, 4, 4]


def test_layouts_read_back_as_megatron_reads_them():
    for layers in ([4] * 8, [1, 2, 2, 2, 1], [6], [0, 3, 3, 0], [2, 3, 3, 3, 3, 2]):
        stages = parse_layout(layout_string(layers))
        assert [s.count("t") for s in stages] == layers
        assert stages[0][0] == "E" and stages[-1][-1] == "L" and sum(s.count("E") + s.count("L") for s in stages) == 2
    # interleaved: stages in virtual-stage order, i.e. chunk order
    got = cli("export", "partition(interleaved(p=2, m=4), [1, 2, 3, 2])", "--format", "megatron-layout")
    assert got.out == "Et|t*2|t*3|t*2,L\n" and got.err.splitlines() == [
        "note: pass it with --pipeline-model-parallel-size 2 and 2 virtual stages per rank "
        "(--microbatch-group-size-per-virtual-pipeline-stage 2); 4 microbatches per step: --global-batch-size 4 x "
        "--micro-batch-size x the data-parallel size"]


def test_mindspeed_placement_of_a_balanced_split():
    ev = evaluate("balanced(1f1b(p=4, m=8))", "internvl-26b")
    got = cli("export", "balanced(1f1b(p=4, m=8))", "-w", "internvl-26b", "--format", "mindspeed-placement")
    assert got.code == 0
    doc = json.loads(got.out)["layer_placement"]
    pipe = ev.schedule.pipelines[0]
    assert doc == {"vit_layer_placement": list(pipe.encoder_layers), "llm_layer_placement": list(pipe.layers)}
    assert sum(doc["vit_layer_placement"]) == ev.workload.encoders[0].layers
    fused = json.loads(cli("export", "partition(1f1b(p=2, m=4), [20, 28])", "-w", "internvl-26b",
                           "--format", "mindspeed-placement").out)["layer_placement"]
    assert fused == {"vit_layer_placement": [ev.workload.encoders[0].layers, 0], "llm_layer_placement": [20, 28]}


ONE_STEP = "a stack config holds one pipeline and one training step"
NOT_FIRST_STAGE = "vision:0F1 runs on device 1; the stacks run an encoder only inside the first stage"
NO_ENCODER = "Megatron's flexible layout has no encoder layers (it refuses them)"


@pytest.mark.parametrize("term, fmt, message", [
    ("transpose(1f1b(p=2, m=4))", "torchtitan", f"--format torchtitan cannot express transpose: {NOT_FIRST_STAGE}"),
    ("transpose(1f1b(p=2, m=4), mode=dynamic)", "megatron-layout",
     f"--format megatron-layout cannot express transpose: {NOT_FIRST_STAGE}"),
    ("encoder_stage(1f1b(p=2, m=4))", "mindspeed-placement",
     "--format mindspeed-placement cannot express encoder_stage: the stacks place LLM chunk c on rank c mod P "
     "(looped) or in a V, with the encoder inside the first stage"),
    ("1f1b(p=2, m=4)", "megatron-layout", f"--format megatron-layout cannot express the vision encoder: {NO_ENCODER}"),
    ("balanced(zbv(p=2, m=4))", "megatron-layout",
     f"--format megatron-layout cannot express the vision encoder: {NO_ENCODER}"),
    ("interleaved(p=2, m=4)", "mindspeed-placement", "--format mindspeed-placement cannot express interleaved's "
                                                    "2 chunks per rank: layer_placement has one stage per rank"),
    ("repeat(1f1b(p=2, m=4), 2)", "torchtitan", f"--format torchtitan cannot express repeat: {ONE_STEP}"),
    ("split_bw(1f1b(p=2, m=4))", "mindspeed-placement", "--format mindspeed-placement cannot express split_bw: it "
                                                        "changes 1f1b's order, and the stack runs 1f1b's own"),
    ("gpipe(p=2, m=4)", "mindspeed-placement", "--format mindspeed-placement cannot express gpipe: MindSpeed-MM runs "
     "Megatron's 1F1B and interleaved 1F1B (MindSpeed adds no zero-bubble, GPipe or breadth-first order)"),
    ("par(1f1b(p=1, m=2), 1f1b(p=1, m=2))", "megatron-layout", f"--format megatron-layout cannot express par: {ONE_STEP}"),
    ("encoder_batch(1f1b(p=2, m=4), 2)", "torchtitan", "--format torchtitan cannot express encoder_batch: torchtitan "
                                                       "runs the encoder inside stage 0's module, once per microbatch"),
    ("recompute(balanced(1f1b(p=2, m=4)))", "mindspeed-placement",
     "--format mindspeed-placement cannot express recompute of the folded encoder layers: the --recompute-* "
     "options recompute the LLM's layers only"),
    ("recompute(balanced(1f1b(p=2, m=4)))", "torchtitan", "--format torchtitan cannot express recompute of the "
     "folded encoder layers: torchtitan's activation_checkpoint covers the LLM's layers only"),
])
def test_what_a_stack_cannot_express_is_one_line_naming_the_part(tmp_path, term, fmt, message):
    more = ["-o", str(tmp_path / "out")] if fmt == "torchtitan" else []
    got = cli("export", term, "-w", "vit-heavy-small", "--format", fmt, *more)
    lines = [line for line in got.err.splitlines() if line.startswith("error:")]
    assert got.code == 2 and lines == ["error: " + message], got.err
    assert not (tmp_path / "out").exists()


def test_the_megatron_layout_needs_a_layer_count():
    got = cli("export", "1f1b(p=2, m=4)", "--format", "megatron-layout")
    assert got.code == 2 and got.err.splitlines()[-1] == (
        "error: --format megatron-layout cannot express the layer split: the workload does not say how many LLM "
        "layers there are (give one with llm.layers, or a partition(...) term)")
    got = cli("export", "zbv(p=2, m=4)", "-w", "llama2-7b", "--format", "megatron-layout")
    assert got.code == 2 and got.err.splitlines()[-1] == (
        "error: --format megatron-layout cannot express zbv's V placement: Megatron places chunk c on rank c mod P")


MEGATRON_FULL = "recompute: pass --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"


MEGATRON_PP2 = ("pass it with --pipeline-model-parallel-size 2; 4 microbatches per step: --global-batch-size 4 x "
                "--micro-batch-size x the data-parallel size")
MINDSPEED_PP2 = "pass it with PP=2; 4 microbatches per step: GBS = 4 x MBS x DP"


@pytest.mark.parametrize("term, fmt, notes", [
    ("recompute(1f1b(p=2, m=4), mode=selective)", "megatron-layout",
     [MEGATRON_PP2, "recompute: pass --recompute-granularity selective"]),
    ("recompute(1f1b(p=2, m=4))", "megatron-layout", [MEGATRON_PP2, MEGATRON_FULL]),
    ("recompute(1f1b(p=2, m=4), layers=[3, 3])", "megatron-layout",
     [MEGATRON_PP2, "recompute: pass --recompute-granularity full --recompute-method block --recompute-num-layers 3"]),
    ("recompute(1f1b(p=2, m=4))", "mindspeed-placement",
     [MINDSPEED_PP2, MEGATRON_FULL, "the workload has no encoder: vit_layer_placement is all zeros"]),
])
def test_a_recompute_comes_back_as_the_stacks_own_options(term, fmt, notes):
    got = cli("export", term, "-w", "llama2-7b", "--format", fmt)
    assert got.code == 0, got.err
    assert [line for line in got.err.splitlines() if line] == [f"note: {n}" for n in notes], got.err


def test_encoder_batch_is_mindspeeds_encoder_mbs_scale():
    got = cli("export", "encoder_batch(1f1b(p=2, m=4), 2)", "-w", "vit-heavy-small", "--format", "mindspeed-placement")
    assert got.code == 0, got.err
    assert got.err.splitlines() == [f"note: {MINDSPEED_PP2}",
                                    "note: encoder_batch: pass --hetero-parallel --hetero-encoder-mbs-scale 2"]


@pytest.mark.parametrize("mode, toml", [("full", {"mode": "full"}),
                                        ("selective", {"mode": "selective", "selective_ac_option": "op"})])
def test_torchtitan_gets_the_recompute_as_its_activation_checkpoint(tmp_path, mode, toml):
    out, got = export_torchtitan(tmp_path, f"recompute(1f1b(p=2, m=4), mode={mode})")
    assert tomllib.loads((out / "torchtitan.toml").read_text())["activation_checkpoint"] == toml
    assert f'note: recompute: activation_checkpoint.mode = "{mode}" (in torchtitan.toml)' in got.err.splitlines()


@pytest.mark.parametrize("term, fmt, message", [
    ("recompute(1f1b(p=2, m=4), chunks=[0])", "megatron-layout",
     "--format megatron-layout cannot express recompute of different layers in different chunks: Megatron "
     "recomputes the same layers in every pipeline stage (--recompute-granularity selective: all of them; full: "
     "the first --recompute-num-layers)"),
    ("recompute(1f1b(p=2, m=4), layers=[3, 3])", "torchtitan",
     "--format torchtitan cannot express recompute of some layers only: torchtitan's activation_checkpoint.mode "
     "recomputes every layer (full or selective)"),
])
def test_a_recompute_the_stack_cannot_say_is_refused_in_one_line(tmp_path, term, fmt, message):
    more = ["-o", str(tmp_path / "out")] if fmt == "torchtitan" else []
    got = cli("export", term, "-w", "llama2-7b", "--format", fmt, *more)
    assert got.code == 2 and [line for line in got.err.splitlines() if line.startswith("error:")] == [
        "error: " + message], got.err
    assert not (tmp_path / "out").exists()
