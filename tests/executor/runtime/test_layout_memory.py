"""A profiled workload's static memory under a run's layout (issue 39, Memory): ZeRO-1
shards the optimizer's state over the dp reduction's ranks and keeps parameters and the
gradient whole, and every rank's measured static bytes must be the simulator's figure for
that layout (1.000 +- 0.01), including an uneven dp (3: the buckets are padded) and ZeRO-1
beside `encoder_shard`.  Ranks as threads."""
import pytest
from layout_static import static_ratios

from executor.runtime.rank import run_local


@pytest.fixture(scope="module")
def profiled():
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.profile import profile_model
    from mpipe_core.runs.model_spec import ModelSpec

    spec = ModelSpec("tiny")
    return spec, profile_model(load_model(spec), spec, warmup=0, repeats=1)


def _ratios(profiled, term, **layout):
    from executor.runtime.jobs import Job
    from mpipe_core.api import evaluate
    from mpipe_core.workloads.workload import load_workload

    spec, doc = profiled
    ev = evaluate(term, load_workload(doc))
    layout = {"pp": ev.schedule.devices, **layout}
    job = Job.make(term, ev.schedule, spec, steps=1, check_grads=True, layout=layout)
    (result,) = run_local([job], layout["pp"] * layout["dp"])
    assert result.grad_check["ok"], result.grad_check["steps"][-1]["failures"][:3]
    return static_ratios(doc, term, layout, result.memory)


@pytest.mark.parametrize("term, layout", [
    ("1f1b(p=2, m=4)", {"dp": 2, "distributed_optimizer": True}),
    ("zbv(p=2, m=4)", {"dp": 3, "distributed_optimizer": True}),
    ("transpose(1f1b(p=2, m=4), mode=prefix, backward=owner)",
     {"dp": 2, "distributed_optimizer": True, "encoder_shard": "gradients"}),
])
def test_zero1_static_memory_is_the_simulators_for_the_layout(profiled, term, layout):
    sharded, whole = _ratios(profiled, term, **layout)
    assert len(sharded) == 2 and all(abs(r - 1) <= 0.01 for r in sharded), sharded
    # The whole (unsharded) prediction is well above what ZeRO-1 keeps: the figure moved.
    assert all(r > 1.05 for r in whole), whole


def test_the_profile_splits_static_memory_and_a_wrong_split_is_refused(profiled):
    from mpipe_core.workloads.workload import WorkloadError, load_workload

    _, doc = profiled
    llm = doc["llm"]
    for part in ("layer", "embed", "head"):
        # SGD with momentum: parameters, an equal gradient, an equal momentum buffer.
        assert llm["param_bytes"][part] == llm["grad_bytes"][part] > 0
        assert llm["static"][part] == pytest.approx(3 * llm["param_bytes"][part])
    bad = {**doc, "llm": {**llm, "param_bytes": {**llm["param_bytes"], "head": llm["static"]["head"] * 2}}}
    with pytest.raises(WorkloadError) as caught:
        load_workload(bad)
    assert str(caught.value).startswith("llm.param_bytes.head (") and "is more than llm.static.head" in str(caught.value)
    with pytest.raises(WorkloadError, match=r"^llm\.grad_bytes\.layer: expected a number, got 'x'$"):
        load_workload({**doc, "llm": {**llm, "grad_bytes": {**llm["grad_bytes"], "layer": "x"}}})


def test_the_profile_writes_what_the_tp_plan_shards_and_tp_divides_only_that(profiled):
    from executor.analysis.layout_memory import tp_profile
    from mpipe_core.workloads.workload import load_workload

    _, doc = profiled
    llm, share = doc["llm"], doc["llm"]["tp_sharded"]
    # The layers' and the head's linears shard; their norms (and the embedding) stay whole.
    assert 0 < share["static"]["layer"] < llm["static"]["layer"]
    assert 0 < share["static"]["head"] < llm["static"]["head"]
    assert share["static"]["embed"] == 0
    assert share["param_bytes"]["layer"] == share["grad_bytes"]["layer"] == pytest.approx(share["static"]["layer"] / 3)
    (enc,) = doc["encoders"]
    assert 0 < enc["tp_sharded"]["static"] < enc["static"]  # the tower's blocks shard, its stem does not
    at2 = tp_profile(doc, 2)
    for part in ("layer", "embed", "head"):
        assert at2["llm"]["static"][part] == pytest.approx(llm["static"][part] - share["static"][part] / 2)
        assert at2["llm"]["param_bytes"][part] == pytest.approx(llm["param_bytes"][part] - share["param_bytes"][part] / 2)
    assert at2["encoders"][0]["static"] == pytest.approx(enc["static"] - enc["tp_sharded"]["static"] / 2)
    assert "tp_sharded" not in at2["llm"] and "tp_sharded" not in at2["encoders"][0]
    load_workload(at2)  # still a workload


def test_a_wrong_tp_share_is_refused_with_its_place(profiled):
    from mpipe_core.workloads.workload import WorkloadError, load_workload

    _, doc = profiled
    llm = doc["llm"]
    too_big = {**llm["tp_sharded"], "static": {**llm["tp_sharded"]["static"], "head": llm["static"]["head"] + 1}}
    with pytest.raises(WorkloadError, match=r"^llm\.tp_sharded\.static\.head \(\d+\) is more than llm\.static\.head "
                                            r"\(\d+\): it is the part of it tp shards$"):
        load_workload({**doc, "llm": {**llm, "tp_sharded": too_big}})
    with pytest.raises(WorkloadError, match=r"^llm\.tp_sharded: unknown key 'weights'"):
        load_workload({**doc, "llm": {**llm, "tp_sharded": {"weights": {}}}})
    enc = {**doc["encoders"][0], "tp_sharded": {"static": doc["encoders"][0]["static"] * 2}}
    with pytest.raises(WorkloadError, match=r"^encoders\[0\]\.tp_sharded\.static \(\d+\) is more than "
                                            r"encoders\[0\]\.static \(\d+\)"):
        load_workload({**doc, "encoders": [enc]})
