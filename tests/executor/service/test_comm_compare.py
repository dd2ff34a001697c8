"""`compare-run --explain` on a run with timed collectives (issue 39 section 7): a
real cp2 x pp2 x dp2 run (ranks as threads) stored with its comm rows; measured
time per kind against the prediction's communication slices, on the workload it
was launched with (an analytic one on a cluster, which prices them) and on the
fit to the run itself (which prices none, and says so)."""
from __future__ import annotations

import pytest
from worker_helpers import mpipe

TERM = "1f1b(p=2, m=4)"
LAYOUT = {"cp": 2, "dp": 2, "distributed_optimizer": True}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    from executor.runtime.jobs import Job
    from executor.runtime.model import ModelConfig
    from executor.runtime.model_workload import workload_for
    from executor.runtime.rank import run_local
    from mpipe_core.api import evaluate
    from mpipe_core.workloads.presets import preset_document
    from storage import add_timings, claim_next_run, enqueue, finish_run, open_database, save_schedule

    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'mpipe.db'}"
    db = open_database(url)
    doc = preset_document("llava-7b")
    doc.update(encoders=[], cluster="dgx-a100", parallel=LAYOUT)  # text-only, as the run's model
    save_schedule(db, "cp", TERM, workload=doc, author="tester")
    run = enqueue(db, "cp@1", nproc=8, steps=3)
    claimed = claim_next_run(db, "w", 120)
    cfg = ModelConfig(encoder=None)
    job = Job.make(TERM, evaluate(TERM, workload_for(cfg)).schedule, cfg, steps=3,
                   layout={**LAYOUT, "pp": 2})
    (result,) = run_local([job], 8)
    add_timings(db, run.id, result.timeline + result.comm, worker_id="w", attempt=claimed.attempt)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    yield db, url, run.id, result, evaluate(TERM, doc)
    db.close()


def test_measured_against_predicted_per_kind(stored):
    from executor.analysis.compare_run import LAUNCHED, compare_run

    db, _, run_id, result, predicted = stored
    cmp = compare_run(db, run_id, workload=LAUNCHED, explain=True)
    kinds = {k.group: k for k in cmp.comm}
    assert set(kinds) == {"cp", "dp", "optimizer"}  # (the pp exchange is part of the ops)
    assert kinds["cp"].kind == "cp_comm" and kinds["dp"].kind == "dp_comm + dp_gather"
    used = set(cmp.steps)
    assert used == {1, 2}  # after the warm-up step
    for group, kind_names in (("cp", {"cp_comm"}), ("dp", {"dp_comm", "dp_gather"}), ("optimizer", {"optimizer"})):
        rows = [c for c in result.comm if c.kind in kind_names and c.step in used]
        assert kinds[group].measured_ms == pytest.approx(sum(c.end - c.start for c in rows) * 1e3 / 2)
        assert kinds[group].measured_count == len(rows) / 2
        slices = [s for s in predicted.comm if s.group == group]
        assert kinds[group].predicted_ms == pytest.approx(sum(s.seconds for s in slices) * 1e3)
        assert kinds[group].ratio == pytest.approx(kinds[group].measured_ms / kinds[group].predicted_ms)
    # 8 layers over 2 stages, 4 microbatches, a gather forward and a reduce-scatter backward each.
    assert kinds["cp"].measured_count == 2 * 8 * 4
    assert cmp.as_dict(timelines=False)["comm"][0]["kind"] == "cp_comm"


def test_a_fit_prices_no_communication_and_says_so(stored):
    from executor.analysis.compare_run import compare_run

    db, _, run_id, _, _ = stored
    cmp = compare_run(db, run_id, explain=True)
    assert [k.group for k in cmp.comm] == ["cp", "dp", "optimizer"]
    assert all(k.predicted_ms is None and k.ratio is None for k in cmp.comm)
    assert "the prediction's workload prices no communication" in cmp.format()


def test_the_cli_prints_the_table(stored):
    _, url, run_id, _, _ = stored
    out = mpipe("compare-run", str(run_id), "--db", url, "--workload", "launched", "--explain")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("communication by kind"))
    assert lines[at + 1].split()[:2] == ["kind", "group"]
    assert [line.split()[0] for line in lines[at + 2:at + 5]] == ["cp_comm", "dp_comm", "optimizer"]
