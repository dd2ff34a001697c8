"""`mpipe compare-run RUN --explain` on synthetic runs with a known injected cause:
the recorded timings are the simulator's own timeline (milliseconds) with one op
slowed, or every transfer delayed; predicted on the unchanged workload, the
explanation must put the gap on that cause."""
from __future__ import annotations

import json

import pytest
from worker_helpers import mpipe

from mpipe_core.api import evaluate
from mpipe_core.ir.timeline_record import TimelineRecord

TERM = "transpose(1f1b(p=2, m=4), mode=dynamic)"
WORKLOAD = {"name": "synthetic",
            "llm": {"layers": 2, "f": 1.0, "b": 1.0, "w": 1.0},
            "encoders": [{"name": "vision", "f": [3.0, 3.0, 3.0, 3.0], "b": 0.0, "w": 0.0, "trainable": False}],
            "link": {"latency": 0.1, "bandwidth": None}}


def _run_with(db, measured_workload: dict, steps: int = 3, dispatch: float = 0.0) -> int:
    """A finished run of TERM whose timings are TERM simulated on `measured_workload`;
    `dispatch` (ms): each op starts that much later and ends as simulated, so it
    spends that part of its cost in dispatch before it starts."""
    from storage import add_timings, claim_next_run, enqueue, finish_run

    run = enqueue(db, "t", steps=steps)
    claim_next_run(db, "w", 60)
    ev = evaluate(TERM, WORKLOAD)  # the placement the saved version has
    from mpipe_core.simulation.simulator import simulate
    from mpipe_core.workloads.workload import load_workload

    tl = simulate(ev.schedule, load_workload(measured_workload))
    rows = []
    for step in range(steps):
        base = 10.0 + step * (tl.makespan + 5.0)
        for op, d, s, e in tl.rows():
            rows.append(TimelineRecord.of(op._replace(step=step), d, (base + s + dispatch) / 1000,
                                          (base + e) / 1000))
    add_timings(db, run.id, rows)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    return run.id


@pytest.fixture()
def setup(tmp_path):
    from storage import open_database, save_schedule

    path = tmp_path / "wl.json"
    path.write_text(json.dumps(WORKLOAD))
    url = f"sqlite:///{tmp_path / 'mpipe.db'}"
    db = open_database(url)
    save_schedule(db, "t", TERM, workload=str(path), author="tester")
    yield db, url, str(path)
    db.close()


def _causes(cmp) -> dict[str, dict]:
    return {e["cause"]: e for e in cmp.explanation}


def test_a_slowed_op_is_named_with_its_size(setup):
    from executor.analysis.compare_run import compare_run

    db, url, path = setup
    ev = evaluate(TERM, WORKLOAD)
    mb = next(op.mb for op, d, _, _ in ev.timeline.rows() if op.module == "vision" and d == 1)
    slowed = json.loads(json.dumps(WORKLOAD))
    slowed["encoders"][0]["f"][mb] += 2.0
    run = _run_with(db, slowed)
    cmp = compare_run(db, run, workload=path, explain=True)
    causes = _causes(cmp)
    assert cmp.measured_ms - cmp.other_ms > 0.5
    assert causes["op:vision F on device 1"]["gap_ms"] == pytest.approx(2.0)
    assert sum(e["gap_ms"] for e in cmp.explanation) == pytest.approx(cmp.measured_ms - cmp.other_ms)
    assert all(abs(e["gap_ms"]) < 1e-6 for e in cmp.explanation
               if e["cause"] not in ("op:vision F on device 1", "critical path elsewhere"))
    out = mpipe("compare-run", str(run), "--db", url, "--workload", path, "--explain")
    assert out.returncode == 0, out.stderr
    assert "the gap by cause" in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("op:vision F on device 1"))
    assert "+2.00" in line


def test_a_delayed_transfer_is_named(setup):
    from executor.analysis.compare_run import compare_run

    db, url, path = setup
    run = _run_with(db, dict(WORKLOAD, link={"latency": 0.6, "bandwidth": None}))
    cmp = compare_run(db, run, workload=path, explain=True)
    causes = _causes(cmp)
    biggest = cmp.explanation[0]
    assert biggest["cause"] == "transfer waits"
    assert biggest["gap_ms"] == pytest.approx(0.5 * biggest["ops"])
    assert all(abs(e["gap_ms"]) < 1e-6 for e in cmp.explanation if e["cause"].startswith("op:"))
    assert causes["transfer waits"]["gap_ms"] + causes["critical path elsewhere"]["gap_ms"] == pytest.approx(
        cmp.measured_ms - cmp.other_ms)
    doc = json.loads(mpipe("compare-run", str(run), "--db", url, "--workload", path, "--explain",
                           "--json").stdout)
    assert doc["explanation"][0]["cause"] == "transfer waits"


def test_the_fitted_dispatch_is_taken_out_of_each_op_s_predicted_time(setup):
    # Every op waits 0.05 ms, then computes 0.05 less than the prediction's cost.  The run's fitted
    # overhead (the mean gap before ops whose inputs were there) is a little under 0.05: each device's
    # first op starts the step and shows no gap.  The explanation counts that overhead of each op on
    # the path as dispatch, not op time, so an op group's gap is (overhead - 0.05) per op.
    from executor.analysis.compare_run import compare_run

    db, url, path = setup
    run = _run_with(db, WORKLOAD, dispatch=0.05)
    cmp = compare_run(db, run, workload=path, explain=True)
    causes = _causes(cmp)
    overhead = cmp.overhead_ms
    assert 0.04 < overhead < 0.05
    groups = [e for e in cmp.explanation if e["cause"].startswith("op:")]
    assert groups and all(e["gap_ms"] == pytest.approx((overhead - 0.05) * e["ops"]) for e in groups)
    path_ops = sum(e["ops"] for e in groups)
    assert causes["dispatch"]["predicted_ms"] == pytest.approx(overhead * path_ops)
    assert sum(e["gap_ms"] for e in cmp.explanation) == pytest.approx(cmp.measured_ms - cmp.other_ms)


def test_explain_refuses_another_term(setup):
    db, url, path = setup
    run = _run_with(db, WORKLOAD, steps=2)
    out = mpipe("compare-run", str(run), "--db", url, "--against", "1f1b(p=2, m=4)", "--explain")
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: --explain splits the gap to the prediction of the run's own term: "
                                  "leave out --against")


def test_a_profiled_workload_in_seconds_is_explained_in_ms(tmp_path):
    # `mpipe profile`'s output states its times in seconds.  A run recorded exactly as that workload
    # simulates: each op's predicted time is its profiled cost in ms (not 0), and the gaps by cause
    # add up to measured - predicted (about 0), not to the measured makespan.
    from executor.analysis.compare_run import compare_run
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.profile import profile_model
    from mpipe_core.runs.model_spec import ModelSpec
    from mpipe_core.simulation.simulator import simulate
    from mpipe_core.workloads.workload import load_workload
    from storage import add_timings, claim_next_run, enqueue, finish_run, open_database, save_schedule

    spec = ModelSpec("tiny")
    profiled = profile_model(load_model(spec), spec, warmup=0, repeats=1)
    assert profiled["units"]["time"] == "s"
    path = tmp_path / "profiled.json"
    path.write_text(json.dumps(profiled))
    term = "1f1b(p=2, m=4)"
    url = f"sqlite:///{tmp_path / 'mpipe.db'}"
    db = open_database(url)
    save_schedule(db, "t", term, workload=str(path), author="tester")
    timeline = simulate(evaluate(term, profiled).schedule, load_workload(profiled))
    run = enqueue(db, "t", steps=3)
    claim_next_run(db, "w", 60)
    rows = []
    for step in range(3):
        base = 0.01 + step * (timeline.makespan + 0.005)  # seconds, as a run records them
        rows += [TimelineRecord.of(op._replace(step=step), d, base + s, base + e) for op, d, s, e in timeline.rows()]
    add_timings(db, run.id, rows)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    cmp = compare_run(db, run.id, workload=str(path), explain=True)
    db.close()
    assert cmp.other_ms == pytest.approx(timeline.makespan * 1000) and cmp.other_ms > 1
    groups = [e for e in cmp.explanation if e["cause"].startswith("op:")]
    assert groups and all(e["predicted_ms"] == pytest.approx(e["measured_ms"], rel=1e-6, abs=1e-9)
                          and e["predicted_ms"] > 0 for e in groups), groups
    total = sum(e["gap_ms"] for e in cmp.explanation)
    assert total == pytest.approx(cmp.measured_ms - cmp.other_ms, abs=1e-6)
    assert abs(total) < 0.01 * cmp.measured_ms  # not the measured makespan
    doc = json.loads(mpipe("compare-run", str(run.id), "--db", url, "--workload", str(path), "--explain",
                           "--json").stdout)
    assert [e["predicted_ms"] for e in doc["explanation"] if e["cause"].startswith("op:")] == pytest.approx(
        [e["predicted_ms"] for e in groups])
