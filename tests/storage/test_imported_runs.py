"""Imported runs on SQLite and PostgreSQL: stored like a queued run's (source,
digest, timings of attempt 1), read back by `runs show`, `calibrate` and
`compare-run`; a second import of the same files, or any failure, saves nothing."""
from __future__ import annotations

import json

import pytest
from kineto_traces import pipelining_traces
from sqlalchemy import func, select

from mpipe_core.errors import MpipeError
from storage import archive_schedule, get_run, get_version, list_runs, timings_for
from storage.errors import ConflictError
from storage.imported_runs import import_traces
from storage.models import OpTiming, Run, Schedule, ScheduleVersion


def uploads(term: str, steps: int = 3, scale: float = 1.0):
    """Per-rank traces of `term` as torch's runtime records them: F 20 us and a
    backward 40 us of compute (times `scale`), 3 us before each first child op."""
    docs = pipelining_traces(term, lambda op, step: (20.0 if op.kind == "F" else 40.0) * scale,
                             steps=steps, wait=3.0, after=1.0)
    return [(f"iteration_3/rank{r}_trace.json", json.dumps(doc).encode()) for r, doc in enumerate(docs)]


def counts(db):
    def read(session):
        return tuple(session.scalar(select(func.count()).select_from(m)) for m in (Schedule, ScheduleVersion, Run,
                                                                                   OpTiming))
    return db.read(read)


def test_an_import_is_a_run_like_any_other(db):
    run, trace, inferred = import_traces(db, uploads("zb_h1(p=2, m=4)"))
    assert inferred and run.source == "imported" and run.source_digest == trace.digest
    assert run.status == "succeeded" and run.nproc == 2 and run.steps == 3 and run.backend == "nccl"
    assert get_version(db, run.ref).term == "zb_h1(p=2, m=4)" and run.schedule == f"imported-{trace.digest[:12]}"
    rows = timings_for(db, run.id)
    assert len(rows) == 3 * 2 * 12 and rows == sorted(trace.records, key=lambda r: (r.step, r.start, r.device))
    assert list_runs(db)[0].source == "imported"
    from executor.analysis.calibrate import calibrate_run
    from executor.analysis.compare_run import compare_run

    cal = calibrate_run(db, run.id)
    assert cal.workload["llm"]["chunk_costs"]["F"] == pytest.approx([0.020 + cal.overhead_ms] * 2, rel=1e-6)
    assert cal.measured_ms == pytest.approx(0.444)  # a rank: 4 F of 24 us, 8 B/W of 44 us, less the last gap
    assert compare_run(db, run.id, against="1f1b(p=2, m=4)").kind == "prediction"


def test_the_same_files_twice_or_a_failure_save_nothing(db):
    files = uploads("1f1b(p=2, m=4)")
    first, _, _ = import_traces(db, files)
    before = counts(db)
    with pytest.raises(ConflictError, match=f"imported already as run {first.id}"):
        import_traces(db, files)
    with pytest.raises(MpipeError, match="rank 0, op 2: the traces ran llm:0BW0 where the term runs llm:0F2"):
        import_traces(db, uploads("1f1b(p=2, m=4)", scale=2.0), term="gpipe(p=2, m=4)")
    archive_schedule(db, first.schedule)
    with pytest.raises(ConflictError, match="is archived"):  # refused inside the write: rolled back
        import_traces(db, uploads("1f1b(p=2, m=4)", scale=3.0), name=first.schedule)
    assert counts(db) == before


def test_a_named_schedule_gets_a_version_only_when_the_term_changes(db):
    a, _, _ = import_traces(db, uploads("1f1b(p=2, m=4)"), name="ours")
    b, _, _ = import_traces(db, uploads("1f1b(p=2, m=4)", scale=2.0), name="ours")
    c, _, _ = import_traces(db, uploads("gpipe(p=2, m=4)"), name="ours")
    assert (a.version, b.version, c.version) == (1, 1, 2)
    assert get_run(db, c.id).ref == "ours@2"


@pytest.mark.parametrize("more, error", [
    (["--name", "bad name"], "error: invalid schedule name 'bad name'"),
    (["--workload", "no-such-preset"], "error: workload 'no-such-preset': no such file or preset"),
    (["--workload", "saved:nothing"], "error: no saved workload named 'nothing'"),
])
def test_a_bad_name_or_workload_is_refused_before_any_file_is_read(db, db_url, tmp_path, capsys, more, error):
    from mpipe_cli.main import main

    paths = []
    for name, data in uploads("1f1b(p=2, m=4)"):
        paths.append(tmp_path / name.replace("/", "_"))
        paths[-1].write_bytes(data)
    before = counts(db)
    assert main(["import-trace", *map(str, paths), "--db", db_url, *more]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(error) and err.count("\n") == 1 and "parsing" not in err
    assert counts(db) == before
    seen: list[str] = []
    with pytest.raises(MpipeError):  # the API too: nothing is read or parsed
        import_traces(db, uploads("1f1b(p=2, m=4)"), workload=more[1] if more[0] == "--workload" else None,
                      name=more[1] if more[0] == "--name" else None, progress=seen.append)
    assert seen == []
    assert main(["import-trace", *map(str, paths), "--db", db_url]) == 0  # the files themselves are good
    assert "parsing" in capsys.readouterr().err


def _as_ranks(files, ranks, world):
    """The same traces, written by global ranks `ranks` of a `world`-rank job."""
    out = []
    for (_, data), rank in zip(files, ranks):
        doc = json.loads(data)
        doc["distributedInfo"].update(rank=rank, world_size=world)
        out.append((f"iteration_3/rank{rank}_trace.json", json.dumps(doc).encode()))
    return out


def test_the_workloads_parallel_section_picks_one_pipeline_of_the_world(db, tmp_path):
    files = uploads("zb_h1(p=2, m=4)")
    alone = import_traces(db, files)[1]
    # tp=2 and dp=2 of an 8-rank job: pp = 8 / 4 = 2, and slice tp1/dp1 is ranks 1 + 2*1 = 3 and 3 + 4 = 7
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({"model": "llama2-7b", "device": "a100", "parallel": {"tp": 2, "dp": 2}}))
    run, trace, inferred = import_traces(db, _as_ranks(files, [3, 7], 8), workload=str(workload))
    assert inferred and get_version(db, run.ref).term == "zb_h1(p=2, m=4)" and run.nproc == 2
    assert trace.global_ranks == [3, 7] and trace.orders == alone.orders
    assert trace.notes[0] == ("kept pipeline tp1/dp1 (tp=2, dp=2, pp=2, order tp-cp-dp-pp): ranks 3, 7 as stages "
                              "0..1")
    # --layout overrides it; a layout that is not the traces' world is refused before anything is saved
    before = counts(db)
    with pytest.raises(MpipeError) as got:
        import_traces(db, _as_ranks(files, [3, 7], 8), workload=str(workload), layout="tp=4,dp=1,pp=4")
    assert got.value.message == ("--layout tp=4,dp=1,pp=4 makes 16 ranks, but the traces' world size is 8 "
                                 "(iteration_3/rank3_trace.json)")
    assert counts(db) == before
