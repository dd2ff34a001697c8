"""`encoder_shard` over torchrun and gloo, one launch of 4 ranks: the copies'
collectives run on a process group of their own (created on every rank), beside
the process grid's dp groups.  colocated's two shares x dp 2 under ZeRO-1 with
the gradient sharded, and transpose's copies with a copy that skips the encoder's
all-gather, which the check must catch."""
import pytest

from executor.service.launch import LaunchOptions, launch

from executor_matrix import TRAIN, job

pytestmark = pytest.mark.slow


def test_encoder_shard_over_gloo_matches_the_global_batch(tmp_path):
    owner = "transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)"
    jobs = [job("colocated(1f1b(p=2, m=4))", TRAIN, steps=2,
                layout={"dp": 2, "pp": 2, "distributed_optimizer": True, "encoder_shard": "gradients"}),
            job(owner, TRAIN, layout={"dp": 2, "pp": 2, "encoder_shard": "gradients"},
                fault={"kind": "skip_encoder_gather", "global_rank": 1})]
    results = launch(jobs, LaunchOptions(nproc=4, stall_s=120, run_dir=str(tmp_path / "run")))
    assert [r.name for r in results] == [j.name for j in jobs]
    *good, mutated = results
    bad = [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in good if not r.grad_check["ok"]]
    assert not bad
    for r in good:
        assert {"dp_comm", "dp_gather", "optimizer"} <= {c.kind for c in r.comm}
    assert not mutated.grad_check["ok"] and not mutated.grad_check["final_params_ok"]
    assert all(f.startswith("vision.") for f in mutated.grad_check["steps"][-1]["failures"])
