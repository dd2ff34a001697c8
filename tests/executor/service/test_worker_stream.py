"""From an empty database to measured-vs-predicted: save a schedule, queue two
runs of it, a real `mpipe worker` subprocess runs them with P=2 on gloo while
the test watches timing rows arrive, then calibration and comparison.

One worker, two torchrun launches, shared by every test in this module; the
module runs once on SQLite and once on PostgreSQL."""
from __future__ import annotations

import json
import re
import time

import pytest

from db_fixtures import DATABASES, empty_database
from worker_helpers import TERM, Worker, force_options, mpipe, mpipe_each, new_database, wait_for
from bounds import EVENT_S

pytestmark = pytest.mark.slow
STEPS_A, STEPS_B = 40, 20
OPS_PER_STEP = 24  # 1f1b(p=2, m=4) on the tiny MLLM: 16 LLM ops + 8 encoder ops


@pytest.fixture(scope="module", params=DATABASES)
def served(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream")
    with empty_database(request, folder) as url:
        yield from _serve(folder, url)


def _serve(folder, url):
    from storage import enqueue, get_run, timings_for

    url, db = new_database(folder, url=url)
    # Two runs that cannot launch as recorded go first: they must fail at once, with the reason.
    bad = enqueue(db, "s", options={"model": "tiny-text"}, launched_by="tester").id
    odd = enqueue(db, "s", launched_by="tester").id
    force_options(db, odd, {"speed": "fast"})  # past enqueue's checks: the worker checks again
    a = enqueue(db, "s", steps=STEPS_A, launched_by="tester")
    b = enqueue(db, "s", steps=STEPS_B, launched_by="tester")
    worker = Worker(url, folder)
    polls = []  # (seconds since start, status of A, rows of A, highest step seen)
    t0 = time.monotonic()
    try:
        def a_finished():
            run = get_run(db, a.id)
            rows = timings_for(db, a.id)
            polls.append((time.monotonic() - t0, run.status, len(rows), max((r.step for r in rows), default=-1)))
            return run.status not in ("queued", "running")

        wait_for(a_finished, EVENT_S, interval=0.1, what=f"run {a.id} to end\n{worker.output()}")
        wait_for(lambda: get_run(db, b.id).status not in ("queued", "running"), EVENT_S,
                 what=f"run {b.id} to end\n{worker.output()}")
    finally:
        worker.stop()
    yield {"url": url, "db": db, "a": a.id, "b": b.id, "bad": bad, "odd": odd, "polls": polls,
           "worker": worker.output()}
    db.close()


def test_both_runs_succeed_with_every_row(served):
    from storage import get_run, timing_count

    for run_id, steps in ((served["a"], STEPS_A), (served["b"], STEPS_B)):
        run = get_run(served["db"], run_id)
        assert run.status == "succeeded", f"{run.error}\n{run.log_tail}\n{served['worker']}"
        assert run.exit_code == 0
        assert timing_count(served["db"], run_id) == steps * OPS_PER_STEP
        assert "--- worker ---" in run.log_tail and "streamed" in run.log_tail


def test_runs_that_cannot_launch_fail_with_the_reason(served):
    from storage import get_run

    bad, odd = get_run(served["db"], served["bad"]), get_run(served["db"], served["odd"])
    assert bad.status == odd.status == "failed"
    assert "model preset 'tiny-text' has no encoder, but the schedule's workload has " in bad.error
    assert "unknown run option 'speed'" in odd.error


def test_rows_reach_the_database_while_the_run_goes(served):
    polls = served["polls"]
    running = [p for p in polls if p[1] == "running"]
    # Rows of step 1 (the second step) were there while the run was still going...
    early = [p for p in running if p[3] >= 1]
    assert early, f"no step-1 rows seen before the end; polls: {polls[-5:]}"
    first = early[0]
    final_rows = polls[-1][2]
    assert first[2] < final_rows
    # ... and kept arriving while it ran: the count seen only grows, and it grew
    # while the run was going (how many batches a poll sees depends on the load,
    # so no number of them is promised).
    seen = [p[2] for p in running]
    assert seen == sorted(seen), seen
    counts = sorted({c for c in seen if c > 0})
    assert len(counts) >= 2, counts
    print(f"\nfirst step-1 rows seen {first[0]:.1f} s after start with {first[2]} of {final_rows} rows; "
          f"{len(counts)} distinct row counts seen while running")


def test_the_worker_reports_how_late_rows_arrived(served):
    """The lag itself is a speed figure (benchmarks, README); here: it is measured and reported."""
    from storage import get_run

    tail = get_run(served["db"], served["a"]).log_tail
    match = re.search(r"median ([\d.]+) s, max ([\d.]+) s", tail)
    assert match, tail
    median, worst = float(match.group(1)), float(match.group(2))
    print(f"\nstream lag: median {median:.2f} s, max {worst:.2f} s")
    assert 0 <= median <= worst


def test_rows_have_the_timeline_shape(served):
    from storage import timings_for

    rows = timings_for(served["db"], served["a"], step=3)
    assert {r.device for r in rows} == {0, 1}
    assert {(r.module, r.kind) for r in rows} == {("llm", "F"), ("llm", "BW"), ("vision", "F"), ("vision", "BW")}
    assert all(r.end > r.start >= 0 for r in rows)
    assert all(r.host.endswith("/cpu") for r in rows)
    # One clock for both ranks: chunk 1 of a microbatch starts after chunk 0 ended.
    by_op = {(r.chunk, r.kind, r.microbatch): r for r in rows if r.module == "llm"}
    for mb in range(4):
        assert by_op[(1, "F", mb)].start >= by_op[(0, "F", mb)].end


def test_calibrate_saves_a_workload_that_predicts_the_run(served):
    out, as_json = mpipe_each(["calibrate", str(served["a"]), "--db", served["url"], "--save", "cal-a"],
                              ["calibrate", str(served["a"]), "--db", served["url"], "--json"])
    assert out.returncode == 0, out.stderr
    assert "llm F chunk 0" in out.stdout and "vision F mb 3" in out.stdout
    assert "saved workload cal-a@1" in out.stdout
    doc = json.loads(as_json.stdout)
    assert doc["unit"] == "ms" and len(doc["workload"]["llm"]["chunk_costs"]["F"]) == 2
    assert len(doc["workload"]["encoders"][0]["f"]) == 4  # per microbatch
    print(f"\ncalibration on run {served['a']}: measured {doc['measured_ms']:.2f} ms, predicted "
          f"{doc['predicted_ms']:.2f} ms, error {doc['error']:+.1%}")
    # How close the fit is depends on the machine's load (a figure for the README's calibration
    # line, not a test); what is checked: the prediction is the run's term simulated on the
    # fitted workload, derived here by the core alone.
    from mpipe_core.api import evaluate

    assert doc["predicted_ms"] == pytest.approx(evaluate(TERM, doc["workload"]).timeline.makespan)
    assert doc["measured_ms"] > 0
    assert doc["error"] == pytest.approx(doc["predicted_ms"] / doc["measured_ms"] - 1)


def test_compare_a_second_run_with_the_first_runs_calibration(served):
    from executor.analysis.compare_run import compare_run

    # Its own calibration of run A, not the one the calibrate test saves: the tests of this
    # module may run in any order, or alone.
    out = mpipe("calibrate", str(served["a"]), "--db", served["url"], "--save", "cal-for-b")
    assert out.returncode == 0, out.stderr
    cmp = compare_run(served["db"], served["b"], workload="saved:cal-for-b")
    assert cmp.kind == "prediction" and cmp.workload == "saved:cal-for-b@1"
    assert len(cmp.devices) == 2 and cmp.matched_ops == OPS_PER_STEP and cmp.top_ops
    doc = cmp.as_dict()
    assert {"measured_ms", "other_ms", "error", "devices", "top_ops", "measured_timeline",
            "other_timeline"} <= set(doc)
    assert len(doc["measured_timeline"]) == len(doc["other_timeline"]) == OPS_PER_STEP
    for d in cmp.devices:
        assert d.measured_busy_ms + d.measured_idle_ms == pytest.approx(cmp.measured_ms)
    own = compare_run(served["db"], served["b"])  # against its own calibration
    print(f"\nrun {served['b']} predicted from run {served['a']}'s calibration: measured "
          f"{cmp.measured_ms:.2f} ms, predicted {cmp.other_ms:.2f} ms, error {cmp.error:+.1%} "
          f"(from its own: {own.error:+.1%})")
    # How large the errors are is reported, not asserted (a machine-load figure).  The prediction
    # is the term simulated on the saved calibration, derived here by the core alone.
    from mpipe_core.api import evaluate
    from storage import get_workload

    saved = get_workload(served["db"], "cal-for-b").body
    assert cmp.other_ms == pytest.approx(evaluate(TERM, saved).timeline.makespan)
    assert cmp.measured_ms > 0 and own.measured_ms == pytest.approx(cmp.measured_ms)


def test_compare_run_cli_tables_and_json(served):
    url, a, b = served["url"], str(served["a"]), str(served["b"])
    against_run, against_term, own = mpipe_each(["compare-run", b, "--db", url, "--against", a],
                                                ["compare-run", a, "--db", url, "--against", "zb_h1(p=2, m=4)",
                                                 "--json"],
                                                ["compare-run", a, "--db", url])
    assert against_run.returncode == 0, against_run.stderr
    assert f"against run {a}" in against_run.stdout and "ops differing most" in against_run.stdout
    doc = json.loads(against_term.stdout)
    assert doc["kind"] == "prediction" and "zb_h1" in doc["against"] and doc["unmatched_ops"] > 0
    assert "predicted busy" in own.stdout and "makespan  measured" in own.stdout


USER_ERRORS = [
    (["calibrate", "999"], "error: no run 999"),
    (["compare-run", "999"], "error: no run 999"),
    (["compare-run", "{a}", "--against", "1f1b(p=2"], "error: 1:9:"),
    (["compare-run", "{a}", "--workload", "saved:nope"], "error: no saved workload"),
    (["calibrate", "{bad}"], "error: run {bad} (failed) has no timings"),
]


@pytest.fixture(scope="module")
def user_errors(served):
    """Each user error's command, all in one process (`mpipe_each`), by its arguments."""
    argvs = [[a.format(**served) for a in args] + ["--db", served["url"]] for args, _ in USER_ERRORS]
    return {" ".join(args): out for (args, _), out in zip(USER_ERRORS, mpipe_each(*argvs))}


@pytest.mark.parametrize("args,message", USER_ERRORS)
def test_user_errors_exit_2_with_one_line(served, user_errors, args, message):
    message = message.format(**served)
    out = user_errors[" ".join(args)]
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(message) and out.stderr.count("\n") == 1, out.stderr
