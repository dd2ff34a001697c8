"""Data parallelism over torchrun and gloo, one launch of 4 ranks (starting ranks
costs seconds): dp2 x pp2, pp2 x dp2 with ZeRO-1 (the collectives on the
process grid's DeviceMesh groups, ranks in tp-cp-dp-pp order), dp4 x pp1, and
a skipped ZeRO all-gather that the check must catch."""
import pytest

from executor.service.launch import LaunchOptions, launch

from executor_matrix import TEXT, job

pytestmark = pytest.mark.slow


def test_dp_and_zero1_over_gloo_match_the_global_batch(tmp_path):
    zero = {"dp": 2, "pp": 2, "distributed_optimizer": True}
    jobs = [job("1f1b(p=2, m=4)", TEXT, layout={"dp": 2, "pp": 2}),
            job("zbv(p=2, m=4)", TEXT, steps=2, layout=zero),
            job("1f1b(p=1, m=2)", TEXT, layout={"dp": 4, "pp": 1}),
            job("1f1b(p=2, m=4)", TEXT, layout=zero, fault={"kind": "skip_zero_gather", "global_rank": 3})]
    results = launch(jobs, LaunchOptions(nproc=4, stall_s=120, run_dir=str(tmp_path / "run")))
    assert [r.name for r in results] == [j.name for j in jobs]
    good, mutated = results[:3], results[3]
    bad = [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in good if not r.grad_check["ok"]]
    assert not bad
    assert not mutated.grad_check["ok"] and not mutated.grad_check["final_params_ok"]
    for r in good:
        assert {"dp_comm", "optimizer"} <= {c.kind for c in r.comm}
        assert all(c.end >= c.start for c in r.comm)
    assert "dp_gather" in {c.kind for c in results[1].comm}
    # Each rank streamed its steps; only the first pipeline's list ops, with its stage as the device.
    from executor.timing_stream import StepReader

    rows = StepReader(tmp_path / "run", world=4).poll(final=True)
    assert rows and {row.device for row in rows} == {0, 1}
