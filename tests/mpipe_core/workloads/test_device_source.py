"""What a step time rests on (mpipe_core/workloads/device_source.py): a preset with its
source, a calibration with its log or run and date, an uncalibrated device with the
command that would calibrate it, a device the workload states itself."""
from mpipe_core.workloads.device_source import CALIBRATE_COMMAND, PRESET_SOURCES, device_source
from mpipe_core.workloads.presets import DEVICES

A100 = DEVICES["a100"]  # (the preset's figures, whatever they are)
FIGURES = (f"attention {A100['attention_efficiency']:.3g}, hbm {A100['hbm_efficiency']:.3g}, "
           f"memory {A100['memory_efficiency']:.3g}, flash {A100['flash_efficiency']:.3g}")
FRACTIONS = ("gemm_efficiency", "attention_efficiency", "hbm_efficiency", "memory_efficiency", "flash_efficiency")


def test_a_measured_preset_names_its_source():
    src = device_source({"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100"})
    assert src.kind == "preset" and src.calibrated
    assert src.fractions == {k: A100[k] for k in FRACTIONS} and src.follows == {}
    assert "Korthikanti" in PRESET_SOURCES["a100"][1] and "matmul" not in PRESET_SOURCES["a100"][1]
    assert src.text() == f"a100 preset: gemm {A100['gemm_efficiency']:.3g}, {FIGURES} ({PRESET_SOURCES['a100'][1]})"


def test_the_ascend_910c_is_uncalibrated_and_says_how_to_calibrate_it():
    src = device_source({"model": "internlm2-20b", "device": "ascend-910c", "cluster": "cloudmatrix384"})
    assert src.kind == "uncalibrated" and not src.calibrated
    assert src.fractions["attention_efficiency"] == 0.7 and src.fractions["memory_efficiency"] == 0.6
    assert src.text() == ("ascend-910c UNCALIBRATED: gemm 0.7, attention = gemm, hbm 0.6, memory = hbm, flash 0.5 are "
                          "the vendor's nominal "
                          "efficiencies (msmodeling), not a measurement; calibrate it from a training log: "
                          f"{CALIBRATE_COMMAND}")
    assert "mpipe calibrate --log" in CALIBRATE_COMMAND


def test_a_calibration_names_its_log_or_run_and_date():
    log = {"model": "llama2-7b", "cluster": "dgx-a100",
           "device": {"preset": "a100", "gemm_efficiency": 0.61,
                      "calibration": {"from": "log", "log": "train.log", "format": "megatron", "lines": 19,
                                      "date": "2026-12-07"}}}
    src = device_source(log)
    assert src.kind == "calibrated"
    assert src.text() == ("a100 calibrated from log train.log (megatron, 19 steady lines, 2026-12-07): "
                          f"gemm 0.61, {FIGURES}")
    run = {**log, "device": {"preset": "ascend-910c", "gemm_efficiency": 0.55,
                             "calibration": {"from": "run", "run": 12, "date": "2026-12-01"}}}
    assert device_source(run).text() == ("ascend-910c calibrated from run 12 (2026-12-01): gemm 0.55, "
                                       "attention = gemm, hbm 0.6, memory = hbm, flash 0.5")


def test_a_device_the_workload_states_itself_says_no_calibration_is_recorded():
    src = device_source({"model": "llama2-7b", "cluster": "dgx-a100", "device": {"preset": "a100", "gemm_efficiency": 0.7}})
    assert src.kind == "stated"
    assert src.text() == f"a100: gemm 0.7, {FIGURES} (the workload's own gemm; no calibration recorded)"
    no_cluster = device_source({"model": "llama2-7b", "device": "ascend-910c"})
    assert no_cluster.fractions == {"efficiency": 0.4} and no_cluster.kind == "uncalibrated"
    assert device_source({"llm": {"f": 1}}) is None  # explicit costs: nothing rests on a device
