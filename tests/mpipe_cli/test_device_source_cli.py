"""Every command that prints a step time names what it rests on: the device's
efficiencies and their source (a preset, a calibration with its log and date), or
UNCALIBRATED with the command that would calibrate it."""
from __future__ import annotations

import json

from mpipe_cli.main import main
from mpipe_core.workloads.device_source import CALIBRATE_COMMAND, PRESET_SOURCES
from mpipe_core.workloads.presets import DEVICES

_A = DEVICES["a100"]  # (the preset's figures and source, whatever they are)
FIGURES = (f"attention {_A['attention_efficiency']:.3g}, hbm {_A['hbm_efficiency']:.3g}, "
           f"memory {_A['memory_efficiency']:.3g}, flash {_A['flash_efficiency']:.3g}")
A100 = f"device       a100 preset: gemm {_A['gemm_efficiency']:.3g}, {FIGURES} ({PRESET_SOURCES['a100'][1]}"
TINY = {"model": {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 128, "vocab": 1000, "ffn": 1024},
        "device": "a100", "cluster": "dgx-a100"}


def _out(capsys, *argv) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_eval_names_a_preset_its_calibration_or_that_it_is_uncalibrated(capsys, tmp_path):
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps(TINY))
    assert A100 in _out(capsys, "eval", "1f1b(p=2, m=2)", "-w", str(tiny))
    assert ("device       a100 preset: efficiency 0.5 (a typical achieved fraction of peak: without a cluster "
            "there is no roofline (docs/cluster.md))") in _out(capsys, "eval", "1f1b(p=2, m=2)", "-w", "llama2-7b")
    doc = json.loads(_out(capsys, "eval", "1f1b(p=2, m=2)", "-w", str(tiny), "--json"))
    assert doc["device_source"]["kind"] == "preset" and doc["device_source"]["calibrated"]
    ascend = tmp_path / "ascend.json"
    ascend.write_text(json.dumps({"model": "internlm2-20b", "device": "ascend-910c", "cluster": "cloudmatrix384"}))
    text = _out(capsys, "eval", "1f1b(p=2, m=2)", "-w", str(ascend))
    assert ("device       ascend-910c UNCALIBRATED: gemm 0.7, attention = gemm, hbm 0.6, memory = hbm, "
            "flash 0.5 are the vendor's nominal "
            f"efficiencies (msmodeling), not a measurement; calibrate it from a training log: {CALIBRATE_COMMAND}"
            ) in text.splitlines()
    fitted = tmp_path / "fitted.json"
    fitted.write_text(json.dumps({**TINY, "device": {"preset": "a100", "gemm_efficiency": 0.5, "calibration": {
        "from": "log", "log": "train.log", "format": "megatron", "lines": 9, "date": "2026-12-07"}}}))
    text = _out(capsys, "eval", "1f1b(p=2, m=2)", "-w", str(fitted))
    assert ("device       a100 calibrated from log train.log (megatron, 9 steady lines, 2026-12-07): gemm 0.5, "
            f"{FIGURES}") in text.splitlines()


def test_compare_plan_and_tune_name_the_device_too(capsys, tmp_path):
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps(TINY))
    text = _out(capsys, "compare", "1f1b(p=2, m=2)", "gpipe(p=2, m=2)", "-w", str(tiny))
    assert "device " + A100.split("device       ")[1] in text
    text = _out(capsys, "plan", "-w", str(tiny), "--devices", "2", "--global-batch", "4", "--top", "2")
    assert "device: " + A100.split("device       ")[1] in text
    text = _out(capsys, "tune", "-w", str(tiny), "--devices", "2", "--microbatches", "2", "--time-limit", "5")
    assert "device: " + A100.split("device       ")[1] in text
    doc = json.loads(_out(capsys, "plan", "-w", str(tiny), "--devices", "2", "--global-batch", "4", "--json"))
    assert doc["device_source"]["device"] == "a100"
