"""`encoder_shard` (issue 39 section 3): the trainable tower's copies (transpose's
two under `backward=owner`, in each of two dp replicas: N = 4) reduce its gradient
over all of them, each steps a quarter of it and the slices are gathered.  The
gradients must equal one process's over the global batch, every rank's static
memory must be the simulator's figure for that layout (on the model's profiled
workload), and a copy that skips the gather must fail the check.  The copies
also span cp, and a disaggregate encoder device's dp replicas.  Ranks as
threads; the gloo launch is test_encoder_shard_torchrun.py."""
import pytest

from executor.runtime.rank import run_local

from executor_matrix import TRAIN, job

TERM = "transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)"


@pytest.fixture(scope="module")
def profiled():
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.profile import profile_model
    from mpipe_core.runs.model_spec import ModelSpec

    spec = ModelSpec("tiny")
    return spec, profile_model(load_model(spec), spec, warmup=0, repeats=1)


def _run(profiled, mode, fault=None, **layout):
    """The run's result, and the simulator's metrics for it: the profiled workload with the
    encoder's state as the layout shards it (what `mpipe run`'s memory table uses)."""
    from executor.analysis.layout_memory import layout_metrics
    from executor.runtime.jobs import Job
    from mpipe_core.api import evaluate
    from mpipe_core.runs.layout import RunLayout
    from mpipe_core.workloads.workload import load_workload

    spec, doc = profiled
    layout = {"dp": 2, "pp": 2, "encoder_shard": mode, **layout}
    ev = evaluate(TERM, load_workload(doc))
    job = Job.make(TERM, ev.schedule, spec, steps=1, check_grads=True, layout=layout, fault=fault)
    (result,) = run_local([job], 4)
    return ev, layout_metrics(ev, RunLayout.from_dict(layout)), result


@pytest.mark.parametrize("mode", ["optimizer", "gradients"])
def test_sharded_encoder_is_exact_and_holds_the_simulated_static_memory(profiled, mode):
    from executor.analysis.memory_check import compare_memory

    ev, metrics, r = _run(profiled, mode)
    check = r.grad_check
    assert check["ok"], check["steps"][-1]["failures"][:3]
    assert check["final_params_ok"]
    # Each rank's parameters + kept gradient + optimizer state: the simulator's static memory
    # (the encoder's sharded part over N = 2 copies x dp 2), per rank of the first pipeline.
    memory = compare_memory(metrics, ev.workload.memory_unit, r.memory, ev.workload.name)
    ratios = [memory.static_ratio(d) for d in memory.devices]
    assert len(ratios) == 2 and all(abs(x - 1) <= 0.01 for x in ratios), ratios
    # The unsharded figure holds more on every rank (the prediction moved with the sharding).
    none = compare_memory(ev.metrics, ev.workload.memory_unit, r.memory, ev.workload.name)
    assert all(none.static_ratio(d) > 1.02 for d in none.devices)
    # The copies' reduction, sharded step and gather are timed (as the dp reduction's kinds).
    assert {"dp_comm", "dp_gather", "optimizer"} <= {c.kind for c in r.comm}


def test_a_copy_that_skips_the_encoder_gather_fails_the_check(profiled):
    # Rank 3 (stage 1 of replica 1) keeps its own slices only: its gradients are right, its
    # tower after the step is not (and differs from the other copies').
    _, _, r = _run(profiled, "gradients", fault={"kind": "skip_encoder_gather", "global_rank": 3})
    check = r.grad_check
    assert not check["ok"] and not check["final_params_ok"]
    failures = check["steps"][-1]["failures"]
    assert failures and all(f.startswith("vision.") for f in failures)
    assert all("parameter after the last step" in f or "copies on ranks" in f for f in failures)


def test_encoder_shard_with_data_is_refused_in_one_line():
    from executor.parallel.layout_checks import ModelDims, check_layout
    from mpipe_core.runs.layout import LayoutError, RunLayout

    check_layout(RunLayout(pp=2, dp=2, encoder_shard="gradients"), ModelDims("model m"))  # runs now
    with pytest.raises(LayoutError, match=r"^layout encoder_shard=optimizer with --data: each drawn step places "
                                          r"the encoder's copies anew, which a sharded state does not follow yet "
                                          r"\(use encoder_shard=none\)$"):
        check_layout(RunLayout(pp=2, encoder_shard="optimizer"), ModelDims("model m"), data=True)


@pytest.mark.parametrize("term,layout,world", [
    (TERM, {"cp": 2, "pp": 2, "dp": 2, "encoder_shard": "gradients"}, 8),  # N = 2 copies x dp 2 x cp 2
    ("disaggregate(1f1b(p=2, m=4), encoder_devices=1)", {"pp": 3, "dp": 2, "encoder_shard": "optimizer",
                                                         "distributed_optimizer": True}, 6),  # N = 1 x dp 2
], ids=["cp2-pp2-dp2-transpose", "disaggregate-dp2-zero1"])
def test_copies_span_cp_and_an_encoder_device(term, layout, world):
    (r,) = run_local([job(term, TRAIN, steps=2, layout=layout)], world)
    assert r.grad_check["ok"], r.grad_check["steps"][-1]["failures"][:3]
