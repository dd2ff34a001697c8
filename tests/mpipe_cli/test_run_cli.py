"""`mpipe run` without launching: in-process runs and refusals; `mpipe profile`."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpipe_cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_in_process_run_prints_json(capsys):
    rc = main(["run", "transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)", "--in-process",
               "--check-grads", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["grad_check"]["ok"]
    assert {r["kind"] for r in out["timeline"]} >= {"BCAST", "AR", "F", "BW"}
    # Each rank's measured memory (bytes), and the prediction in the workload's (here unitless) units
    assert [m["rank"] for m in out["memory"]] == [0, 1]
    for m in out["memory"]:
        assert m["static"] == m["parameters"] + m["gradients"] + m["optimizer"] and m["activation_peak"] > 0
        assert m["activation_peak_op"].startswith(("llm:", "vision:"))
    assert out["predicted_memory"]["unit"] == "" and len(out["predicted_memory"]["peak_activation"]) == 2
    assert out["memory_check"]["within_tolerance"] is None  # no ratio without a byte unit


PROFILED_TERM = "recompute(1f1b(p=2, m=4), layers=[2, 0])"


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """`mpipe run` of PROFILED_TERM on the tiny model and the workload `mpipe profile` measured
    for it (in seconds and bytes): (its text, the workload's path)."""
    import contextlib
    import io

    path = tmp_path_factory.mktemp("profiled") / "tiny.json"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["profile", "--model", "tiny", "--warmup", "0", "--repeats", "1", "-o", str(path)]) == 0
        rc = main(["run", PROFILED_TERM, "--model", "tiny", "--workload", str(path), "--in-process",
                   "--check-grads"])
    assert rc == 0, err.getvalue()
    return out.getvalue(), path


def test_in_process_run_of_a_profiled_workload_prints_predicted_against_measured_memory(profiled_run):
    text, _ = profiled_run
    lines = text.splitlines()
    head = lines.index("  memory in bytes: predicted by workload profile:tiny, measured (activations: the peak "
                       "of what autograd keeps saved for backward; static: parameters, gradients, optimizer "
                       "state)")
    rows = [line.split() for line in lines[head + 2:head + 4]]
    # rank 0 keeps two microbatches of chunk 0 (its first two layers only their input) at its second F
    assert [(r[0], r[-1]) for r in rows] == [("0", "llm:0F1"), ("1", "llm:1F0")]
    assert all(r[2] == r[1] and r[3] == "1.000" and r[5] == r[4] and r[6] == "1.000" for r in rows)


def test_a_run_prints_its_steps_and_the_prediction_in_one_unit(profiled_run):
    from mpipe_core.api import evaluate

    text, path = profiled_run
    lines = text.splitlines()
    # The model that ran, on what: its own profile is its workload, nothing dropped, nothing across models.
    assert lines.pop(1).startswith("  ran: the built-in model tiny (8 LLM layers of width 32, encoder vision "
                                   "(trainable)) on 2 ranks (gloo, CPU)")
    assert "across models" not in text and "dropped" not in text
    assert lines[1].startswith("  step 0: loss ") and lines[1].endswith(" ms")
    predicted = evaluate(PROFILED_TERM, str(path)).timeline.makespan  # seconds: the profile's unit
    assert lines[2] == f"  predicted makespan {predicted * 1000:.1f} ms"


def test_a_unitless_prediction_says_it_is_not_in_ms(capsys):
    rc, out, _ = _cli(capsys, "run", "1f1b(p=2, m=2)", "--model", "tiny-text", "--in-process")
    lines = out.splitlines()
    assert lines.pop(1) == "  ran: the built-in model tiny-text (8 LLM layers of width 32, no encoder) on 2 ranks (gloo, CPU)"
    assert rc == 0 and lines[1].endswith(" ms")
    # the model's own workload (model:tiny-text) is in abstract units
    number = lines[2].removeprefix("  predicted makespan ").split(" ")[0]
    assert float(number) > 0 and lines[2] == (
        f"  predicted makespan {number} workload units (the workload states no time unit, so this is not in ms; "
        f"profile the model with `mpipe profile` for a workload in seconds)")


def test_a_run_on_another_models_workload_says_so_and_predicts_the_model_that_ran(capsys, tmp_path):
    # A saved analytic workload (Llama-2-7B on its device, tp=8, dp=4) launched on the built-in model: the
    # run names the model that ran and what of the layout it dropped (all of it: its tp has no plan to
    # run here, and a layout runs as a whole or not at all), predicts on that model's structure, and
    # shows the workload's own figures only as a comparison across models.
    from mpipe_core.api import evaluate
    from mpipe_core.workloads.presets import preset_document

    doc = dict(preset_document("llama2-7b"), parallel={"tp": 8, "dp": 4})
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(doc))
    rc, out, err = _cli(capsys, "run", "1f1b(p=2, m=2)", "--workload", str(path), "--in-process")
    assert rc == 0, err
    lines = out.splitlines()
    layers = evaluate("1f1b(p=2, m=2)", doc).workload.llm.layers
    assert lines[1:4] == [
        f"  ran: the built-in model sized from the workload ({layers} LLM layers of width 32, no encoder) "
        f"on 2 ranks (gloo, CPU)",
        f"  workload: llama2-7b (model {doc['model']} on {doc['device']}), another model: a comparison with it "
        f"is across models, not a prediction of this run",
        "  dropped from the workload's layout: tp=8, dp=4 (it spans 64 devices; this run executed the "
        "2-device pipeline)"]
    predicted = [line for line in lines if "predicted makespan" in line]
    assert len(predicted) == 1 and predicted[0].endswith("(on model:built-in, the structure of the model that ran)")
    assert "workload units" in predicted[0]
    across = [line for line in lines if line.startswith("  across models (not a prediction of this run): ")]
    assert len(across) == 2 and "workload llama2-7b simulates a makespan of" in across[0]
    assert "memory in bytes: predicted by workload llama2-7b" in across[1]
    rc, out, _ = _cli(capsys, "run", "1f1b(p=2, m=2)", "--workload", str(path), "--in-process", "--json")
    doc_out = json.loads(out)
    assert doc_out["same_model"] is False and doc_out["predicted_workload"] == "model:built-in"
    assert doc_out["across_models"]["workload"] == "llama2-7b" and doc_out["ran"][0] == lines[1].strip()


def test_unrunnable_terms_are_refused_before_launch(capsys):
    assert main(["run", "repeat(1f1b(p=2, m=2), n=2)", "--model", "tiny-text"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert main(["run", "interleaved(p=4, m=4, v=4)", "--model", "tiny-text"]) == 2
    assert "16 chunks" in capsys.readouterr().err
    assert main(["run", "1f1b(p=2, m=2)", "--model", "nope"]) == 2
    assert "error: --model nope: unknown model (presets: tiny," in capsys.readouterr().err


@pytest.mark.parametrize("nproc", ["2", "5"])
def test_disaggregate_on_another_rank_count_names_p_and_k(capsys, nproc):
    term = "encoder_batch(disaggregate(1f1b(p=2, m=4), encoder_devices=2), 2)"
    assert _cli(capsys, "run", term, "--nproc", nproc, "--in-process") == (
        2, "", f"error: the schedule places ops on 4 devices (p + k = 2 LLM + 2 encoder devices of "
               f"disaggregate) but {nproc} x 1 ranks were asked for\n")


def test_the_deployed_layouts_run_in_process(capsys):
    """`mpipe run` executes colocated(...), encoder_batch(...) and disaggregate(...) (p + k ranks)."""
    for term, ranks, kinds in [("colocated(1f1b(p=2, m=4))", 2, {"GATHER", "SCATTER", "AR"}),
                               ("encoder_batch(1f1b(p=2, m=4), 2)", 2, {"F", "BW"}),
                               ("disaggregate(1f1b(p=2, m=4), encoder_devices=1)", 3, {"F", "BW"})]:
        rc, out, err = _cli(capsys, "run", term, "--in-process", "--check-grads", "--json")
        doc = json.loads(out)
        assert rc == 0 and doc["grad_check"]["ok"] and doc["devices"] == ranks, err
        assert kinds <= {r["kind"] for r in doc["timeline"] if r["module"] == "vision"}


def test_hccl_without_torch_npu_is_a_clear_error(capsys):
    assert main(["run", "1f1b(p=2, m=2)", "--model", "tiny-text", "--backend", "hccl"]) == 2
    assert "torch_npu" in capsys.readouterr().err


# --------------------------------------------------------------------------- own models

@pytest.mark.parametrize("args,message", [
    (["--model", "examples.nope:build"], "error: --model examples.nope:build: cannot import module "
     "'examples.nope': ModuleNotFoundError: No module named 'examples.nope'\n"),
    (["--model", "examples.tiny_mllm:build", "--model-config", "huge"], "error: --model "
     "examples.tiny_mllm:build: the factory raised ValueError: unknown config 'huge' (tiny, frozen)\n"),
    (["--model", "hf:/no/such/checkpoint"], "error: hf:/no/such/checkpoint: the checkpoint folder does "
     "not exist (hf:NAME is one of llava, qwen2_5_vl; hf:/path is a local save_pretrained folder)\n"),
])
@pytest.mark.parametrize("command", ["run", "profile"])
def test_bad_own_models_are_one_line_exit_2(capsys, command, args, message):
    argv = ["run", "1f1b(p=2, m=4)", *args] if command == "run" else ["profile", *args]
    assert _cli(capsys, *argv) == (2, "", message)


def test_a_bad_plugin_exits_2_with_one_line_and_no_traceback():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "mpipe_cli.main", "run", "1f1b(p=2, m=4)", "--model",
                           "examples.tiny_mllm:nope"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("error: --model examples.tiny_mllm:nope: module 'examples.tiny_mllm' has no "
                           "callable 'nope'\n")


def test_profile_writes_a_workload_that_eval_accepts(capsys, tmp_path):
    out = tmp_path / "llava.json"
    rc, _, err = _cli(capsys, "profile", "--model", "hf:llava", "--model-config", "tiny", "--microbatch-size",
                      "2", "--seq-len", "16", "--warmup", "1", "--repeats", "3", "-o", str(out))
    assert rc == 0, err
    assert "[2/7] layer 0" in err and "[7/7] done" in err  # progress while measuring
    doc = json.loads(out.read_text())
    assert doc["origin"]["model"] == {"model": "hf:llava", "config": "tiny",
                                      "shape": {"microbatch_size": 2, "images": 1, "text_len": 16, "seed": 0}}
    llm, (enc,) = doc["llm"], doc["encoders"]
    assert llm["layers"] == 4 and all(len(llm["layer_costs"][k]) == 4 for k in "FBW")
    assert all(t > 0 for k in "FBW" for t in llm["layer_costs"][k])
    assert llm["boundary_bytes"] == 2 * (1 + 4 + 16) * 32 * 4  # batch x seq x width x float32
    assert enc["trainable"] and enc["output_bytes"] == 4 * 32 * 4 and enc["input_bytes"] == 3 * 8 * 8 * 4
    assert enc["images"] == {"min": 2, "max": 2, "seed": 0}  # 2 samples x 1 image
    rc, text, err = _cli(capsys, "eval", "transpose(1f1b(p=2, m=4))", "--workload", str(out), "--json")
    assert rc == 0, err
    summary = json.loads(text)
    # The prediction is the measured costs laid out: at least one microbatch's
    # encoder, every layer's F+B+W and the head, in seconds.
    one = sum(sum(llm["layer_costs"][k]) for k in "FBW") + sum(llm["head"][k] for k in "FBW") + 2 * enc["f"]
    assert summary["makespan"] >= one
    # Memory in bytes, as a rank counts it: per layer (less under recompute: full keeps the layer's
    # input, a batch x seq x width float32 tensor), the embedding's and the head's, the encoder's per
    # image, and static bytes: parameters + gradients + SGD momentum, 3 x 4 bytes per parameter.
    assert doc["units"] == {"time": "s", "memory": "bytes"} and doc["origin"]["optimizer"] == "sgd"
    assert llm["recompute"]["full"] == {"activation": llm["boundary_bytes"]}
    assert 0 < llm["recompute"]["selective"]["activation"] < llm["activation"]
    assert llm["embed"]["activation"] > 0 and llm["head"]["activation"] > 0 and enc["activation"] > 0
    layer_params = sum(p.numel() for p in _llava_layer().parameters())
    assert llm["static"]["layer"] == 12 * layer_params and enc["replica_static"] < enc["static"]
    assert summary["peak_memory"][0] > summary["static_memory"][0] == pytest.approx(
        enc["static"] + llm["static"]["embed"] + 2 * llm["static"]["layer"])


def _llava_layer():
    from executor.runtime.models.loader import load_model
    from mpipe_core.runs.model_spec import BatchShape, ModelSpec

    return load_model(ModelSpec("hf:llava", "tiny", BatchShape(microbatch_size=2, text_len=16))).layers[0]
