"""`mpipe run` with a layout (issue 39 sections 1 and 8): --parallel, a run spec
(--spec) and --scale dp=K; every bad layout is one `error:` line and exit 2,
refused before any process starts."""
import json

import pytest

from mpipe_core.runs.layout import RunLayout
from mpipe_core.runs.run_spec import RunSpec, read_run_spec, run_spec_from_plan_row, write_run_spec
from mpipe_core.workloads.presets import preset_document

from cli_runner import run_cli

TERM = "1f1b(p=2, m=4)"


def _spec_file(tmp_path, layout: dict, term=TERM, workload=None):
    path = tmp_path / "run.json"
    write_run_spec(RunSpec(term, workload, RunLayout.from_dict(layout)), path)
    return str(path)


@pytest.mark.parametrize("args,message", [
    (["--parallel", "dp=2", "--nproc", "3"],
     "error: the schedule places ops on 4 ranks (the layout tp=1 cp=1 pp=2 dp=2 (4 ranks); the term's 2 devices "
     "per pipeline) but 3 x 1 ranks were asked for"),
    (["--parallel", "tp=3"], "error: layout tp=3 does not divide the built-in model's 2 attention heads"),
    (["--parallel", "tp=4"], "error: layout tp=4 does not divide the built-in model's 2 attention heads"),
    (["--parallel", "tp=4", "--model", "hf:llava"],  # the tiny config's 4 heads over 2 kv heads
     "error: layout tp=4 does not divide model hf:llava's 2 key/value heads"),
    (["--parallel", "tp=2,sp", "--model", "examples.tiny_mllm:build", "--images", "3"],
     "error: layout tp=2 sp: model examples.tiny_mllm:build's sequence of 17 tokens does not split into 2 "
     "sequence blocks"),
    (["--parallel", "tp=2", "--in-process"],
     "error: --in-process: tp=2 shards on a torch.distributed device mesh (one process per rank): leave out "
     "--in-process"),
    (["--parallel", "cp=3"], "error: layout cp=3 does not divide the built-in model's sequence of 20 tokens"),
    (["--parallel", "dpp=2"], "error: --parallel: unknown key 'dpp' (known: cp, distributed_optimizer, dp, "
     "encoder_shard, flash_attention, grad_accumulation_fusion, grad_reduce_fp32, overlap_grad_reduce, "
     "p2p_overlap, sp, tp, tp_backward_overlap, tp_comm_overlap)"),
    (["--parallel", "dp=0"], "error: --parallel.dp: expected a whole number from 1 to 1000000, got '0'"),
])
def test_bad_layouts_are_one_line_exit_2_before_launch(args, message):
    out = run_cli(["run", TERM, *args])
    assert (out.code, out.error_lines, out.traceback) == (2, [message], None)


def test_tp_must_divide_the_hidden_size():
    from executor.parallel.layout_checks import ModelDims, check_layout
    from mpipe_core.runs.layout import LayoutError

    dims = ModelDims("model m", heads=8, kv_heads=8, hidden=100, sequence=64, tp_plan=True)
    with pytest.raises(LayoutError, match="^layout tp=8 does not divide model m's 100 hidden size$"):
        check_layout(RunLayout(tp=8, pp=2), dims)
    with pytest.raises(LayoutError, match="^layout tp=4 does not divide model m's 2 key/value heads$"):
        check_layout(RunLayout(tp=4, pp=2), ModelDims("model m", 8, 2, 64, 64, True))


@pytest.mark.parametrize("content,scale,message", [
    ("{}", None, "not a run spec (a JSON object with \"format\": \"mpipe-run-spec\", as `mpipe plan --emit mpipe` "
                 "writes)"),
    ("[1, 2", None, "not a run spec (not JSON: "),
    (None, "dp=0", None),
    (None, "tp=2", None),
])
def test_bad_specs_and_scales_are_one_line_exit_2(tmp_path, content, scale, message):
    if content is None:
        path = _spec_file(tmp_path, {"pp": 2, "dp": 4})
    else:
        path = tmp_path / "bad.json"
        path.write_text(content)
    out = run_cli(["run", "--spec", str(path)] + (["--scale", scale] if scale else []))
    assert out.code == 2 and out.traceback is None and len(out.error_lines) == 1
    line = out.error_lines[0]
    if scale == "dp=0":
        assert line == "error: --scale dp=0: dp must be a whole number from 1 to 1000000"
    elif scale == "tp=2":
        assert line == ("error: --scale tp=2: expected dp=K (only dp scales: tp, cp, pp and the schedule stay)")
    else:
        assert line.startswith(f"error: --spec {path}: {message}")


def test_a_spec_and_a_term_together_are_refused(tmp_path):
    out = run_cli(["run", TERM, "--spec", _spec_file(tmp_path, {"pp": 2})])
    assert out.error_lines == ["error: --spec gives the term, the workload and the layout: drop the term, "
                               "--workload and --parallel"] and out.code == 2


def test_a_spec_whose_pp_is_not_the_terms_devices_is_refused(tmp_path):
    out = run_cli(["run", "--spec", _spec_file(tmp_path, {"pp": 4, "dp": 1})])
    assert out.error_lines == ["error: the run spec's layout has pp=4 but the term places ops on 2 devices"]


def test_a_plan_row_becomes_a_spec_that_runs_scaled_down(tmp_path, capsys):
    """A plan row (its workload document, parallel section, pp and term) as a run spec;
    --scale dp=2 keeps pp and the term, and the run passes the gradient check."""
    doc = preset_document("llava-7b")
    doc["parallel"] = {"tp": 1, "dp": 64, "distributed_optimizer": True}
    row = {"parallel": doc["parallel"], "pp": 2, "term": "zbv(p=2, m=4)", "workload": doc}
    spec = run_spec_from_plan_row(row, "plan: 128 devices")
    assert spec.layout == RunLayout(pp=2, dp=64, distributed_optimizer=True) and spec.layout.world == 128
    path = tmp_path / "run.json"
    write_run_spec(spec, path)
    assert read_run_spec(path) == spec
    scaled = spec.scaled(2)
    assert (scaled.layout.tp, scaled.layout.cp, scaled.layout.pp, scaled.layout.dp, scaled.term) == (1, 1, 2, 2, spec.term)
    out = run_cli(["run", "--spec", str(path), "--scale", "dp=2", "--in-process", "--check-grads", "--json"])
    assert out.code == 0, out.err
    doc = json.loads(out.out)
    assert doc["devices"] == 4 and doc["layout"]["dp"] == 2 and doc["layout"]["distributed_optimizer"]
    assert doc["grad_check"]["ok"]
    assert {c["kind"] for c in doc["comm"]} == {"dp_comm", "dp_gather", "optimizer"}
    # Unscaled, the 128-rank layout does not fit the ranks asked for.
    out = run_cli(["run", "--spec", str(path), "--nproc", "8"])
    assert out.code == 2 and out.error_lines[0].startswith("error: the schedule places ops on 128 ranks")


def test_tp_must_divide_the_vision_tower_and_not_meet_packed_data():
    from executor.parallel.layout_checks import builtin_dims, check_layout
    from executor.runtime.model import ModelConfig
    from mpipe_core.runs.layout import LayoutError

    with pytest.raises(LayoutError, match="^layout tp=2 does not divide the built-in model's 3 vision tower heads$"):
        check_layout(RunLayout(tp=2, pp=2), builtin_dims(ModelConfig(enc_heads=3, d_enc=48)))
    with pytest.raises(LayoutError, match="^layout tp=2 with --data: packed microbatches do not run "
                                          "tensor-parallel yet$"):
        check_layout(RunLayout(tp=2, pp=2), builtin_dims(ModelConfig()), data=True)
    check_layout(RunLayout(tp=2, sp=True, pp=2), builtin_dims(ModelConfig()))  # 2 heads, 20 positions: runs


def test_a_scaled_spec_still_too_large_for_this_machine_is_refused_in_one_line(tmp_path):
    # 2 x 4096 gloo ranks need ~2.4 TiB of processes before their model: no machine here has that.
    path = _spec_file(tmp_path, {"pp": 2, "dp": 8192})
    out = run_cli(["run", "--spec", path, "--scale", "dp=4096"])
    assert out.code == 2 and len(out.error_lines) == 1
    assert out.error_lines[0].startswith("error: 8192 ranks on this node need at least 2400.0 GiB (each gloo rank "
                                         "is a process of about 300 MiB before its model) but it has ")
    assert out.error_lines[0].endswith("GiB available: scale the layout down (--scale dp=K) or spread it over "
                                       "nodes (--nnodes)")


def test_the_memory_check_counts_this_nodes_ranks_only(monkeypatch):
    from executor.errors import ExecutorError
    from executor.service import launch

    monkeypatch.setattr(launch, "available_memory_bytes", lambda: 8 * launch.GLOO_RANK_BYTES)
    launch.check_backend("gloo", 8)  # fits exactly
    launch.check_backend("gloo", None)  # ranks on other hosts (a cluster launcher): not this machine's
    with pytest.raises(ExecutorError, match=r"^9 ranks on this node need at least 2\.6 GiB"):
        launch.check_backend("gloo", 9)
