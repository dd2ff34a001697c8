"""A finished run keeps what each rank measured about memory (`finish_run(...,
memory=...)`, migration 0005), and `compare-run` sets it against the
prediction per device.  The run's job is the one the worker would launch
(`prepare_run` of the claimed run), run with ranks as threads."""
from __future__ import annotations

import json

import pytest
from worker_helpers import mpipe

TERM = "recompute(zbv(p=2, m=4), layers=[1, 0, 1, 0])"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.profile import profile_model
    from executor.runtime.rank import run_local
    from executor.service.run_setup import prepare_run
    from mpipe_core.runs.model_spec import ModelSpec
    from storage import add_timings, claim_next_run, enqueue, finish_run, open_database, save_schedule

    folder = tmp_path_factory.mktemp("memory")
    spec = ModelSpec("tiny")
    path = folder / "tiny-profile.json"
    path.write_text(json.dumps(profile_model(load_model(spec), spec, warmup=0, repeats=1)))
    url = f"sqlite:///{folder / 'mpipe.db'}"
    db = open_database(url)
    save_schedule(db, "r", TERM, workload=str(path), author="tester")
    run = enqueue(db, "r", steps=2, options={"model": "tiny"}, launched_by="tester")
    claimed = claim_next_run(db, "w", 60)
    (result,) = run_local([prepare_run(claimed).job], 2)
    add_timings(db, run.id, result.timeline, worker_id="w", attempt=claimed.attempt)
    finish_run(db, run.id, "w", "succeeded", exit_code=0, memory=result.memory)
    bare = enqueue(db, "r", launched_by="tester")  # a run that recorded no memory
    yield {"db": db, "url": url, "run": run.id, "bare": bare.id, "measured": result.memory}
    db.close()


def test_the_run_keeps_each_ranks_measured_memory(recorded):
    from storage import memory_for

    keys = ("rank", "activation_peak", "activation_peak_op", "parameters", "gradients", "optimizer")
    assert memory_for(recorded["db"], recorded["run"]) == [{k: m[k] for k in keys} for m in recorded["measured"]]
    assert memory_for(recorded["db"], recorded["run"], attempt=2) == []
    assert memory_for(recorded["db"], recorded["bare"]) == []


def test_compare_run_sets_the_prediction_against_the_measured_memory(recorded):
    from executor.analysis.compare_run import compare_run
    from executor.analysis.memory_check import TOLERANCE

    cmp = compare_run(recorded["db"], recorded["run"])
    memory = cmp.memory
    assert memory.unit == "bytes" and [d.device for d in memory.devices] == [0, 1]
    assert memory.within() is True
    for d, measured in zip(memory.devices, recorded["measured"]):
        assert d.measured_activation == measured["activation_peak"]
        assert abs(memory.activation_ratio(d) - 1) <= TOLERANCE
        assert memory.static_ratio(d) == 1.0  # parameters + gradients + momentum, exactly as profiled
    doc = cmp.as_dict(timelines=False)["memory"]
    assert doc["within_tolerance"] is True and doc["devices"][1]["measured_static"] == memory.devices[1].measured_static

    out = mpipe("compare-run", str(recorded["run"]), "--db", recorded["url"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("memory in bytes: predicted by workload calibrated")))
    assert lines[head + 1].split() == ["device", "activation", "predicted", "measured", "ratio", "static",
                                       "predicted", "measured", "ratio", "peak", "in"]
    row = lines[head + 2].split()
    assert row[0] == "0" and row[2] == f"{memory.devices[0].measured_activation:,}" and row[-1] == "llm:0B0"


def test_a_memory_row_the_storage_cannot_take_is_refused_with_one_line(recorded):
    from storage import claim_next_run, finish_run
    from storage.errors import InvalidValueError

    claim_next_run(recorded["db"], "w2", 60)  # the bare run
    with pytest.raises(InvalidValueError) as caught:
        finish_run(recorded["db"], recorded["bare"], "w2", "succeeded",
                   memory=[{"rank": 0, "activation_peak": -1, "parameters": 0, "gradients": 0, "optimizer": 0}])
    assert caught.value.message == (f"memory row for run {recorded['bare']}: 'activation_peak' must be a whole "
                                    "number >= 0, got -1")
