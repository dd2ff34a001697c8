"""Queued runs of the deployed layouts: a saved `colocated(...)` (and a grouped
`disaggregate(...)`) schedule is queued, prepared from the claimed record the
way the worker prepares it, executed (ranks as threads), its measured timings
stored, and `compare-run` matches every measured op to the simulator's op of
the same identity, barriers included."""
from __future__ import annotations

import json

import pytest

from worker_helpers import mpipe, tiny_workload_file

STEPS = 3


def _queued_run(db, name: str, term: str, folder) -> tuple[int, object]:
    """Queue `term`, run it as a worker would (prepare_run, then the ranks), store its timings."""
    from executor.runtime.rank import run_local
    from executor.service.run_setup import prepare_run
    from storage import add_timings, claim_next_run, enqueue, finish_run, save_schedule

    save_schedule(db, name, term, workload=str(tiny_workload_file(folder)), author="tester")
    run = enqueue(db, name, steps=STEPS, options={"check_grads": True}, launched_by="tester")
    claimed = claim_next_run(db, "w", 120)
    prep = prepare_run(claimed)
    (result,) = run_local([prep.job], prep.devices)
    add_timings(db, run.id, result.timeline, worker_id="w", attempt=claimed.attempt)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    return run.id, (prep, result)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from storage import open_database

    folder = tmp_path_factory.mktemp("layouts")
    url = f"sqlite:///{folder / 'mpipe.db'}"
    db = open_database(url)
    out = {"url": url, "db": db}
    for name, term in (("colo", "colocated(1f1b(p=2, m=4))"),
                       ("disagg", "encoder_batch(disaggregate(1f1b(p=2, m=4), encoder_devices=2), 2)")):
        out[name] = _queued_run(db, name, term, folder)
    yield out
    db.close()


@pytest.mark.parametrize("name,ranks", [("colo", 2), ("disagg", 4)])
def test_compare_run_matches_every_measured_op_to_the_term(runs, name, ranks):
    from executor.analysis.compare_run import compare_run

    run_id, (prep, result) = runs[name]
    assert result.grad_check["ok"] and prep.devices == ranks
    per_step = prep.evaluation.schedule.num_ops
    cmp = compare_run(runs["db"], run_id)  # against its own term on the workload calibrated from it
    assert (cmp.matched_ops, cmp.unmatched_ops) == (per_step, 0)
    assert [d.device for d in cmp.devices] == list(range(ranks))
    assert len(cmp.measured_timeline) == len(cmp.other_timeline) == per_step
    kinds = {(r.device, r.kind) for r in cmp.other_timeline if r.module == "vision"}
    assert kinds == {(r.device, r.kind) for r in cmp.measured_timeline if r.module == "vision"}
    if name == "colo":
        assert {k for _, k in kinds} == {"F", "GATHER", "SCATTER", "BW", "AR"}
    else:  # the encoder ranks run the encoder only, one forward per group of 2
        assert {d for d, _ in kinds} == {2, 3}
        assert sorted(r.microbatch for r in cmp.measured_timeline if r.module == "vision" and r.kind == "F") == [0, 2]


def test_compare_run_on_the_command_line(runs):
    run_id, _ = runs["colo"]
    out = mpipe("compare-run", str(run_id), "--db", runs["url"], "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["unmatched_ops"] == 0 and doc["matched_ops"] == 8 * 2 + 2 * (2 + 1 + 1 + 2 + 1)
    text = mpipe("compare-run", str(run_id), "--db", runs["url"])
    assert text.returncode == 0 and "on one side only" not in text.stdout


def test_the_gap_by_cause_gives_a_barrier_no_negative_time(runs):
    """A barrier costs nothing in the prediction, so none of the calibrated per-op dispatch
    is taken out of it: its predicted time is 0, not minus the dispatch."""
    from executor.analysis.compare_run import compare_run

    run_id, _ = runs["colo"]
    cmp = compare_run(runs["db"], run_id, explain=True)
    barriers = [e for e in cmp.explanation if "GATHER" in e["cause"] or "SCATTER" in e["cause"]]
    assert barriers and all(e["predicted_ms"] == 0.0 for e in barriers)
    assert all(e["predicted_ms"] >= 0.0 for e in cmp.explanation if e["cause"].startswith("op:"))
    # Each computing op on the path (a calibrated cost: its mean time plus the fitted per-op overhead)
    # gives that overhead to dispatch rather than op time; no op gives more (a barrier or an all-reduce
    # on this free link costs nothing and gives nothing).
    groups = [e for e in cmp.explanation if e["cause"].startswith("op:")]
    computing = [e for e in groups if e["predicted_ms"] > 0]
    dispatch = next(e for e in cmp.explanation if e["cause"] == "dispatch")
    assert cmp.overhead_ms > 0 and computing
    assert (cmp.overhead_ms * sum(e["ops"] for e in computing) - 1e-9 <= dispatch["predicted_ms"]
            <= cmp.overhead_ms * sum(e["ops"] for e in groups) + 1e-9)
    assert sum(e["gap_ms"] for e in cmp.explanation) == pytest.approx(cmp.measured_ms - cmp.other_ms, abs=1e-6)
