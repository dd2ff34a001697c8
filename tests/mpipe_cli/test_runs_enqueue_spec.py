"""`mpipe runs enqueue NAME --spec FILE [--scale dp=K]` (issue 39 section 8): a
run spec is saved as a version of schedule NAME whose workload carries the
spec's layout, and queued on the ranks the queue's rule gives it; the same spec
again reuses that version; bad combinations are one `error:` line, exit 2."""
from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

from mpipe_core.runs.layout import RunLayout
from mpipe_core.runs.run_spec import RunSpec, write_run_spec

TINY = {"model": {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 128, "vocab": 1000, "ffn": 1024,
                  "microbatch_size": 4}, "device": "a100", "cluster": "dgx-a100",
        "parallel": {"tp": 1, "cp": 1, "dp": 2, "sp": False, "distributed_optimizer": True}}
TERM = "1f1b(p=2, m=4)"


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "run.json"
    write_run_spec(RunSpec(TERM, TINY, RunLayout(pp=2, dp=2, distributed_optimizer=True), "a test"), path)
    return path


def test_a_spec_is_saved_and_queued_on_its_layout(tmp_path, spec_file):
    from storage import get_version, list_runs, open_database

    url = f"sqlite:///{tmp_path / 'mpipe.db'}"
    first = run_cli(["runs", "enqueue", "planned", "--spec", str(spec_file), "--db", url, "-o", "check_grads=true"])
    assert first.code == 0 and first.traceback is None, first.err
    assert first.out == "queued run 1: planned@1 on 4 x gloo, 1 step(s)\n"
    again = run_cli(["runs", "enqueue", "planned", "--spec", str(spec_file), "--db", url])
    assert again.out == "queued run 2: planned@1 on 4 x gloo, 1 step(s)\n"  # the same version, not a copy
    scaled = run_cli(["runs", "enqueue", "planned", "--spec", str(spec_file), "--scale", "dp=1", "--db", url])
    assert scaled.out == "queued run 3: planned@2 on 2 x gloo, 1 step(s)\n"
    db = open_database(url)
    try:
        runs = sorted(list_runs(db), key=lambda r: r.id)
        assert [r.options for r in runs] == [{"check_grads": True}, {}, {}]
        for ref, dp in (("planned@1", 2), ("planned@2", 1)):
            version = get_version(db, ref)
            assert version.term == TERM
            assert RunLayout.from_parallel(version.workload["parallel"], 2) == RunLayout(
                pp=2, dp=dp, distributed_optimizer=True)
    finally:
        db.close()


@pytest.mark.parametrize("args, message", [
    (["--scale", "dp=1"], "error: --scale scales a run spec's layout: give --spec FILE with it"),
    (["--spec", "SPEC", "--nproc", "4"],
     "error: --spec's layout gives the ranks (tp*cp*pp*dp): drop --nproc (--scale dp=K changes dp)"),
    (["--spec", "SPEC", "--scale", "dp=0"], "error: --scale dp=0: dp must be a whole number from 1 to 1000000"),
    (["--spec", "NOT_A_SPEC"], "error: --spec NOT_A_SPEC: not a run spec (a JSON object with \"format\": "
                               "\"mpipe-run-spec\", as `mpipe plan --emit mpipe` writes)"),
])
def test_bad_spec_arguments_are_one_line(tmp_path, spec_file, args, message):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"term": TERM}))
    args = [str(spec_file) if a == "SPEC" else str(other) if a == "NOT_A_SPEC" else a for a in args]
    message = message.replace("NOT_A_SPEC", str(other))
    got = run_cli(["runs", "enqueue", "planned", *args, "--db", f"sqlite:///{tmp_path / 'mpipe.db'}"])
    assert (got.code, got.error_lines, got.traceback) == (2, [message], None)


def test_with_spec_the_name_takes_no_version(tmp_path, spec_file):
    got = run_cli(["runs", "enqueue", "planned@3", "--spec", str(spec_file), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert got.error_lines == ["error: with --spec, planned@3 names the schedule the spec is saved as: drop '@VERSION'"]
