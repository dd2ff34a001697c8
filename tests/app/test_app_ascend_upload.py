"""A 512-rank Ascend job uploaded as one archive on the Runs page (AppTest):
its 512 `*_ascend_pt` profiler folders (profiler_info_<rank>.json and
step_trace_time.csv each) and msprof-analyze's
`cluster_analysis_output/cluster_step_trace_time.csv` (generated: tp=8, dp=16,
pp=4, two slow cards) become a run summary whose slow-card heatmap names
every rank with its dp/pp/tp index and flags exactly the two; a hostile archive
is the extraction's one message and saves nothing."""
from __future__ import annotations

import csv
import io
import json
import tarfile

import pytest
from app_helpers import button, errors, figure, open_page, shown, start_app

from app.trace_upload import ARCHIVE
from benchmarks.straggler_bench import SLOW, cluster_csv
from storage import list_runs

pytestmark = pytest.mark.databases("sqlite")
TERM = "1f1b(p=4, m=8)"
STEP_HEADER = ["Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication",
               "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing"]


def job_archive(kind: str = "tar.gz") -> bytes:
    """The job's folder as a .tar.gz (or .zip): each rank's profiler folder with its own step_trace_time.csv
    (its rows of the cluster summary) and msprof-analyze's summary beside them."""
    import zipfile

    summary = cluster_csv()
    rows = [r for r in csv.DictReader(io.StringIO(summary)) if r["Type"] == "rank"]
    buf = io.BytesIO()

    def add(t, name: str, data: bytes) -> None:
        if isinstance(t, zipfile.ZipFile):
            t.writestr(name, data)
            return
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))

    opened = zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) if kind == "zip" else \
        tarfile.open(fileobj=buf, mode="w:gz")
    with opened as t:
        for rank in range(512):
            folder = f"job/node{rank // 8:02d}_{9000 + rank}_20261207120000000_ascend_pt"
            add(t, f"{folder}/profiler_info_{rank}.json", json.dumps({"rank_id": rank}).encode())
            mine = [r for r in rows if int(r["Index"]) == rank]
            text = io.StringIO()
            w = csv.writer(text)
            w.writerow(STEP_HEADER)
            for r in mine:
                w.writerow([rank % 8, r["Step"]] + [r[c] for c in STEP_HEADER[2:]])
            add(t, f"{folder}/ASCEND_PROFILER_OUTPUT/step_trace_time.csv", text.getvalue().encode())
        add(t, "job/cluster_analysis_output/cluster_step_trace_time.csv", summary.encode())
    return buf.getvalue()


def upload_archive(at, name: str, data: bytes, term: str | None = TERM):
    at.radio(key="runs.import.what").set_value(ARCHIVE).run()
    at.file_uploader(key="runs.import.archive.0").set_value((name, data, "application/gzip")).run()
    if term:
        at.text_input(key="runs.import.term").set_value(term).run()
    button(at, "Import traces").click().run()
    assert not at.exception
    return at


def test_a_512_rank_archive_imports_and_its_heatmap_flags_the_two_slow_cards(db, db_url):
    at = open_page(start_app(), "runs")
    upload_archive(at, "job.tar.gz", job_archive())
    [run] = list_runs(db)
    assert (run.source, run.nproc, run.steps) == ("imported", 512, 3)
    assert [shown(s.value) for s in at.success][0].startswith(
        f"Imported run #{run.id} ({run.ref}) from job.tar.gz: {TERM} (a run summary (cluster_step_trace_time) of "
        f"512 ranks, 3 step(s))")
    heat = next(f for f in (figure(at, i) for i in range(len(at.get("plotly_chart"))))
                if f["data"][0]["type"] == "heatmap")
    cells = heat["data"][0]
    assert len(cells["x"]) == 512 and cells["y"] == ["0", "1", "2"]
    assert "rank %{x}" in cells["hovertemplate"] and "dp/pp/tp %{customdata[0]}" in cells["hovertemplate"] \
        and "step %{y}" in cells["hovertemplate"]
    marks = heat["data"][1]
    assert sorted(marks["x"]) == list(SLOW)
    assert heat["layout"]["height"] <= 480  # one screen, no scrolling at 512 ranks
    flagged = next(d.value for d in at.dataframe if "vs stage" in d.value.columns)
    assert list(flagged["rank"]) == list(SLOW) and list(flagged["flag"]) == ["slow", "slow"]
    assert (flagged["dp"].tolist(), flagged["pp"].tolist(), flagged["tp"].tolist()) == ([9, 5], [0, 2], [5, 4])
    # and each rank beside its stage's prediction (the run's own term and workload), with a verdict
    verdicts = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert len(verdicts) == 512 and verdicts["dp/pp/tp"].iloc[77] == "9/0/5"
    assert set(v.split(" (")[0] for v in verdicts["verdict"]) <= {"as predicted", "more idle than predicted",
                                                                   "less idle than predicted"}


def test_a_hostile_archive_is_refused_with_its_message_and_saves_nothing(db, db_url):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        info = tarfile.TarInfo("job/../../../escaped.csv")
        info.size = 2
        t.addfile(info, io.BytesIO(b"{}"))
    at = open_page(start_app(), "runs")
    upload_archive(at, "evil.tar.gz", buf.getvalue())
    assert errors(at) == ["evil.tar.gz: member 'job/../../../escaped.csv' points outside the archive's folder (..); "
                          "refused (nothing unpacked)"]
    assert list_runs(db) == []


def test_an_archive_of_ascend_traces_shows_its_communication_rows_over_the_ops(db, db_url, tmp_path):
    import zipfile

    from ascend_layout import write_job
    from kineto_traces import pipelining_traces

    job = write_job(pipelining_traces("1f1b(p=2, m=4)", lambda op, step: 10.0, sends=True), tmp_path / "job")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path in sorted(job.rglob("*")):
            if path.is_file():
                z.write(path, path.relative_to(tmp_path))
    at = open_page(start_app(), "runs")
    upload_archive(at, "job.zip", buf.getvalue(), term=None)
    [run] = list_runs(db)
    assert run.backend == "hccl" and run.nproc == 2
    charts = [figure(at, i) for i in range(len(at.get("plotly_chart")))]
    comm = next(f for f in charts if any(t.get("name") == "hcom send" for t in f["data"]))
    strips = next(t for t in comm["data"] if t.get("name") == "hcom send")
    assert len(strips["hovertext"]) == 8 and strips["hovertext"][0].startswith("<b>hcom_send__")  # one step's sends
    assert any(t.get("name", "").startswith("llm") for t in comm["data"])  # over the step's ops
    assert "communication rows per rank (HCCL lanes): send [8, 8]" in run.log_tail
