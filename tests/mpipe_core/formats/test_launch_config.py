"""A planned layout as Megatron-LM arguments, MindSpeed-MM fields and torchtitan's TOML."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.formats.launch_config import emit, launch_files
from mpipe_core.search.plan_space import Layout, layout_document
from mpipe_core.workloads.presets import preset_document

FLAGS = {line.strip() for line in (Path(__file__).parent / "megatron_flags.txt").read_text().splitlines()
         if line.startswith("--")}


def _gpt3(layout: Layout) -> dict:
    return layout_document(preset_document("gpt3-175b"), layout, "dgx-a100")


def test_megatron_arguments_use_megatrons_own_flag_names():
    text = emit(_gpt3(Layout(8, 2, 8, 2, 1, True)), "recompute(interleaved(p=8, m=32, v=2))", 64, "megatron")
    args = [line.strip(" \\") for line in text.strip().splitlines()]
    assert args == ["--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 8", "--context-parallel-size 2",
                    "--micro-batch-size 1", "--global-batch-size 64", "--num-layers-per-virtual-pipeline-stage 6",
                    "--microbatch-group-size-per-virtual-pipeline-stage 8", "--sequence-parallel", "--use-distributed-optimizer", "--recompute-granularity full",
                    "--recompute-method uniform", "--recompute-num-layers 1"]
    assert all(a.split()[0] in FLAGS for a in args)


def test_megatron_uneven_split_is_the_layout_string_and_refuses_encoders():
    text = emit(_gpt3(Layout(8, 1, 8, 1, 1, False)), "partition(1f1b(p=8, m=64), layers=[11, 12, 12, 12, 12, 12, 12, 13])",
                64, "megatron")
    assert "--pipeline-model-parallel-layout 'Et*11|(t*12|)*6,t*13,L'" in text
    assert "--pipeline-model-parallel-layout" in FLAGS
    doc = layout_document(preset_document("internvl-26b"), Layout(4, 1, 8, 2, 1, True, 1), "cloudmatrix384")
    with pytest.raises(MpipeError, match="cannot express the vision encoder"):
        emit(doc, "balanced(1f1b(p=8, m=64))", 128, "megatron")
    with pytest.raises(MpipeError, match="cannot express zbv"):
        emit(_gpt3(Layout(8, 1, 8, 1, 1, False)), "zbv(p=8, m=64)", 64, "megatron")


def test_mindspeed_mm_fields_and_torchtitan_toml_load():
    doc = layout_document(preset_document("internvl-26b"), Layout(4, 1, 8, 2, 1, True, 1), "cloudmatrix384")
    ms = json.loads(emit(doc, "balanced(1f1b(p=8, m=64))", 128, "mindspeed-mm"))
    assert ms["launch"] == {"TP": 4, "PP": 8, "CP": 1, "MBS": 1, "GBS": 128,
                            "extra_arguments": "--sequence-parallel --use-distributed-optimizer"}
    assert sum(ms["model"]["image_encoder"]["vision_encoder"]["pipeline_num_layers"]) == 45
    assert sum(ms["model"]["text_decoder"]["pipeline_num_layers"]) == 48
    files = launch_files(evaluate("recompute(1f1b(p=4, m=16))", _gpt3(Layout(8, 1, 4, 2, 2, True))), 64, "torchtitan")
    assert list(files) == ["torchtitan.toml", "schedule.csv"]  # the TOML names the CSV: both are written
    toml = tomllib.loads(files["torchtitan.toml"])
    par = toml["parallelism"]
    assert (par["tensor_parallel_degree"], par["context_parallel_degree"], par["pipeline_parallel_degree"],
            par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"],
            par["pipeline_parallel_microbatch_size"]) == (8, 1, 4, 2, 1, 2)
    assert toml["training"] == {"local_batch_size": 32, "global_batch_size": 64}
    assert toml["activation_checkpoint"]["mode"] == "full"


def test_interleaving_is_written_with_its_virtual_stages_and_microbatch_group():
    # Megatron: an uneven split with virtual stages is the layout string (it sets the virtual stages itself)
    text = emit(_gpt3(Layout(8, 1, 4, 1, 1, False)), "partition(interleaved(p=4, m=8), [12, 12, 12, 12, 12, 12, 11, 13])",
                8, "megatron")
    args = [line.strip(" \\") for line in text.strip().splitlines()]
    assert "--pipeline-model-parallel-layout 'Et*12|(t*12|)*5,t*11|t*13,L'" in args
    assert "--microbatch-group-size-per-virtual-pipeline-stage 4" in args  # interleaved(p=4, m=8): rounds of 4
    assert not any(a.startswith("--num-layers-per-virtual-pipeline-stage") for a in args)  # one of the two
    assert all(a.split()[0] in FLAGS for a in args)
    # MindSpeed-MM: --virtual-pipeline-model-parallel-size and pipeline_num_layers[vp][pp] (stage vp*PP + pp)
    doc = layout_document(preset_document("internvl-26b"), Layout(4, 1, 4, 2, 1, True, 1), "cloudmatrix384")
    term = "balanced(interleaved(p=4, m=16))"
    ms = json.loads(emit(doc, term, 32, "mindspeed-mm"))
    pipe = evaluate(term, doc).schedule.pipelines[0]
    assert ms["launch"]["extra_arguments"].startswith(
        "--virtual-pipeline-model-parallel-size 2 --microbatch-group-size-per-virtual-pipeline-stage 4 ")
    assert ms["model"]["text_decoder"]["pipeline_num_layers"] == [list(pipe.layers[:4]), list(pipe.layers[4:])]
    assert ms["model"]["image_encoder"]["vision_encoder"]["pipeline_num_layers"] == \
        [list(pipe.encoder_layers[:4]), list(pipe.encoder_layers[4:])]


@pytest.mark.parametrize("term, part", [
    ("interleaved(p=4, m=2)", "interleaved with 2 microbatches on 4 stages"),
    ("interleaved(p=1, m=4)", "interleaved on one pipeline stage"),
    ("gpipe(p=4, m=8)", "gpipe"), ("zb_h1(p=4, m=8)", "zb_h1"), ("looped_bfs(p=4, m=8)", "looped_bfs"),
    ("split_bw(1f1b(p=4, m=8))", "split_bw"), ("recompute(defer_w(split_bw(1f1b(p=4, m=8))))", "defer_w"),
])
def test_what_megatron_does_not_run_is_refused_by_name(term, part):
    for target in ("megatron", "mindspeed-mm"):
        with pytest.raises(MpipeError, match=f"^--format {target} cannot express {part}: "):
            emit(_gpt3(Layout(8, 1, 4, 1, 1, False)), term, 8, target)


def test_mindspeed_mm_refuses_encoder_batch_it_cannot_launch_as_given():
    doc = layout_document(preset_document("internvl-26b"), Layout(4, 1, 4, 2, 1, True, 1), "cloudmatrix384")
    with pytest.raises(MpipeError, match="^--format mindspeed-mm cannot express encoder_batch: MindSpeed-MM's "
                                         "--hetero-encoder-mbs-scale needs --hetero-parallel"):
        emit(doc, "encoder_batch(1f1b(p=4, m=16), 2)", 32, "mindspeed-mm")
