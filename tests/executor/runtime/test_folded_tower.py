"""`balanced` with an encoder: the tower's layers run inside the LLM chunks it
folded them into, a chunk boundary inside the tower is a pipeline transfer,
and the gradients equal the single-process model's, under every generator.
Also: no term `tune` returns is refused by the executor's plan builder."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from executor.runtime.jobs import Job
from executor.runtime.model import ModelConfig
from executor.runtime.model_workload import workload_for
from executor.runtime.models.loader import load_model
from executor.runtime.models.tower import tower_layers
from executor.runtime.models.workload import model_workload
from executor.runtime.plan import ACT, GRAD, build_plan
from executor.runtime.rank import run_local
from mpipe_core.api import evaluate
from mpipe_core.runs.model_spec import BatchShape, ModelSpec
from mpipe_core.search.tune import tune
from mpipe_core.workloads.workload import load_workload

ROOT = Path(__file__).resolve().parents[3]
TRAIN = ModelConfig()
FROZEN = ModelConfig(trainable_encoder=False)
PLUGIN = ModelSpec("examples.tiny_mllm:build", None, BatchShape(microbatch_size=1, images=1, text_len=8))
PLUGIN_FROZEN = replace(PLUGIN, config="frozen")
GENERATORS = ["1f1b(p=2, m=4)", "interleaved(p=2, m=4)", "zb_h1(p=2, m=4)", "zbv(p=2, m=4)",
              "dualpipev(p=2, m=4)"]


def heavy(doc: dict, cost: float) -> dict:
    """The workload with a tower so costly that `balanced` cuts the chain inside it."""
    doc = json.loads(json.dumps(doc))
    doc["encoders"][0].update(f=cost, b=cost, w=cost)
    return doc


def builtin_workload(cfg: ModelConfig) -> dict:
    return heavy(workload_for(cfg), 20.0 if cfg.trainable_encoder else 100.0)


def plugin_workload(spec: ModelSpec) -> dict:
    return heavy(model_workload(load_model(spec)), 12.0 if spec.config is None else 30.0)


def folded_job(term: str, model, workload: dict, **kw) -> Job:
    ev = evaluate(f"balanced({term})" if not term.startswith(("balanced", "recompute")) else term,
                  load_workload(workload))
    pipe = ev.schedule.pipelines[0]
    # Folded across two stages: tower layers on both devices, the first chunk nothing but tower.
    devices = build_plan(ev.schedule).chunk_device
    assert len({devices[c] for c, n in enumerate(pipe.encoder_layers) if n}) == 2, pipe
    return Job.make(f"{model} {ev.term}", ev.schedule, model, check_grads=True, **kw)


def _passed(jobs):
    results = run_local(jobs, 2)
    assert [r.name for r in results] == [j.name for j in jobs]
    bad = [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in results if not r.grad_check["ok"]]
    assert not bad
    return results


@pytest.mark.parametrize("workload", [workload_for(TRAIN), builtin_workload(TRAIN), builtin_workload(FROZEN)],
                         ids=["tiny", "heavy-tower", "heavy-frozen-tower"])
def test_every_term_tune_returns_has_an_execution_plan(workload):
    workload = json.loads(json.dumps(workload))
    workload["llm"]["recompute"] = {"selective": {"activation": 0.5}, "full": {"activation": 0.1}}
    wl = load_workload(workload)
    found = tune(wl, 2, 4, time_limit=30)
    # Under a memory cap the fastest terms that miss it come back recomputed.
    cap = max(min(c.peak_memory for c in found.candidates), 0.7 * found.best.peak_memory)
    capped = tune(wl, 2, 4, memory_cap=cap, time_limit=30)
    terms = {c.term for r in (found, capped) for c in r.candidates + r.over_cap}
    assert any(t.startswith("balanced(") for t in terms)
    assert any("recompute(" in t for t in terms) == wl.encoders[0].trainable
    refused = {}
    for term in sorted(terms):
        try:
            build_plan(evaluate(term, wl).schedule)
        except Exception as error:  # noqa: BLE001 - every refusal is listed
            refused[term] = str(error)
    assert not refused


@pytest.mark.parametrize("spec", [None, PLUGIN], ids=["builtin", "example-plugin"])
def test_the_tower_chain_is_the_encoder_op_for_op(spec):
    model = load_model(spec) if spec is not None else Job.make("x", evaluate(
        "1f1b(p=2, m=4)", workload_for(TRAIN)).schedule, TRAIN).build_model()
    images = model.make_batch(0, 0, 4).images
    x = images
    for layer in tower_layers(model, len(model.encoder_layers)):
        x = layer(x)
    assert len(model.encoder_layers) == 2 and torch.equal(x, model.encoder(images))


def test_a_boundary_inside_the_tower_is_a_pipeline_transfer():
    ev = evaluate("balanced(1f1b(p=2, m=4))", load_workload(builtin_workload(TRAIN)))
    plan = build_plan(ev.schedule)
    assert plan.encoder_layers == (1, 1) and plan.layers == (0, 8) and plan.chunk_device == [0, 1]
    kinds = {e.what for e in plan.channel_edges[(0, 1)]} | {e.what for e in plan.channel_edges[(1, 0)]}
    assert kinds == {ACT, GRAD} and not plan.encoder  # no encoder ops: the chunks run the tower


def test_builtin_folded_tower_is_exact_under_every_generator():
    jobs = [folded_job(t, TRAIN, builtin_workload(TRAIN)) for t in GENERATORS]
    jobs.append(folded_job("recompute(balanced(zbv(p=2, m=4)), chunks=[0, 1])", TRAIN, builtin_workload(TRAIN)))
    jobs.append(folded_job("zbv(p=2, m=4)", TRAIN, builtin_workload(TRAIN), steps=2))
    jobs += [folded_job(t, FROZEN, builtin_workload(FROZEN)) for t in ("1f1b(p=2, m=4)", "zbv(p=2, m=4)")]
    # A frozen tower's layer recomputed on the rank after the boundary sends no gradient back.
    jobs.append(folded_job("recompute(balanced(zbv(p=2, m=4)), chunks=[1])", FROZEN, builtin_workload(FROZEN)))
    results = _passed(jobs)
    # The tower's first layer trained on rank 0, the rest of it on rank 1: each rank's
    # gradients were checked, so each part of the tower was.
    assert results[0].grad_check["steps"][0]["parameters"]["vision.patch_embed.weight"]["ranks"] == [0]
    assert results[0].grad_check["steps"][0]["parameters"]["vision.proj_out.weight"]["ranks"] == [1]


def test_example_plugin_folded_tower_is_exact():
    jobs = [folded_job(t, PLUGIN, plugin_workload(PLUGIN)) for t in ("1f1b(p=2, m=4)", "zbv(p=2, m=4)",
                                                                      "dualpipev(p=2, m=4)")]
    jobs.append(folded_job("zb_h1(p=2, m=4)", PLUGIN_FROZEN, plugin_workload(PLUGIN_FROZEN)))
    jobs.append(folded_job("recompute(balanced(1f1b(p=2, m=4)), chunks=[1])", PLUGIN_FROZEN,
                           plugin_workload(PLUGIN_FROZEN)))
    _passed(jobs)


def test_a_wrong_tower_gradient_fails_the_check():
    j = folded_job("1f1b(p=2, m=4)", TRAIN, builtin_workload(TRAIN))
    j.fault = {"rank": 0, "kind": "wrong_grad", "param": "vision.patch_embed.weight", "delta": 1e-3}
    (r,) = run_local([j], 2)
    assert not r.grad_check["ok"]
    assert r.grad_check["steps"][0]["failures"][0].startswith("vision.patch_embed.weight: gradient off by 0.001")


def _mpipe(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "mpipe_cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_tower_split_the_model_does_not_have_is_one_error_line(tmp_path):
    doc = plugin_workload(PLUGIN)
    doc["encoders"][0]["layers"] = 3
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    proc = _mpipe("run", "balanced(1f1b(p=2, m=4))", "--model", "examples.tiny_mllm:build", "--images", "1",
                  "--seq-len", "8", "--workload", str(path), "--in-process")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("error: the schedule folds 3 encoder layers into its chunks but the tower of model "
                           "'examples.tiny_mllm' splits into 2 (its encoder_layers); give the workload's encoder "
                           "layers: 2\n")


@pytest.mark.slow
def test_folded_towers_over_torchrun(tmp_path):
    """2 gloo ranks, --check-grads: the built-in model and the example plug-in, each with a
    trainable tower folded across the two stages."""
    from executor.service.launch import LaunchOptions, launch

    jobs = [folded_job("zbv(p=2, m=4)", TRAIN, builtin_workload(TRAIN)),
            folded_job("interleaved(p=2, m=4)", PLUGIN, plugin_workload(PLUGIN))]
    results = launch(jobs, LaunchOptions(nproc=2, stall_s=120, run_dir=str(tmp_path / "run")))
    assert [r.grad_check["ok"] for r in results] == [True, True]
    path = tmp_path / "plugin.json"
    path.write_text(json.dumps(plugin_workload(PLUGIN)))
    proc = _mpipe("run", "balanced(1f1b(p=2, m=4))", "--model", "examples.tiny_mllm:build", "--images", "1",
                  "--seq-len", "8", "--workload", str(path), "--check-grads", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["grad_check"]["ok"] and out["devices"] == 2
    # Each rank measured its own build (`models.materialise`: the plug-in gives `init_parameter`, so each
    # made real only its own parameters, which together are the whole model once).
    assert [m["rank"] for m in out["memory"]] == [0, 1] and all(m["build"]["peak"] > 0 for m in out["memory"])
    whole = sum(p.numel() * 4 for p in load_model(PLUGIN).root.parameters())
    assert sum(m["build"]["parameters"] for m in out["memory"]) == whole
