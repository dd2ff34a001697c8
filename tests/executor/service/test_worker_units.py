"""The worker's parts that need no launch: the timing stream files, launcher
templates, and calibration on timelines whose costs are known exactly."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from executor.analysis.calibrate import fit, measured_from_rows
from executor.errors import WorkerError
from executor.service.queue_worker import check_template, fill_template
from executor.timing_stream import StepReader, StepWriter
from mpipe_core.api import evaluate
from mpipe_core.ir.ops import Op
from mpipe_core.ir.timeline_record import TimelineRecord


def _record(step, start, n):
    return SimpleNamespace(step=step, start=[start + i for i in range(n)], end=[start + i + 0.5 for i in range(n)],
                           wait=[0.0] * n, step_start=start - 0.1, step_end=start + n)


OPS = [SimpleNamespace(op=Op("llm", "F", 0, m)) for m in range(2)]


def test_reader_holds_rows_until_every_rank_reported_the_first_step(tmp_path):
    w0, w1 = StepWriter(tmp_path, 0, "h/cpu"), StepWriter(tmp_path, 1, "h/cpu")
    reader = StepReader(tmp_path, world=2)
    w0.write(_record(0, 10.0, 2), OPS, offset=0.0)
    assert reader.poll() == []  # rank 1 has not reported: the time origin is unknown
    w1.write(_record(0, 12.0, 2), OPS, offset=2.5)  # rank 1's clock runs 2.5 s ahead
    rows = reader.poll()
    assert reader.origin == pytest.approx(9.4)  # min(10 - 0.1, 12 - 0.1 - 2.5)
    assert len(rows) == 4 and {r.device for r in rows} == {0, 1}
    assert {r.host for r in rows} == {"h/cpu"}
    r1 = [r for r in rows if r.device == 1]
    assert r1[0].start == pytest.approx(12.0 - 2.5 - 9.4)
    reader.committed()
    assert reader.stats.steps == 2 and reader.stats.rows == 4
    w0.write(_record(1, 20.0, 2), OPS, offset=0.0)
    assert [r.step for r in reader.poll()] == [1, 1]


def test_reader_skips_half_written_lines_until_complete(tmp_path):
    path = tmp_path / "timings.0.jsonl"
    line = json.dumps({"rank": 0, "job": 0, "step": 0, "wall": 0.0, "step_start": 1.0, "step_end": 2.0,
                       "host": "cpu", "ops": [["llm", "F", 0, 0, 1.0, 1.5, 0.0]]})
    path.write_text(line[:20])
    reader = StepReader(tmp_path, world=1)
    assert reader.poll() == []
    with open(path, "a") as fh:
        fh.write(line[20:] + "\n")
    rows = reader.poll()
    assert len(rows) == 1 and rows[0].end == pytest.approx(0.5) and rows[0].host == "cpu"


def test_a_crashed_rank_still_releases_what_was_written(tmp_path):
    StepWriter(tmp_path, 0, "cpu").write(_record(0, 5.0, 2), OPS, offset=0.0)
    reader = StepReader(tmp_path, world=2)
    assert reader.poll() == []
    assert len(reader.poll(final=True)) == 2


def test_templates_are_filled_and_split_like_a_shell():
    template = check_template("srun -N {nnodes} {torchrun} --rdzv-endpoint {rdzv} {entry}")
    argv = fill_template(template, {"nnodes": 2, "torchrun": ["py", "-m", "torch.distributed.run"],
                                    "rdzv": "h:1", "entry": ["-m", "executor.runtime.rank", "--run-dir", "/a b"]})
    assert argv == ["srun", "-N", "2", "py", "-m", "torch.distributed.run", "--rdzv-endpoint", "h:1",
                    "-m", "executor.runtime.rank", "--run-dir", "/a b"]
    with pytest.raises(WorkerError, match="unknown field"):
        check_template("{nope} {entry}")


# --------------------------------------------------------------------------- calibration, exactly

WORKLOAD = {"llm": {"layers": 4, "f": 1.0, "b": 1.0, "w": 1.0,
                    "chunk_costs": {"F": [0.002, 0.003], "B": [0.004, 0.005], "W": [0.001, 0.0015]}},
            "encoders": [{"name": "vision", "f": [0.001, 0.002, 0.003, 0.004], "b": 0.001, "w": 0.001,
                          "trainable": True}],
            "link": {"latency": 0.0005, "bandwidth": None}}


def _simulated_rows(term, workload, steps):
    """The simulator's own timeline as measured rows (seconds), step after step."""
    ev = evaluate(term, workload)
    span = ev.timeline.makespan
    rows = []
    for s in range(steps):
        base = s * (span + 0.01)
        for op, d, a, b in ev.timeline.rows():
            rows.append(TimelineRecord(d, op.module, op.kind, op.chunk, op.mb, s, base + a, base + b))
    return rows, span


@pytest.mark.parametrize("term", ["1f1b(p=2, m=4)", "zb_h1(p=2, m=4)",
                                  "transpose(1f1b(p=2, m=4), mode=dynamic, shards=2)"])
def test_calibration_recovers_the_costs_of_a_known_timeline(term):
    rows, span = _simulated_rows(term, WORKLOAD, steps=3)
    cal = fit(measured_from_rows(term, WORKLOAD, rows))
    assert cal.steps == [1, 2]  # the first step is warm-up
    assert cal.overhead_ms == pytest.approx(0.0, abs=1e-9)
    assert cal.latency_ms == pytest.approx(0.5)
    table = cal.workload["llm"]["chunk_costs"]
    assert table["F"] == pytest.approx([2.0, 3.0])
    if "zb_h1" in term:  # split backward: B and W measured apart
        assert table["B"] == pytest.approx([4.0, 5.0]) and table["W"] == pytest.approx([1.0, 1.5])
    else:  # fused: their sum is what counts
        assert [b + w for b, w in zip(table["B"], table["W"])] == pytest.approx([5.0, 6.5])
    assert cal.workload["encoders"][0]["f"] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert cal.measured_ms == pytest.approx(span * 1000)
    assert cal.predicted_ms == pytest.approx(span * 1000)
    assert cal.error == pytest.approx(0.0, abs=1e-9)
    portable = cal.portable_workload()
    assert "chunk_costs" not in portable["llm"] and portable["llm"]["f"] == pytest.approx(5.0 / 4)
    evaluate("1f1b(p=4, m=8)", portable)  # another shape evaluates on it


def test_a_dispatch_gap_before_every_op_is_folded_into_its_cost():
    term = "1f1b(p=2, m=4)"
    rows, _ = _simulated_rows(term, dict(WORKLOAD, link={"latency": 0.0}), steps=2)
    gap = 0.0002
    # Every op's start moves later by the gap, keeping its end: duration shrinks by the gap.
    shifted = [r._replace(start=r.start + gap) for r in rows]
    cal = fit(measured_from_rows(term, WORKLOAD, shifted))
    assert cal.overhead_ms == pytest.approx(0.2, rel=0.1)  # the step's first op shows no gap
    assert cal.workload["llm"]["chunk_costs"]["F"] == pytest.approx([2.0, 3.0], rel=0.05)
    assert abs(cal.error) < 0.02


def test_calibration_with_a_contended_host_recovers_solo_costs():
    # The "measured" run is the simulator's timeline on a host where overlapping ops slow each
    # other down by 0.5x; told the host, the fit recovers every op's own cost and predicts the
    # run exactly; not told, it charges the slowdown to the ops (costs too high).
    host = {"devices": None, "contention": 0.5}
    # backward fixed: `auto` may pick another backward on the contended host than on the plain one
    term = "transpose(1f1b(p=2, m=4), mode=dynamic, backward=recompute)"
    rows, span = _simulated_rows(term, dict(WORKLOAD, host=host), steps=3)
    cal = fit(measured_from_rows(term, WORKLOAD, rows), host=host)
    assert cal.workload["host"] == dict(host, dispatch=0.0)
    assert cal.workload["llm"]["chunk_costs"]["F"] == pytest.approx([2.0, 3.0])
    assert cal.workload["encoders"][0]["f"] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert cal.predicted_ms == pytest.approx(span * 1000)
    naive = fit(measured_from_rows(term, WORKLOAD, rows), fit_contention=False)
    assert "host" not in naive.workload
    assert sum(naive.workload["encoders"][0]["f"]) > 10.0 + 1e-6


@pytest.mark.parametrize("prior", [None, {"devices": None, "contention": 0.0, "dispatch": 0.0,
                                          "pairs": {"llm": {"llm": 0.0, "encoder": 0.9},
                                                    "encoder": {"llm": 0.0, "encoder": 0.0}}}])
def test_contention_comes_from_the_runs_own_overlapping_ops(prior):
    # The simulator's timeline on a host whose pairs slow each other down by different
    # amounts; fitted with no probe, or with a probe that was wrong (0.9 where the run
    # had 0.2, 0 elsewhere), the run's own overlaps recover every pair and the solo costs.
    truth = {"devices": None, "contention": 0.0,
             "pairs": {"llm": {"llm": 0.3, "encoder": 0.2}, "encoder": {"llm": 0.4, "encoder": 0.15}}}
    term = "transpose(zb_h1(p=2, m=4), mode=prefix)"
    rows, span = _simulated_rows(term, dict(WORKLOAD, host=truth), steps=3)
    cal = fit(measured_from_rows(term, WORKLOAD, rows), host=prior)
    pairs = cal.workload["host"]["pairs"]
    for victim, row in truth["pairs"].items():
        assert pairs[victim] == pytest.approx(row, abs=0.01), cal.host_fit.summary()
    assert cal.workload["llm"]["chunk_costs"]["F"] == pytest.approx([2.0, 3.0], rel=0.01)
    assert cal.workload["encoders"][0]["f"] == pytest.approx([1.0, 2.0, 3.0, 4.0], rel=0.01)
    assert cal.predicted_ms == pytest.approx(span * 1000, rel=0.002)
    assert "fitted from" in cal.format()


def test_without_overlap_the_prior_stays_and_no_contention_is_invented():
    rows, span = _simulated_rows("1f1b(p=2, m=4)", WORKLOAD, steps=3)
    plain = fit(measured_from_rows("1f1b(p=2, m=4)", WORKLOAD, rows))
    assert "host" not in plain.workload  # a run without contention fits none
    assert plain.predicted_ms == pytest.approx(span * 1000)
    # an encoder that never overlaps another encoder: that pair keeps the probe's value
    probe = {"devices": None, "contention": 0.0, "dispatch": 0.0,
             "pairs": {"llm": {"llm": 0.0, "encoder": 0.0}, "encoder": {"llm": 0.0, "encoder": 0.37}}}
    kept = fit(measured_from_rows("1f1b(p=2, m=4)", WORKLOAD, rows), host=probe)
    assert kept.workload["host"]["pairs"]["encoder"]["encoder"] == 0.37
    assert kept.workload["host"]["pairs"]["llm"]["llm"] == pytest.approx(0.0, abs=1e-3)


def test_a_median_fit_is_not_moved_by_one_slow_step():
    # Steps 1..3 of the simulator's own timeline; in step 2 every op takes 3x as long (a burst of
    # background load).  The median fit recovers the costs and compares with the median step;
    # the mean fit charges a third of the burst to every op.
    term = "1f1b(p=2, m=4)"
    rows, span = _simulated_rows(term, dict(WORKLOAD, link={"latency": 0.0}), steps=4)
    origin = {s: min(r.start for r in rows if r.step == s) for s in range(4)}
    slowed = [r._replace(start=origin[2] + 3 * (r.start - origin[2]), end=origin[2] + 3 * (r.end - origin[2]))
              if r.step == 2 else r for r in rows]
    med = fit(measured_from_rows(term, WORKLOAD, slowed), statistic="median")
    assert med.steps == [1, 2, 3]
    assert med.workload["llm"]["chunk_costs"]["F"] == pytest.approx([2.0, 3.0])
    assert med.measured_ms == pytest.approx(span * 1000) and med.predicted_ms == pytest.approx(span * 1000)
    mean = fit(measured_from_rows(term, WORKLOAD, slowed))
    assert mean.workload["llm"]["chunk_costs"]["F"] == pytest.approx([2.0 * 5 / 3, 3.0 * 5 / 3])
    assert mean.measured_ms == pytest.approx(span * 1000 * 5 / 3)


def test_a_probed_fixed_part_adds_to_the_measured_dispatch():
    rows, _ = _simulated_rows("1f1b(p=2, m=4)", WORKLOAD, steps=2)
    cal = fit(measured_from_rows("1f1b(p=2, m=4)", WORKLOAD, rows),
              host={"devices": None, "contention": 0.0, "dispatch": 1.5})
    assert cal.workload["host"]["dispatch"] == pytest.approx(1.5)  # no gaps measured: all from the probe


@pytest.mark.parametrize("options, message", [
    ({"timeout_s": float("nan")}, "run option timeout_s: expected a finite number in (0, 604800], got nan"),
    ({"bogus": 1}, "unknown run option 'bogus'"),
    ({"nnodes": 3}, "run option nnodes: 2 ranks do not split evenly over 3 nodes"),
])
def test_the_worker_refuses_options_by_the_rules_of_enqueue(options, message):
    """A run written past `enqueue` (an older mpipe, by hand) meets the same rules at the worker."""
    from executor.service.run_setup import RunSpec
    from mpipe_core.runs.run_options import RunOptionError, check_run_options

    claimed = SimpleNamespace(id=1, term="1f1b(p=2, m=2)", workload=None, steps=1, nproc=2,
                              backend="gloo", options=options)
    with pytest.raises(RunOptionError) as at_worker:
        RunSpec.from_claimed(claimed)
    with pytest.raises(RunOptionError) as at_enqueue:
        check_run_options(options, ranks=2)
    assert at_worker.value.message == at_enqueue.value.message
    assert at_worker.value.message.startswith(message)


def test_contention_that_hits_some_ops_hard_is_fitted_by_its_mean():
    # A background process that shares a core now and then: in one of three timed steps of the
    # transposed run the encoders beside each other ran 1.6x (c = 0.6), in the other two not at
    # all; the fused run's encoders ran alone.  A step adds its ops' times, so the slowdown that
    # predicts steps is the mean one, 0.6 / 3; the median op (c = 0) would predict none of it.
    from executor.analysis.host_fit import fit_host

    def rows_of(term, hosts):
        out, base = [], 0.0
        for s, host in enumerate(hosts):
            one, span = _simulated_rows(term, dict(WORKLOAD, host=host) if host else WORKLOAD, steps=1)
            out += [r._replace(step=s, start=base + r.start, end=base + r.end) for r in one]
            base += span + 0.01
        return out

    burst = {"devices": None, "contention": 0.0, "pairs": {"llm": {"llm": 0.0, "encoder": 0.0},
                                                           "encoder": {"llm": 0.0, "encoder": 0.6}}}
    fused, transposed = "1f1b(p=2, m=4)", "transpose(1f1b(p=2, m=4), mode=prefix)"
    runs = [measured_from_rows(fused, WORKLOAD, rows_of(fused, [None] * 4)),
            measured_from_rows(transposed, WORKLOAD, rows_of(transposed, [None, burst, None, None]))]
    host = fit_host(runs).host
    # one timed step in three at c = 0.6 and two at 0: the mean contention of the run is 0.6 / 3
    assert host["pairs"]["encoder"]["encoder"] == pytest.approx(0.6 / 3, abs=0.005)
    # and so the encoder time a step of the transposed schedule is predicted to take is the run's mean
    timed = [r for r in rows_of(transposed, [None, burst, None, None]) if r.step > 0]
    measured = sum(r.end - r.start for r in timed if r.module == "vision" and r.kind == "F") / 3

    def predicted(h):
        rows = evaluate(transposed, dict(WORKLOAD, host=h) if h else WORKLOAD).timeline.rows()
        return sum(b - a for op, _, a, b in rows if op.module == "vision" and op.kind == "F")

    assert predicted(host) == pytest.approx(measured, rel=0.005)
    assert predicted(None) < 0.9 * measured  # no contention: the burst is missed


def test_two_databases_get_run_roots_of_their_own_by_default(monkeypatch, tmp_path):
    # A worker sweeps the run directories its database does not know: two databases sharing
    # one default folder (two clones, the app beside a test) would delete each other's live runs.
    from executor.service.queue_worker import QueueWorker, WorkerOptions, default_run_root

    monkeypatch.delenv("MPIPE_RUN_ROOT", raising=False)
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    assert default_run_root(a) != default_run_root(b)
    assert default_run_root(a) == default_run_root(a)
    worker = QueueWorker(SimpleNamespace(url=a), WorkerOptions())
    assert str(worker.run_root) == default_run_root(a)
    assert worker.sweep_run_dirs() == []  # nothing there yet: the other database's folder is not looked at
