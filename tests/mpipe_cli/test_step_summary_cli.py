"""Step summaries of an Ascend job as runs: msprof-analyze's
cluster_step_trace_time.csv and per-rank step_trace_time.csv imported with
`mpipe import-trace`, their headers checked, `compare-run` setting each rank's
measured busy and idle time beside the prediction with a verdict, and
`runs show --stragglers` finding the slow cards of a 512-rank job (generated
by `benchmarks/straggler_bench.py`, where its time is measured)."""
from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

from benchmarks.straggler_bench import HEADER, SLOW, cluster_csv
from mpipe_core.api import evaluate

STEP_HEADER = ["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication",
               "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing"]


def cli(*argv: str):
    out = run_cli(list(argv))
    assert out.traceback is None, out.traceback
    return out


def runs_count(db: str) -> int:
    got = cli("runs", "list", "--db", db, "--json")
    assert got.code == 0, got.err
    return len(json.loads(got.out))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A 512-rank job (tp=8, dp=16, pp=4) with two slow cards, imported once."""
    root = tmp_path_factory.mktemp("summary")
    path = root / "cluster_step_trace_time.csv"
    path.write_text(cluster_csv())
    db = str(root / "m.db")
    got = cli("import-trace", str(path), "--term", "1f1b(p=4, m=8)", "--db", db, "--json")
    assert got.code == 0, got.err
    return db, json.loads(got.out)


def test_a_512_rank_summary_flags_exactly_its_two_slow_cards(job):
    db, doc = job
    assert doc["ranks"] == 512 and doc["steps"] == [0, 1, 2] and doc["stage_rows"] == 4 * 3
    got = cli("runs", "show", str(doc["id"]), "--stragglers", "--db", db, "--json")
    assert got.code == 0, got.err
    report = json.loads(got.out)
    assert report["flagged"] == list(SLOW)
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert (by_rank[77]["dp"], by_rank[77]["pp"], by_rank[77]["tp"]) == (9, 0, 5)  # 77 = 5 + 8 * (9 + 16 * 0)
    assert all(by_rank[r]["flag"] == "slow" and by_rank[r]["vs_stage"] > 0.10 for r in SLOW)
    # stage 0 computes 1.2/1.05 times what stage 3 does: against the job's median it is off, against its own not
    assert by_rank[0]["vs_job"] > 0.05 and abs(by_rank[0]["vs_stage"]) < 0.02
    text = cli("runs", "show", str(doc["id"]), "--stragglers", "--db", db)
    assert "2 rank(s) flagged:" in text.out and text.code == 0
    print("\n" + text.out)


def test_the_threshold_decides_what_is_off(job):
    db, doc = job
    got = cli("runs", "show", str(doc["id"]), "--stragglers", "--threshold", "0.2", "--db", db, "--json")
    assert json.loads(got.out)["flagged"] == []  # the slow cards are 15% off, ranks within 1%
    got = cli("runs", "show", str(doc["id"]), "--stragglers", "--threshold", "0.005", "--db", db, "--json")
    assert len(json.loads(got.out)["flagged"]) > 2


@pytest.mark.parametrize("case", ["unknown", "missing", "no-term", "step-unknown"])
def test_a_summary_with_another_header_is_one_error_naming_the_column(tmp_path, case):
    db = str(tmp_path / "m.db")
    path = tmp_path / ("step_trace_time.csv" if case == "step-unknown" else "cluster_step_trace_time.csv")
    lines = cluster_csv(steps=1).splitlines()
    term = ["--term", "1f1b(p=4, m=8)"]
    if case == "unknown":
        lines[0] = lines[0].replace("Free", "Idle")
        message = (f"error: {path}: unknown column 'Idle' for a cluster_step_trace_time.csv (expected "
                   + ", ".join(HEADER[:11]) + "[, Preparing])")
    elif case == "missing":
        lines = [",".join(c for i, c in enumerate(line.split(",")) if i != 9) for line in lines]  # no Bubble
        message = f"error: {path}: missing column 'Bubble' of a cluster_step_trace_time.csv"
    elif case == "no-term":
        term = []
        message = "error: a step summary holds no op order: give the term that ran with --term (e.g. --term '1f1b(p=8, m=32)')"
    else:
        lines = [",".join(STEP_HEADER).replace("Computing", "Compute"), "0,0,1,1,0,1,1,1,0,1,0"]
        message = (f"error: {path}: unknown column 'Compute' for a step_trace_time.csv (expected "
                   + ", ".join(STEP_HEADER[:10]) + "[, Preparing])")
    path.write_text("\n".join(lines) + "\n")
    got = cli("import-trace", str(path), *term, "--db", db)
    assert got.code == 2
    assert got.error_lines == [message]
    assert runs_count(db) == 0


def _step_trace(device: int, share: float) -> str:
    """A step_trace_time.csv of one rank: step 3 lasts 100 ms, of which `share` idle (3/4 bubble, 1/4 free)."""
    idle = 100_000.0 * share
    bubble, free = 0.75 * idle, 0.25 * idle
    row = [device, 3, 100_000.0 - idle, bubble, 0, bubble, free, 100_000.0 - bubble, bubble, 0, 0]
    return ",".join(STEP_HEADER) + "\n" + ",".join(map(str, row)) + "\n"


def test_compare_run_sets_each_ranks_bubble_beside_the_prediction_with_a_verdict(tmp_path):
    term = "1f1b(p=2, m=4)"
    ev = evaluate(term, "uniform")
    tl = ev.timeline
    busy = [0.0, 0.0]
    for _, d, s, e in tl.rows():
        busy[d] += e - s
    predicted = [1 - b / tl.makespan for b in busy]
    # rank 0 idles as predicted (0.3 points off), rank 1 ten points more than predicted
    files = []
    for rank, share in enumerate([predicted[0] + 0.003, predicted[1] + 0.10]):
        (tmp_path / f"r{rank}").mkdir()
        path = tmp_path / f"r{rank}" / "step_trace_time.csv"
        path.write_text(_step_trace(rank, share))
        files.append(str(path))
    db = str(tmp_path / "m.db")
    got = cli("import-trace", *files, "--term", term, "--db", db, "--json")
    assert got.code == 0, got.err
    run = json.loads(got.out)["id"]
    got = cli("compare-run", str(run), "--against", term, "-w", "uniform", "--db", db, "--json")
    assert got.code == 0, got.err
    ranks = json.loads(got.out)["step_summary"]["ranks"]
    assert [r["verdict"] for r in ranks] == ["as predicted", "more idle than predicted (+10.0 pts)"]
    assert ranks[0]["step_ms"] == pytest.approx(100.0)
    assert ranks[1]["bubble_ms"] == pytest.approx(75.0 * (predicted[1] + 0.10))
    text = cli("compare-run", str(run), "--against", term, "-w", "uniform", "--db", db).out
    assert "more idle than predicted (+10.0 pts)" in text
    print("\n" + text)


def test_stragglers_need_a_step_summary_and_the_threshold_needs_stragglers(tmp_path, job):
    from kineto_traces import pipelining_traces

    db, doc = job
    got = cli("runs", "show", str(doc["id"]), "--threshold", "0.1", "--db", db)
    assert got.code == 2 and got.error_lines == ["error: --threshold applies to --stragglers"]
    files = []
    for rank, trace in enumerate(pipelining_traces("1f1b(p=2, m=4)", lambda op, step: 10.0)):
        files.append(tmp_path / f"rank{rank}_trace.json")
        files[-1].write_text(json.dumps(trace))
    other = str(tmp_path / "other.db")
    got = cli("import-trace", *map(str, files), "--db", other, "--json")
    assert got.code == 0, got.err
    run = json.loads(got.out)["id"]
    got = cli("runs", "show", str(run), "--stragglers", "--db", other)
    assert got.code == 2 and got.error_lines == [
        f"error: run {run} has no step summary to find slow ranks in: import the job's step_trace_time.csv files "
        f"or msprof-analyze's cluster_step_trace_time.csv"]


def test_each_stages_maximum_is_msprof_analyzes_own_stage_row(job):
    """The summary's stage rows are recomputed from its rank rows (per pipeline stage and step, the
    maximum of each figure), and come out as msprof-analyze wrote them (the generator writes them so)."""
    import csv
    import io

    _, doc = job
    written = {(int(r["Index"]), int(r["Step"])): r for r in csv.DictReader(io.StringIO(cluster_csv()))
               if r["Type"] == "stage"}
    got = {(s["pp"], s["step"]): s for s in doc["stages_ms"]}
    assert sorted(got) == sorted(written) and len(got) == 4 * 3
    names = {"computing": "Computing", "comm_not_overlapped": "Communication(Not Overlapped)", "free": "Free",
             "bubble": "Bubble", "comm_exclude_receive": "Communication(Not Overlapped and Exclude Receive)"}
    for key, row in written.items():
        for ours, theirs in names.items():
            assert got[key][ours] == pytest.approx(float(row[theirs]) / 1e3, abs=1e-6), (key, ours)
