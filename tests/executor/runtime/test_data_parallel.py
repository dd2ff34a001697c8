"""Data parallelism and ZeRO-1 (issue 39 section 3): the dp run's gradients,
reduced over replicas that each drew a different share of the global batch,
must equal one process's over the whole global batch; mutations (a replica's
gradient dropped, a ZeRO all-gather skipped) must fail that check.  Ranks as
threads here; test_data_parallel_torchrun.py repeats it over gloo."""
import pytest

from executor.runtime.rank import run_local

from executor_matrix import TEXT, TRAIN, job


def _run(term, cfg, layout, fault=None, steps=2):
    j = job(term, cfg, steps=steps, layout=layout, fault=fault)
    world = layout.get("dp", 1) * layout.get("pp", 1)
    (result,) = run_local([j], world)
    return result


@pytest.mark.parametrize("term,cfg,layout", [
    ("1f1b(p=2, m=4)", TEXT, {"dp": 2, "pp": 2}),
    ("zbv(p=2, m=4)", TEXT, {"dp": 2, "pp": 2, "distributed_optimizer": True}),
    ("transpose(1f1b(p=2, m=4), mode=prefix)", TRAIN, {"dp": 2, "pp": 2, "distributed_optimizer": True}),
], ids=["dp2-pp2-1f1b", "dp2-pp2-zbv-zero1", "dp2-pp2-transpose-encoder-zero1"])
def test_dp_gradients_equal_the_global_batch_reference(term, cfg, layout):
    # Two steps of zbv under ZeRO-1: the second step's gradients are taken at the gathered parameters.
    steps = 2 if term.startswith("zbv") else 1
    r = _run(term, cfg, layout, steps=steps)
    check = r.grad_check
    assert check["ok"], check["steps"][-1]["failures"][:3]
    assert check["final_params_ok"] and len(check["steps"]) == steps
    # The loss is the global batch's (every replica's last stage adds its share).
    assert abs(r.loss[0] - check["steps"][0]["reference_loss"]) <= 1e-5 * abs(r.loss[0])
    kinds = {row.kind for row in r.comm}
    assert {"dp_comm", "optimizer"} <= kinds
    assert ("dp_gather" in kinds) == bool(layout.get("distributed_optimizer"))
    assert len(r.memory) == 2 and {row.device for row in r.timeline} == {0, 1}  # the first pipeline's


def test_one_reduction_per_chunk_after_its_last_weight_gradient():
    r = _run("zbv(p=2, m=4)", TEXT, {"dp": 2, "pp": 2}, steps=1)
    for device in (0, 1):
        rows = [row for row in r.timeline if row.device == device]
        reductions = [c for c in r.comm if c.device == device and c.kind == "dp_comm"]
        assert sorted(c.chunk for c in reductions) == sorted({row.chunk for row in rows})  # once per chunk
        for c in reductions:
            last_w = max(row.end for row in rows if row.chunk == c.chunk and row.kind in ("W", "BW"))
            assert c.start >= last_w


@pytest.mark.parametrize("layout,fault", [
    ({"dp": 2, "pp": 2}, {"kind": "drop_dp_grad", "global_rank": 1}),
    ({"dp": 2, "pp": 2, "distributed_optimizer": True}, {"kind": "drop_dp_grad", "global_rank": 2}),
    ({"dp": 2, "pp": 2, "distributed_optimizer": True}, {"kind": "skip_zero_gather", "global_rank": 3}),
], ids=["dropped-replica", "dropped-replica-zero1", "skipped-zero-gather"])
def test_mutations_fail_the_gradient_check(layout, fault):
    # zbv; the skipped gather on rank 3 (stage 1, replica 1): it holds whole parameters outside its
    # slices, which only the gather updates (the check must compare all of them, not its slices only).
    r = _run("zbv(p=2, m=4)", TEXT, layout, fault=fault, steps=1)
    assert not r.grad_check["ok"]
    failures = r.grad_check["steps"][0]["failures"]
    if fault["kind"] == "skip_zero_gather":  # the gradients are right; the parameters after the step are not
        assert all("parameter after the last step" in f or "copies on ranks" in f for f in failures)
        assert not r.grad_check["final_params_ok"]
    else:
        assert any(": gradient off by" in f for f in failures)
