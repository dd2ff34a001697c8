"""`mpipe calibrate --log FILE -w WORKLOAD --term TERM` end to end: a Megatron log
made at gemm_efficiency 0.7 is fitted, written with -o, saved with --save and
evaluated; bad input is one `error:` line and exit 2."""
from __future__ import annotations

import json

import pytest

from executor.analysis.device_fit import with_device
from mpipe_cli.main import main
from mpipe_core.api import evaluate
from mpipe_core.workloads.presets import DEVICES
from training_logs import megatron_log

DOC = {"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100"}
TERM = "1f1b(p=4, m=8)"
PARALLEL = "tp=2,dp=2"


@pytest.fixture(scope="module")
def target_s() -> float:
    return evaluate(TERM, with_device({**DOC, "parallel": {"tp": 2, "dp": 2}}, {"gemm_efficiency": 0.7})
                    ).step.step_time_s


@pytest.fixture
def files(tmp_path, target_s):
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(DOC))
    log = tmp_path / "train.log"
    log.write_text(megatron_log([5000.0] + [target_s * 1e3 * x for x in (1.0, 0.7, 1.3, 1.0, 1.0)]))
    return wl, log


def _run(capsys, *argv) -> tuple[int, str, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


def test_calibrate_log_writes_a_workload_that_predicts_the_logged_step(capsys, tmp_path, files, target_s):
    wl, log = files
    out = tmp_path / "fitted.json"
    code, text, _ = _run(capsys, "calibrate", "--log", str(log), "-w", str(wl), "--term", TERM,
                         "--parallel", PARALLEL, "-o", str(out))
    assert code == 0
    assert f"device a100 fitted from log {log} (Megatron-LM / MindSpeed): 5 steady iteration lines used, 1 " \
           "skipped as warm-up" in text
    assert f"gemm_efficiency   {DEVICES['a100']['gemm_efficiency']:.4g} -> 0.7" in text and "residual" in text
    fitted = json.loads(out.read_text())
    assert fitted["parallel"] == {"tp": 2, "dp": 2}
    assert fitted["device"]["calibration"]["log"] == "train.log"
    assert main(["eval", TERM, "-w", str(out), "--json"]) == 0
    step = json.loads(capsys.readouterr().out)["step_time_s"]
    assert step == pytest.approx(target_s, rel=1e-4)


@pytest.mark.databases("sqlite")
def test_calibrate_log_saves_for_eval(capsys, files, db, db_url, target_s):
    wl, log = files
    code, text, _ = _run(capsys, "calibrate", "--log", str(log), "-w", str(wl), "--term", TERM,
                         "--parallel", PARALLEL, "--save", "mine", "--db", db_url, "--json")
    assert code == 0
    doc = json.loads(text)
    assert doc["saved"] == "mine@1" and doc["lines_used"] == 5
    assert main(["eval", TERM, "-w", "saved:mine", "--db", db_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(target_s, rel=1e-4)
    # plan and tune read it too, and say what their step times rest on
    code, text, _ = _run(capsys, "plan", "-w", "saved:mine", "--db", db_url, "--devices", "16", "--global-batch",
                         "16", "--top", "1", "--time-limit", "1")
    assert code == 0 and "device: a100 calibrated from log train.log (megatron, 5 steady lines" in text
    code, text, _ = _run(capsys, "tune", "-w", "saved:mine", "--db", db_url, "-p", "8", "-m", "2",  # 8 in all: tp 2 x dp 2 x 2 stages
                         "--time-limit", "2")
    assert code == 0 and "device: a100 calibrated from log train.log (megatron, 5 steady lines" in text


def test_bad_input_is_one_error_line(capsys, tmp_path, files):
    wl, log = files
    base = ("calibrate", "--log", str(log), "-w", str(wl), "--term", TERM)
    other = tmp_path / "other.log"
    other.write_text("> building GPT model ...\nsome other line\n")
    cases = [
        (("calibrate", "--log", str(other), "-w", str(wl), "--term", TERM, "--parallel", PARALLEL),
         f"error: {other}: no iteration line of a known format (Megatron-LM/MindSpeed 'elapsed time per "
         "iteration (ms): X |', torchtitan 'step: N ... tps: X ... mfu: X%', MindSpeed-MM FSDP 'iteration "
         "N/T | ... elapsed time per iteration (ms): X |')"),
        (base + ("--parallel", PARALLEL, "--skip", "6"),
         f"error: {log}: 6 iteration lines (Megatron-LM / MindSpeed); --skip 6 leaves none to fit"),
        (base + ("--parallel", "tp=2,dp=4"),
         f"error: {log}: the log's world size is 16, the layout has 32 devices (tp 2 x cp 1 x dp 4 x 4 pipeline "
         "devices of 1f1b(p=4, m=8)): give the job's --parallel and term"),
        (("calibrate", "--log", str(log), "-w", str(wl)), "error: calibrate --log needs --term: the pipeline "
                                                           "schedule the job ran"),
        (("calibrate", "--log", str(log), "--term", TERM), "error: calibrate --log needs --workload (-w): the "
                                                            "job's analytic workload"),
        (("calibrate",), "error: calibrate needs a RUN (its stored timings), --log FILE (a training log) or "
                         "--device --layer-profile FILE (a layer profile)"),
        (base + ("--device", "--layer-profile", "p.json"), "error: give --log FILE or --layer-profile FILE, not both"),
        (base + ("--statistic", "median"), "error: --statistic applies to a RUN: --log always fits the median of the "
                                           "steady lines"),
        (("calibrate", "3", "--log", str(log)), "error: give a RUN or --log FILE, not both"),
        (("calibrate", "3", "--skip", "2"), "error: --skip applies to --log (a run's warm-up step is left out by "
                                            "itself)"),
        (("calibrate", "--log", str(tmp_path / "missing.log"), "-w", str(wl), "--term", TERM),
         f"error: {tmp_path / 'missing.log'}: cannot read (No such file or directory)"),
    ]
    for argv, line in cases:
        code, _, err = _run(capsys, *argv)
        assert (code, err) == (2, [line]), argv
