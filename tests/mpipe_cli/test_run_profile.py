"""`mpipe run --profile DIR` on CPU (2 gloo ranks under torchrun): each rank's
steps profiled with every op labelled `mpipe:<module>:<kind>:<mb>:<chunk>`, and
`mpipe import-trace DIR` reads the run back with the schedule's own ops in its
own order, encoder ops included.  (On NPU the same option writes torch_npu's
`*_ascend_pt` folders, on CUDA Kineto traces with device ranges: not runnable
here; scripts/device-check.sh runs the CUDA case.)  Bad --profile folders are
refused before anything starts."""
from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

TERM = "1f1b(p=2, m=4)"


def cli(*argv: str):
    out = run_cli(list(argv))
    assert out.traceback is None, out.traceback
    return out


@pytest.mark.slow
def test_a_profiled_run_imports_back_with_its_schedules_ops_in_order(tmp_path):
    folder = tmp_path / "prof"
    got = cli("run", TERM, "--model", "tiny", "--steps", "2", "--profile", str(folder), "--json")
    assert got.code == 0, got.err
    timeline = json.loads(got.out)["timeline"]  # the executor's own timing rows of the run
    assert sorted(p.name for p in folder.iterdir()) == ["rank0_trace.json", "rank1_trace.json"]
    db = str(tmp_path / "m.db")
    got = cli("import-trace", str(folder), "--db", db, "--json")
    assert got.code == 0, got.err
    doc = json.loads(got.out)
    assert doc["term"] == TERM and doc["term_inferred"] and len(doc["steps"]) == 2
    rows = json.loads(cli("runs", "show", str(doc["id"]), "--db", db, "--timings", "--json").out)["timings"]
    for step in (0, 1):
        for rank in (0, 1):
            order = [(t["module"], t["kind"], t["chunk"], t["microbatch"])
                     for t in sorted((t for t in timeline if t["step"] == step and t["device"] == rank),
                                     key=lambda t: t["start"])]
            assert order, (step, rank)
            got_order = [(t["module"], t["kind"], t["chunk"], t["microbatch"])
                         for t in sorted((t for t in rows if t["step"] == step and t["device"] == rank),
                                         key=lambda t: t["start"])]
            assert got_order == order, (step, rank)
    assert any(t["module"] == "vision" for t in rows)  # the encoder's ops are labelled too


def test_a_profile_folder_that_holds_files_or_an_in_process_run_is_refused(tmp_path):
    folder = tmp_path / "prof"
    folder.mkdir()
    (folder / "old_trace.json").write_text("{}")
    got = cli("run", TERM, "--model", "tiny-text", "--profile", str(folder))
    assert got.code == 2 and got.error_lines == [
        f"error: --profile {folder}: not empty; give a new or empty folder (import-trace reads every trace in it)"]
    got = cli("run", TERM, "--model", "tiny-text", "--in-process", "--profile", str(tmp_path / "new"))
    assert got.code == 2 and got.error_lines == [
        "error: --profile needs one process per rank (torchrun): leave out --in-process"]
    assert not (tmp_path / "new").exists()
