"""The real thing: torchrun + gloo, several schedules per launched process group.

Starting ranks costs ~7-15 s on these machines, so each launch runs a whole
list of jobs and reports per-job gradient errors."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.errors import RunFailed
from executor.service.launch import LaunchOptions, _pids_with, launch

from executor_matrix import TEXT, job, kinds_in, required_jobs
from bounds import EVENT_S

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def _report(results):
    lines = []
    for r in results:
        g = r.grad_check
        lines.append(f"{r.name}: ok={g['ok']} max_abs={g['max_abs_error']:.2e} "
                     f"max_rel={g['max_rel_error']:.2e} loss_err={g['loss_error']:.2e}")
    print("\n".join(lines))
    return lines


@pytest.mark.parametrize("p", [2, 4])
def test_required_schedules_match_the_reference(p, tmp_path):
    jobs = required_jobs(p)
    kinds = {j.name: kinds_in(j) for j in jobs}
    # The transpose variants really exercise broadcast, recompute and all-reduce.
    assert any({"BCAST", "R"} <= k for k in kinds.values())
    assert any({"BCAST", "AR"} <= k for k in kinds.values())
    results = launch(jobs, LaunchOptions(nproc=p, stall_s=60, run_dir=str(tmp_path)))
    assert [r.name for r in results] == [j.name for j in jobs]
    _report(results)
    bad = [r.name for r in results if not r.grad_check["ok"]]
    assert not bad
    for r in results:
        assert r.devices == p and all(s > 0 for s in r.makespan)
        assert len(r.clock_offsets) == p
        # every rank measured its memory: what it saved for backward, and its parameters
        assert [m["rank"] for m in r.memory] == list(range(p))
        assert all(m["activation_peak"] > 0 and m["parameters"] > 0 for m in r.memory)


def _no_processes_left(run_dir):
    deadline = time.monotonic() + EVENT_S
    while time.monotonic() < deadline:
        if not _pids_with(str(run_dir)):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("kind,expect", [
    ("raise", "rank 1 failed in op llm:1F2 (step 0, computing) [job bad]: RuntimeError: injected fault"),
    ("exit", "rank 1 died during op llm:1F2"),
    ("hang", "rank 1 hung in op llm:1F2"),
])
def test_a_failing_rank_ends_the_run_naming_rank_and_op(kind, expect, tmp_path):
    jobs = [job("1f1b(p=2, m=4)", TEXT),
            job("1f1b(p=2, m=4)", TEXT, fault={"rank": 1, "op": "llm:1F2", "kind": kind})]
    jobs[1].name = "bad"
    with pytest.raises(RunFailed) as info:  # a hang ends at the 6 s stall limit, named as such
        launch(jobs, LaunchOptions(nproc=2, stall_s=6, run_dir=str(tmp_path)))
    assert expect in str(info.value)
    assert info.value.rank == 1 and info.value.op == "llm:1F2"
    assert len(info.value.results) == 1 and info.value.results[0].grad_check["ok"]
    assert _no_processes_left(tmp_path)


def _run_tiny_text(term: str, steps: int) -> dict:
    """`mpipe run TERM --model tiny-text --check-grads --json` as a user runs it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "mpipe_cli.main", "run", term,
                           "--model", "tiny-text", "--steps", str(steps), "--check-grads", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=EVENT_S)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cli_runs_a_term_and_checks_gradients():
    out = _run_tiny_text("zb_h1(p=2, m=4)", steps=2)
    assert out["grad_check"]["ok"] and len(out["makespan"]) == 2
    assert out["predicted_makespan"] > 0
    assert {r["kind"] for r in out["timeline"]} == {"F", "B", "W"}


def test_a_partitioned_schedule_runs_its_split_and_matches_the_reference():
    """partition(...) runs under torchrun with chunk 0 holding 2 of the 8 layers and chunk 1 the
    other 6 (the plan's split: test_model.py), and loss and gradients equal the single-process model's."""
    out = _run_tiny_text("partition(1f1b(p=2, m=4), [2, 6])", steps=1)
    assert out["grad_check"]["ok"], out["grad_check"]
