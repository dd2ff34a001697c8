"""`mpipe calibrate RUN --device` end to end: a stored run whose timings the
model made at gemm_efficiency 0.7, fitted back, written, and evaluated."""
from __future__ import annotations

import json

import pytest

from mpipe_cli.main import main
from mpipe_core.api import evaluate

DOC = {"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100", "parallel": {"tp": 2, "dp": 2}}
TERM = "1f1b(p=4, m=8)"
pytestmark = pytest.mark.databases("sqlite")


def _stored_run(db, doc: dict, measured_doc: dict) -> int:
    from storage import add_timings, claim_next_run, enqueue, finish_run, save_schedule

    save_schedule(db, "s", TERM, workload=doc)
    run = enqueue(db, "s").id
    claim_next_run(db, "w", 60)
    ev = evaluate(TERM, measured_doc)
    add_timings(db, run, [r._replace(start=r.start * 1e-3, end=r.end * 1e-3) for r in ev.timeline.records()])
    finish_run(db, run, "w", "succeeded", exit_code=0)
    return run


def test_calibrate_device_fits_writes_and_the_workload_evaluates(capsys, db, db_url, tmp_path):
    measured = {**DOC, "device": {"preset": "a100", "gemm_efficiency": 0.7}}
    run = _stored_run(db, DOC, measured)
    out = tmp_path / "fitted.json"
    assert main(["calibrate", str(run), "--device", "--db", db_url, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gemm_efficiency   0.7959 -> 0.7" in text and "mean error per op" in text and "llm BW" in text
    fitted = json.loads(out.read_text())
    assert fitted["device"]["preset"] == "a100"
    assert fitted["device"]["gemm_efficiency"] == pytest.approx(0.7, abs=1e-3)
    assert main(["eval", TERM, "-w", str(out), "--json"]) == 0
    step = json.loads(capsys.readouterr().out)["step_time_s"]
    assert step == pytest.approx(evaluate(TERM, measured).step.step_time_s, rel=1e-3)
    # The same against a workload named with -w (a file here), as JSON.
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(DOC))
    assert main(["calibrate", str(run), "--device", "--db", db_url, "--json", "-w", str(wl)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fitted"]["gemm_efficiency"] == pytest.approx(0.7, abs=1e-3)
    assert doc["error_after"] < 1e-3 < doc["error_before"]


def test_calibrate_device_refuses_an_explicit_workload_in_one_line(capsys, db, db_url):
    run = _stored_run(db, None, DOC)
    assert main(["calibrate", str(run), "--device", "--db", db_url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: calibrate --device needs an analytic workload (a model, a device and a cluster); "
                   "this one states its op costs explicitly"]



TABLE_4 = "examples/layer-profiles/korthikanti2022-table4.json"


def test_calibrate_device_from_a_layer_profile_writes_the_workload(capsys, tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    out = tmp_path / "fitted.json"
    assert main(["calibrate", "--device", "--layer-profile", TABLE_4, "-w", "gpt3-175b", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "baseline, no recompute" in text and "rms error 0.6%, max 1.2%" in text
    assert "memory_efficiency    0.9 kept" in text
    device = json.loads(out.read_text())["device"]
    calibration = device.pop("calibration")
    assert device == {"preset": "a100", "gemm_efficiency": 0.7959, "attention_efficiency": 0.3325}
    assert {k: calibration[k] for k in ("from", "profile", "cells")} == {
        "from": "layer profile", "profile": "korthikanti2022-table4.json", "cells": 10}
    # every step time on it (on a cluster: the roofline that prices these fractions) names the profile
    on_cluster = tmp_path / "on-cluster.json"
    on_cluster.write_text(json.dumps({**json.loads(out.read_text()), "cluster": "dgx-a100"}))
    assert main(["eval", "1f1b(p=2, m=2)", "-w", str(on_cluster)]) == 0
    assert (f"device       a100 calibrated from layer profile korthikanti2022-table4.json (10 cells, "
            f"{calibration['date']}): gemm 0.796, attention 0.333") in capsys.readouterr().out
    assert main(["calibrate", "--device", "--layer-profile", TABLE_4, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rms_error"] < 0.03 and len(doc["cells"]) == 10


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--layer-profile", TABLE_4],
     "--layer-profile applies to --device (it fits the device's efficiencies)"),
    (["calibrate", "3", "--device", "--layer-profile", TABLE_4],
     "calibrate: give a RUN or --layer-profile, not both (got run 3)"),
    (["calibrate", "--device", "--layer-profile", TABLE_4, "-o", "x.json"],
     "calibrate --layer-profile: -o/--save write a workload with the fitted device; name it with -w WORKLOAD"),
    (["calibrate", "--device", "--layer-profile", "/nonexistent/p.json"],
     "layer profile /nonexistent/p.json: cannot read it (No such file or directory)"),
    (["calibrate", "--device"], "calibrate needs a RUN (its stored timings), --log FILE (a training log) or "
                                "--device --layer-profile FILE (a layer profile)"),
])
def test_calibrate_layer_profile_mistakes_are_one_error_line(argv, message, capsys, tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(argv + ["--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]
