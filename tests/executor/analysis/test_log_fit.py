"""`calibrate --log` (executor/analysis/log_fit.py): a log whose steady step time the
model itself gives at gemm_efficiency 0.7 is fitted back to 0.7, from each stack's
line; the median ignores warm-up and 30% swings; the refusals."""
import datetime

import pytest

from executor.analysis.device_fit import with_device
from executor.analysis.log_fit import fit_log
from executor.errors import CalibrationError
from mpipe_core.api import evaluate
from mpipe_core.formats.training_log import parse_training_log
from mpipe_core.workloads.presets import DEVICES
from training_logs import megatron_log, mindspeed_mm_log, torchtitan_log

DOC = {"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100", "parallel": {"tp": 2, "dp": 2}}
TERM = "1f1b(p=4, m=8)"  # 2 x 2 x 4 = 16 devices, as the logs' world size says
SWINGS = (1.0, 0.7, 1.3, 1.0, 0.85, 1.15, 1.0)  # +-30%, median 1.0
A100 = DEVICES["a100"]  # (its figures are the preset's, whatever they are)


@pytest.fixture(scope="module")
def target_s() -> float:
    """The step time the model predicts at gemm_efficiency 0.7: what the 'job' ran at."""
    return evaluate(TERM, with_device(DOC, {"gemm_efficiency": 0.7})).step.step_time_s


def test_a_megatron_log_is_fitted_back_to_the_efficiency_it_was_made_at(target_s):
    times = [5000.0] + [target_s * 1e3 * x for x in SWINGS]  # warm-up line, then steps varying 30%
    log = parse_training_log(megatron_log(times, tflops=[50.0] + [120.0] * len(SWINGS)))
    fit = fit_log(log, DOC, TERM, name="logs/train.log", today=datetime.date(2026, 12, 7))
    assert fit.fitted == pytest.approx(0.7, rel=2e-4)
    assert fit.before == A100["gemm_efficiency"] and fit.used == 7 and fit.skipped == 1
    assert fit.median_s == pytest.approx(target_s, rel=1e-4)
    assert abs(fit.residual) < 1e-6
    assert fit.spread == pytest.approx((-0.3, 0.3), abs=1e-4)
    assert fit.devices == 16 and fit.world_size == 16 and fit.log_tflops == 120.0
    device = fit.workload["device"]
    assert device["preset"] == "a100" and device["gemm_efficiency"] == fit.fitted
    assert device["calibration"] == {"from": "log", "log": "train.log", "format": "megatron", "term": TERM,
                                     "lines": 7, "skipped": 1, "median_step_s": fit.median_s,
                                     "date": "2026-12-07"}
    assert evaluate(TERM, fit.workload).step.step_time_s == pytest.approx(fit.median_s, rel=1e-6)
    report = fit.format_report()
    assert f"gemm_efficiency   {A100['gemm_efficiency']:.4g} -> 0.7" in report and "7 steady iteration lines used, 1 skipped" in report
    # one step time fits one fraction: the preset's attention-core and memory-bound fractions stay
    assert fit.kept == {k: A100[k] for k in ("attention_efficiency", "hbm_efficiency", "memory_efficiency",
                                             "flash_efficiency")} and fit.follows == {}
    assert "attention_efficiency" not in device and "memory_efficiency" not in device
    assert "kept             attention_efficiency 0.3325" in report and "as the workload states them" in report


def test_a_device_stating_no_attention_fraction_has_it_follow_the_fitted_gemm():
    doc = {**DOC, "device": "h100", "cluster": "dgx-h100"}
    target = evaluate(TERM, with_device(doc, {"gemm_efficiency": 0.6})).step.step_time_s
    fit = fit_log(parse_training_log(megatron_log([5000.0] + [target * 1e3] * 3)), doc, TERM)
    assert fit.fitted == pytest.approx(0.6, rel=2e-4)
    assert fit.follows == {"attention_efficiency": "gemm_efficiency"} and "attention_efficiency" not in fit.kept
    assert fit.kept["memory_efficiency"] == DEVICES["h100"]["hbm_efficiency"]  # memory = hbm, not fitted
    assert "attention_efficiency = gemm_efficiency (the workload states none), so it moved with it" \
        in fit.format_report()


def test_skip_leaves_out_as_many_lines_as_asked(target_s):
    times = [9000.0, 8000.0, 7000.0] + [target_s * 1e3] * 2
    log = parse_training_log(megatron_log(times))
    assert fit_log(log, DOC, TERM, skip=3).fitted == pytest.approx(0.7, rel=2e-4)
    assert fit_log(log, DOC, TERM, skip=1).fitted < 0.5  # the median of 8, 7 s and two steady lines


def test_mindspeed_mm_and_torchtitan_lines_fit_the_same(target_s):
    mm = parse_training_log(mindspeed_mm_log([4000.0] + [target_s * 1e3] * 4))
    assert fit_log(mm, DOC, TERM).fitted == pytest.approx(0.7, rel=2e-4)
    # torchtitan prints tokens per second per device: 2 (dp) x 8 microbatches x 4096 tokens a step
    tps = 2 * 8 * 4096 / (target_s * 16)
    titan = parse_training_log(torchtitan_log([tps / 3] + [tps * x for x in SWINGS]))
    fit = fit_log(titan, DOC, TERM)
    assert fit.fitted == pytest.approx(0.7, rel=1e-3) and fit.used == 7


def test_a_truncated_last_line_never_moves_the_fit(target_s):
    text = megatron_log([5000.0] + [target_s * 1e3] * 3) + " iteration 5/5 | elapsed time per iteration (ms): 9"
    fit = fit_log(parse_training_log(text), DOC, TERM)
    assert fit.used == 3 and fit.incomplete == 1
    assert fit.fitted == pytest.approx(0.7, rel=2e-4)


def test_refusals(target_s):
    log = parse_training_log(megatron_log([5000.0, target_s * 1e3]))
    with pytest.raises(CalibrationError) as err:
        fit_log(log, DOC, TERM, skip=2, name="t.log")
    assert str(err.value) == "t.log: 2 iteration lines (Megatron-LM / MindSpeed); --skip 2 leaves none to fit"
    with pytest.raises(CalibrationError) as err:
        fit_log(log, {**DOC, "parallel": {"tp": 2, "dp": 4}}, TERM, name="t.log")
    assert str(err.value) == ("t.log: the log's world size is 16, the layout has 32 devices (tp 2 x cp 1 x dp 4 x 4 "
                              "pipeline devices of 1f1b(p=4, m=8)): give the job's --parallel and term")
    fast = parse_training_log(megatron_log([5000.0, 1.0]))
    with pytest.raises(CalibrationError, match=r"^t.log: the median step 0.001 s is faster than 1f1b\(p=4, m=8\) "
                                               r"can run on a100 even at gemm_efficiency 1 "):
        fit_log(fast, DOC, TERM, name="t.log")
