"""Traces uploaded on the Runs page (AppTest): a 2-rank trace built here in the
documented Kineto format becomes a run shown like any run (Gantt, comparison,
calibrate) and marked as imported; bad files get the CLI's one-line message
with the form's fields named, in the upload's status box, and save nothing;
a viewer is offered no upload, and a click that arrives after a demotion is
refused and audited.  The same upload in a real browser:
test_app_trace_upload_browser.py."""
from __future__ import annotations

import gzip
import json

import pytest
from app_helpers import MAIN, TIMEOUT_S, bars_by_trace, button, errors, figure, open_page, shown, start_app
from kineto_traces import pipelining_traces
from sqlalchemy import func, select
from streamlit.testing.v1 import AppTest

from app.access_config import AUTH_ENV, ROLES_ENV
from app.trace_upload import UploadProgress, form_message
from mpipe_core.api import evaluate
from storage import get_version, list_audit, list_runs, list_workloads, timings_for
from storage.models import OpTiming, Run, Schedule, ScheduleVersion

pytestmark = pytest.mark.databases("sqlite")
BOTH = pytest.mark.databases("sqlite", "postgresql")
TERM = "1f1b(p=2, m=4)"
BASE_NS = 1_790_000_000_000_000_000
UPLOADER = "runs.import.files.0"  # the form's first uploader (a fresh one follows each import)
AUTH = {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "a-cookie-secret-for-tests",
        "client_id": "mpipe", "client_secret": "secret",
        "server_metadata_url": "http://localhost:9/.well-known/openid-configuration"}


def rank_traces(term: str = TERM, steps: int = 3, slow_step: int = 2) -> list[tuple[str, bytes, str]]:
    """One Chrome/Kineto trace per rank as torch's runtime records `term`
    (docs/trace-import.md): every compute action a `PP:` range whose first child
    op (a cpu_op) starts 30 us in, F 200 us and backward 400 us of compute,
    ProfilerStep marks around steps; step `slow_step` runs 10% slower."""
    def cost(op, step):
        return (200.0 if op.kind == "F" else 400.0) * (1.1 if step == slow_step else 1.0)

    docs = pipelining_traces(term, cost, steps=steps, wait=30.0, after=10.0, base=BASE_NS)
    return [(f"rank{r}_trace.json", json.dumps(doc).encode(), "application/json") for r, doc in enumerate(docs)]


def counts(db) -> tuple[int, ...]:
    def read(session):
        return tuple(session.scalar(select(func.count()).select_from(m))
                     for m in (Schedule, ScheduleVersion, Run, OpTiming))
    return db.read(read)


def upload(at: AppTest, files, key: str = UPLOADER) -> AppTest:
    at.file_uploader(key=key).set_value(files).run()
    button(at, "Import traces").click().run()
    assert not at.exception
    return at


# --- a valid upload --------------------------------------------------------------------------

@BOTH
def test_uploaded_traces_become_a_run_shown_like_any_run_and_marked_imported(db, db_url):
    at = open_page(start_app(), "runs")
    assert "No runs yet." in [i.value for i in at.info]
    uploader = at.file_uploader(key=UPLOADER)
    assert uploader.accept_multiple_files and uploader.allowed_type == [".json", ".json.gz"]
    # The box takes what the import takes (256 MB by default), under Streamlit's own server cap here
    # (AppTest's default 200 MB; `mpipe app` raises it to the import's limit).
    assert uploader.proto.max_upload_size_mb == 200
    assert button(at, "Import traces").disabled
    upload(at, rank_traces())
    [run] = list_runs(db)
    version = get_version(db, run.ref)
    assert (run.source, run.status, run.nproc, run.steps, run.backend) == ("imported", "succeeded", 2, 3, "nccl")
    assert version.term == TERM and run.schedule == f"imported-{run.source_digest[:12]}"
    assert len(timings_for(db, run.id)) == 3 * 2 * 8
    assert [shown(s.value) for s in at.success] == [
        f"Imported run #{run.id} ({run.ref}): {TERM} (inferred from the ranks’ op orders), 2 ranks, 3 step(s), "
        f"ops per rank 24, 24. It is shown below."]
    # Selected, and shown as any run: the comparison against its term's prediction, every step, calibrate.
    assert at.selectbox(key="runs.selected").value == run.id
    assert shown(at.subheader[-1].value) == f"Run #{run.id}: {run.ref} · imported traces"
    assert [t.label for t in at.tabs] == ["Measured vs predicted", "Measured, all steps", "Calibrate"]
    assert bars_by_trace(figure(at)) == {"predicted llm F": 8, "predicted llm BW": 8, "measured llm F": 8,
                                         "measured llm BW": 8}
    labels = [m.label for m in at.metric]
    assert "Prediction error" in labels and "Measured makespan (mean of steps 1, 2)" in labels
    assert [shown(w.value) for w in at.warning] == [
        "imported (unit costs) (the run's own workload) declares no time unit: its costs are read as milliseconds "
        "(1 unit = 1 ms), which means something only if they were written in ms. An imported run keeps unit costs "
        "unless a workload was given at import: pick a calibration of another run for a prediction in ms "
        "(calibrating this one gives a fit); the bubble ratios below compare without units."]
    # Marked as imported: the list, the picker, the detail (source, digest, files).
    table = at.dataframe[0].value
    assert list(table["source"]) == ["imported traces"] and list(table["model"]) == ["–"]
    assert at.selectbox(key="runs.selected").format_func(run.id).startswith(f"#{run.id} {run.ref} (imported by tester")
    detail = next(shown(c.value) for c in at.caption if shown(c.value).startswith("Imported by tester"))
    assert f"files' sha256 {run.source_digest}" in detail and "nothing to cancel or launch again" in detail
    report = at.code[0].value
    assert report.startswith("imported 2 file(s), kineto: rank0_trace.json, rank1_trace.json\n"
                             f"term {TERM} (inferred from the ranks’ op orders)\n")
    # Nothing that makes no sense for it: no cancel, no recording progress.
    assert "Cancel this run" not in [b.label for b in at.button] and not at.get("progress")
    trail = [d.value for d in at.dataframe if "outcome" in d.value.columns][0]  # the run's own Activity
    assert list(trail["action"]) == ["import-trace"] and list(trail["outcome"]) == ["ok"]
    # Calibrate it like any run: a workload in ms, fitted on the imported timings.
    button(at, "Calibrate from this run").click().run()
    assert not at.exception
    [saved] = list_workloads(db)
    assert saved.name == f"cal-run-{run.id}"
    assert shown(at.success[-1].value).startswith(f"Saved workload {saved.ref}: predicted ")
    # The uploader is a fresh, empty one; the same files again are refused, naming the run.
    assert at.file_uploader(key="runs.import.files.1").value == []
    upload(at, rank_traces(), key="runs.import.files.1")
    assert errors(at) == [f"these traces (digest {run.source_digest[:12]}) were imported already as run {run.id} "
                          f"with term {TERM}"]
    assert len(list_runs(db)) == 1


def test_a_term_a_name_and_a_workload_of_ones_own_gzip_and_the_folder_layout(db, db_url):
    at = open_page(start_app(), "runs")
    at.text_input(key="runs.import.term").input("gpipe(p=2, m=4)").run()
    files = [(f"iteration_7/{name}.gz", gzip.compress(data), "application/gzip") for name, data, _ in rank_traces()]
    at.radio(key="runs.import.what").set_value("A folder").run()
    assert at.file_uploader(key=UPLOADER).accept_directory
    at.file_uploader(key=UPLOADER).set_value(files).run()
    button(at, "Import traces").click().run()
    # The term is checked against the traces: the CLI's message, with the form's field named.
    assert errors(at) == ["Term gpipe(p=2, m=4): rank 0, op 2: the traces ran llm:0BW0 where the term runs llm:0F2"]
    assert at.status[0].label == "Import refused: nothing was saved" and at.status[0].state == "error"
    assert counts(db) == (0, 0, 0, 0)
    at.text_input(key="runs.import.term").input(TERM)
    at.text_input(key="runs.import.name").input("from-titan")
    at.checkbox(key="runs.import.own_workload").check().run()
    at.selectbox(key="runs.import.wl.preset").set_value("uniform").run()
    button(at, "Import traces").click().run()
    assert not errors(at)
    [run] = list_runs(db)
    assert run.ref == "from-titan@1" and get_version(db, run.ref).workload_label == "uniform"
    assert at.code[0].value.startswith("imported 2 file(s), kineto: iteration_7/rank0_trace.json.gz, "
                                       "iteration_7/rank1_trace.json.gz\nterm 1f1b(p=2, m=4) (given)")


def test_megatrons_two_simulator_files_upload_as_one_run(db, db_url):
    ev = evaluate("interleaved(p=2, m=4)")
    durations, orders = {}, {}
    for r, order in enumerate(ev.schedule.orders):
        orders[str(r)] = []
        for op in order:
            kind = "forward" if op.kind == "F" else "backward"
            task = f"pp_{r}-mbs_{op.mb}-model_chunk_{op.chunk // 2}-task_type_{kind}"
            durations[task] = {"duration_ms": 1.0 if kind == "forward" else 2.0, "pp_rank": r,
                               "microbatch_id": op.mb, "model_chunk_id": op.chunk // 2, "task_type": kind}
            orders[str(r)].append(task)
    at = upload(open_page(start_app(), "runs"), [("task_durations.json", json.dumps(durations).encode(), "x"),
                                                 ("pp_task_orders.json", json.dumps(orders).encode(), "x")])
    [run] = list_runs(db)
    assert (run.source, run.backend, run.steps) == ("imported", "megatron-sim", 1)
    assert get_version(db, run.ref).term == "interleaved(p=2, m=4)"
    assert shown(at.subheader[-1].value) == f"Run #{run.id}: {run.ref} · imported traces"


# --- bad files -----------------------------------------------------------------------------

def _no_ranges():
    doc = json.loads(rank_traces()[0][1])
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("PP:")]
    return [("rank0_trace.json", json.dumps(doc).encode(), "x"), rank_traces()[1]]


def _twice():
    first = rank_traces()[0]
    return [first, ("copy_of_rank0.json", first[1], "x")]


def _negative():
    doc = json.loads(rank_traces()[1][1])
    doc["traceEvents"][2]["dur"] = -4.0
    return [rank_traces()[0], ("rank1_trace.json", json.dumps(doc).encode(), "x")]


BAD = {
    "truncated": (lambda: [("rank0_trace.json", rank_traces()[0][1][:300], "x"), rank_traces()[1]],
                  "rank0_trace.json:1:301: not valid JSON (Expecting ',' delimiter; a truncated or "
                  "damaged trace?)", "[1/2] parsing rank0_trace.json (0.0 MB)"),
    "gzip bomb": (lambda: [("rank0_trace.json.gz", gzip.compress(b" " * (40 << 20), 9), "x"), rank_traces()[1]],
                  "rank0_trace.json.gz: inflates more than 200 times its compressed size (a gzip bomb?); refused",
                  "received 2 file(s)"),
    "no pipeline ranges": (_no_ranges, "rank0_trace.json: no pipeline ranges: no PP:<action> ranges of "
                           "torch.distributed.pipelining, no mpipe:<module>:<kind>:<microbatch> labels; give a Label "
                           "pattern (a regex) for other names", "[2/2] parsing rank1_trace.json (0.0 MB)"),
    "two files for one rank": (_twice, "two files for rank 0: rank0_trace.json and copy_of_rank0.json",
                               "[2/2] parsing copy_of_rank0.json (0.0 MB)"),
    "negative dur": (_negative, "rank1_trace.json: event 2 ('PP:1B0'): dur -4 is negative",
                     "[2/2] parsing rank1_trace.json (0.0 MB)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_file_gets_the_clis_one_line_message_in_the_upload_and_saves_nothing(db, db_url, case):
    files, message, last_progress = BAD[case]
    at = upload(open_page(start_app(), "runs"), files())
    assert errors(at) == [message]
    [box] = at.status
    assert (box.label, box.state, box.proto.expanded) == ("Import refused: nothing was saved", "error", True)
    assert shown(at.get("progress")[0].proto.text) == last_progress  # how far it got
    assert counts(db) == (0, 0, 0, 0) and list_audit(db, actions=("import-trace",)) == []
    assert "No runs yet." in [i.value for i in at.info]


def test_the_size_limit_is_the_imports_and_the_box_says_it(db, db_url, monkeypatch):
    monkeypatch.setenv("MPIPE_TRACE_LIMIT_MB", "0.002")
    at = open_page(start_app(), "runs")
    assert at.file_uploader(key=UPLOADER).proto.max_upload_size_mb == 1  # whole MB, rounded up
    assert ("At most 0.002 MB per file once decompressed (the import's limit; $MPIPE_TRACE_LIMIT_MB on the server "
            "sets it). A .json.gz that inflates more than 200 times its size is refused as a gzip bomb."
            in [shown(c.value) for c in at.caption])
    upload(at, rank_traces())
    assert errors(at) == ["rank0_trace.json: larger than the limit of 0.002 MB (set $MPIPE_TRACE_LIMIT_MB for "
                          "larger traces)"]
    assert counts(db) == (0, 0, 0, 0)


def test_a_pattern_without_a_kind_group_is_refused_before_any_file_is_read(db, db_url):
    at = open_page(start_app(), "runs")
    at.text_input(key="runs.import.pattern").input(r"fwd_mb(?P<microbatch>\d+)")
    upload(at, rank_traces())
    assert errors(at) == ["Label pattern: the pattern has no named group 'kind' (write (?P<kind>...); groups: kind, "
                          "microbatch, optional chunk, module)"]
    assert not at.status and counts(db) == (0, 0, 0, 0)


def test_the_forms_fields_replace_the_clis_flags_and_nothing_else():
    assert form_message("x: nothing matching the --label-pattern; give --label-pattern REGEX for other names") == (
        "x: nothing matching the Label pattern; give a Label pattern (a regex) for other names")
    assert form_message("--term zbv(p=2, m=4) runs on 2 devices") == "Term zbv(p=2, m=4) runs on 2 devices"
    assert form_message("no trace for rank 1 (world size 8; ranks given: 0); for one pipeline of a larger world give "
                        "--layout tp=..,dp=..,pp=..") == (
        "no trace for rank 1 (world size 8; ranks given: 0); for one pipeline of a larger world store it with a "
        "workload of yours whose parallel section gives tp and dp")
    assert form_message("set $MPIPE_TRACE_LIMIT_MB for larger traces") == "set $MPIPE_TRACE_LIMIT_MB for larger traces"


def test_progress_follows_the_imports_own_lines(db):
    from storage.imported_runs import import_traces

    seen = []
    files = [(n, d) for n, d, _ in rank_traces()]
    import_traces(db, files, progress=UploadProgress(lambda f, line: seen.append((round(f, 3), line))))
    assert seen == [(0.05, "[1/2] parsing rank0_trace.json (0.0 MB)"), (0.475, "[2/2] parsing rank1_trace.json "
                    "(0.0 MB)"), (0.9, "storing 48 ops of 2 ranks")]
    # A large upload is announced as it is decoded, before its parsing starts (trace_files, over 8 MB).
    progress = UploadProgress(lambda f, line: seen.append((f, line)))
    progress("reading rank0_trace.json.gz (9 MB)")
    assert seen[-1] == (0.0, "reading rank0_trace.json.gz (9 MB)")


# --- roles ---------------------------------------------------------------------------------

@pytest.fixture
def roles_file(tmp_path, monkeypatch, db_url):
    path = tmp_path / "roles.toml"
    path.write_text('[users]\n"dana@example.org" = "designer"\n"vera@example.org" = "viewer"\n')
    monkeypatch.setenv(AUTH_ENV, "signin")
    monkeypatch.setenv(ROLES_ENV, str(path))
    return path


def signed_in(email: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    at.secrets["auth"] = AUTH
    at.user = {"is_logged_in": True, "email": email, "sub": email.split("@")[0]}
    return open_page(at.run(), "runs")


def test_a_viewer_is_offered_no_upload_and_a_designers_demoted_click_is_refused_and_audited(roles_file, db):
    viewer = signed_in("vera@example.org")
    assert not viewer.get("file_uploader") and "Import traces" not in [b.label for b in viewer.button]
    assert ("Importing traces needs the designer role; you are signed in as vera@example.org (viewer)."
            in [shown(c.value) for c in viewer.caption])
    dana = signed_in("dana@example.org")  # a designer may import (and may not launch)
    dana.file_uploader(key=UPLOADER).set_value(rank_traces()).run()
    roles_file.write_text('[users]\n"dana@example.org" = "viewer"\n')  # demoted meanwhile
    button(dana, "Import traces").click().run()
    assert not dana.exception
    assert errors(dana) == ["refused: dana@example.org (viewer) may not import traces; that needs the designer role "
                            "(traces)"]
    assert counts(db) == (0, 0, 0, 0)
    [entry] = list_audit(db, actions=("import-trace",))
    assert (entry.actor, entry.role, entry.via, entry.outcome) == ("dana@example.org", "viewer", "app", "refused")
    assert not dana.get("file_uploader")  # the form is gone; the page says why


def test_a_designers_import_is_theirs(roles_file, db):
    dana = upload(signed_in("dana@example.org"), rank_traces())
    [run] = list_runs(db)
    assert run.launched_by == "dana@example.org" and run.source == "imported"
    [entry] = list_audit(db, actions=("import-trace",))
    assert (entry.actor, entry.role, entry.outcome, entry.run_id) == ("dana@example.org", "designer", "ok", run.id)
    assert "Calibrate" not in [t.label for t in dana.tabs]  # an operator's
