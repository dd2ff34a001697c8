"""Own models over torchrun + gloo at P=2: HF tiny LLaVA, HF tiny Qwen2.5-VL
(also loaded back from a `save_pretrained` folder) and the examples plug-in,
the whole schedule matrix in ONE launch (starting ranks costs seconds here)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from own_model_matrix import SHAPE, matrix_jobs, own_job

from executor.service.launch import LaunchOptions, launch
from bounds import EVENT_S

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def test_every_own_model_schedule_matches_the_unpipelined_model(tmp_path):
    from executor.runtime.models.loader import load_model
    from mpipe_core.runs.model_spec import ModelSpec

    ckpt = tmp_path / "qwen"
    load_model(ModelSpec("hf:qwen2_5_vl", "tiny", SHAPE)).root.save_pretrained(ckpt)
    jobs = matrix_jobs("llava") + matrix_jobs("qwen2_5_vl") + matrix_jobs("example")
    jobs.append(own_job("transpose(zbv(p=2, m=4), mode=dynamic, shards=2, backward=owner)",
                        ModelSpec(f"hf:{ckpt}", None, SHAPE)))
    results = launch(jobs, LaunchOptions(nproc=2, stall_s=120, run_dir=str(tmp_path / "run")))
    assert [r.name for r in results] == [j.name for j in jobs]
    bad = [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in results
           if not r.grad_check["ok"]]
    assert not bad
    kinds = {r.name: {row.kind for row in r.timeline if row.module != "llm"} for r in results}
    assert any({"BCAST", "R"} <= k for k in kinds.values())  # recompute backward ran
    assert any({"BCAST", "AR"} <= k for k in kinds.values())  # owner backward ran


def _mpipe(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "mpipe_cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=EVENT_S)


def test_cli_runs_an_hf_model_with_the_gradient_check():
    proc = _mpipe("run", "transpose(interleaved(p=2, m=4, v=2), mode=prefix)", "--model", "hf:llava",
                  "--model-config", "tiny", "--images", "2", "--check-grads", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["grad_check"]["ok"] and out["model"]["model"] == "hf:llava"
    assert {"BCAST", "R"} <= {r["kind"] for r in out["timeline"]}
