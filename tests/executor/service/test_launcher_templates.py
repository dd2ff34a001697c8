"""The example launcher templates (issue 39 section 8): the worker fills the Slurm
line and the AscendJob line as it fills any template, and the AscendJob's pods
map the Ascend Operator's WORLD_SIZE (all NPUs), RANK (the pod's index) and
LOCAL_WORLD_SIZE (NPUs per pod) to torchrun's node arguments."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from executor.service.pod_torchrun import PodEnvironmentError, torchrun_args
from executor.service.queue_worker import check_template, fill_template

ROOT = Path(__file__).resolve().parents[3]
LAUNCHERS = ROOT / "examples" / "launchers"
ENTRY = ["-m", "executor.runtime.rank", "--jobs", "/shared/runs/r 1/jobs.json", "--run-dir", "/shared/runs/r 1",
         "--backend", "hccl", "--timeout", "150", "--run-id", "mpipe-run7-abc"]


def _fields(run_dir="/shared/runs/r 1"):
    return {"nnodes": 2, "nproc_per_node": 8, "nproc": 16, "rdzv": "head:29400", "rdzv_host": "head",
            "rdzv_port": 29400, "rdzv_id": "mpipe-run7-abc", "run_id": 7, "run_dir": run_dir, "backend": "hccl",
            "python": "/venv/bin/python", "torchrun": ["/venv/bin/python", "-m", "torch.distributed.run"],
            "entry": ENTRY}


def test_the_slurm_template_starts_torchrun_on_every_node():
    template = check_template((LAUNCHERS / "slurm.launcher").read_text().strip())
    assert fill_template(template, _fields()) == [
        "srun", "-N", "2", "--ntasks-per-node", "1", "/venv/bin/python", "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400",
        "--rdzv-id", "mpipe-run7-abc", "--max-restarts", "0", *ENTRY]


def test_the_ascendjob_template_renders_a_job_whose_pods_run_torchrun(tmp_path):
    template = check_template((LAUNCHERS / "ascendjob.launcher").read_text().strip())
    run_dir = tmp_path / "runs" / "r 1"
    run_dir.mkdir(parents=True)
    cmd = fill_template(template, _fields(str(run_dir)))
    assert cmd[:3] == ["/venv/bin/python", "-m", "executor.service.ascend_job"]
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--npus-per-pod") + 1] == "8"
    assert cmd[cmd.index("--") + 1:] == ENTRY
    # What the launcher would create: the manifest, rendered for real (--dry-run stops before kubectl).
    dry = [sys.executable, *cmd[1:cmd.index("--")], "--dry-run", *cmd[cmd.index("--"):]]
    out = subprocess.run(dry, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    job = yaml.safe_load(out.stdout)
    assert (job["kind"], job["metadata"]["name"], job["spec"]["schedulerName"]) == ("AscendJob", "mpipe-7", "volcano")
    specs = job["spec"]["replicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1  # two pods in all
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["command"] == ["python", "-m", "executor.service.pod_torchrun", "--rdzv-id",
                                        "mpipe-run7-abc", "--", *ENTRY]
        assert container["resources"]["limits"] == {"huawei.com/Ascend910": 8}
        assert container["volumeMounts"][0]["mountPath"] == str(run_dir.parent)


def test_a_pod_maps_the_operator_environment_to_torchrun():
    env = {"WORLD_SIZE": "16", "RANK": "1", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "mpipe-7-master-0",
           "MASTER_PORT": "29500"}
    assert torchrun_args(env, "mpipe-run7-abc") == [
        "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "mpipe-7-master-0:29500", "--rdzv-id", "mpipe-run7-abc", "--max-restarts", "0"]


@pytest.mark.parametrize("change,message", [
    ({"WORLD_SIZE": "12"}, "WORLD_SIZE=12 is not a multiple of LOCAL_WORLD_SIZE=8"),
    ({"RANK": "2"}, "RANK=2 but the job has 2 pods"),
    ({"LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE='x': expected a whole number >= 1"),
])
def test_a_pod_refuses_an_environment_that_is_not_an_ascendjobs(change, message):
    env = {"WORLD_SIZE": "16", "RANK": "1", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "m", "MASTER_PORT": "1", **change}
    with pytest.raises(PodEnvironmentError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        torchrun_args(env, "id")
