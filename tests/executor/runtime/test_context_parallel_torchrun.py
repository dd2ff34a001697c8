"""Context parallelism over torchrun and gloo, one launch of 4 ranks: cp2 x pp2
(K/V all-gathered by torch's functional collective on the mesh's cp group) and
cp2 x dp2 with ZeRO-1 (gradients reduce-scattered over the mesh's flattened
dp-cp group), each against one process over the whole sequence."""
import pytest

from executor.service.launch import LaunchOptions, launch

from executor_matrix import TEXT, job

pytestmark = pytest.mark.slow


def test_cp_over_gloo_matches_the_whole_sequence(tmp_path):
    jobs = [job("1f1b(p=2, m=4)", TEXT, layout={"cp": 2, "pp": 2}),
            job("1f1b(p=1, m=2)", TEXT, steps=2, layout={"cp": 2, "dp": 2, "distributed_optimizer": True})]
    results = launch(jobs, LaunchOptions(nproc=4, stall_s=120, run_dir=str(tmp_path / "run")))
    assert [r.name for r in results] == [j.name for j in jobs]
    bad = [(r.name, r.grad_check["steps"][-1]["failures"][:3]) for r in results if not r.grad_check["ok"]]
    assert not bad
    for r in results:
        assert {"cp_comm", "dp_comm", "optimizer"} <= {c.kind for c in r.comm}
        assert all(c.end >= c.start for c in r.comm)
    from executor.timing_stream import StepReader

    rows = StepReader(tmp_path / "run", world=4).poll(final=True)
    assert rows and {row.device for row in rows} == {0, 1}
    # Every pipeline streams (cp=0 and cp=1 here), its ops and its collectives with their kinds.
    for pipeline in (0, 1):
        mine = [r for r in rows if r.pipeline == pipeline]
        assert {r.kind for r in mine} >= {"F", "BW", "cp_comm", "dp_comm", "optimizer"}
        assert len([r for r in mine if r.kind == "cp_comm"]) == 2 * 8 * 4  # a gather and its backward
