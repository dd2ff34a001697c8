"""Device counts as a cluster's users say them (on CloudMatrix384 a device is one die,
two to a 910C NPU), and `tune --devices` meaning devices in all, as its help says."""
from __future__ import annotations

import json

from tests.mpipe_cli.cli_runner import run_cli

from mpipe_core.workloads.cluster import devices_text, parse_cluster

# A small LLM on one die of a 910C: plan and tune of it take seconds.
TINY_NPU = {"model": {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 128, "vocab": 1000, "ffn": 1024},
            "device": "ascend-910c", "cluster": "cloudmatrix384"}


def test_a_count_of_dies_names_its_npus():
    assert devices_text(512, 2) == "512 devices (256 NPUs, 2 dies each)"
    assert devices_text(8) == "8 devices" and devices_text(1) == "1 device"
    assert parse_cluster("cloudmatrix384").count_text(16) == "16 devices (8 NPUs, 2 dies each)"
    assert parse_cluster("dgx-h100").count_text(16) == "16 devices"
    # A cluster file may say it too; an NPU that is one die says nothing more.
    assert parse_cluster({"preset": "atlas-910b", "dies_per_npu": 2}).count_text(4) == \
        "4 devices (2 NPUs, 2 dies each)"


def test_plan_and_eval_say_the_npus_beside_the_devices(tmp_path):
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(TINY_NPU))
    out = run_cli(["plan", "-w", str(path), "--devices", "16", "--global-batch", "16", "--top", "1"])
    assert out.code == 0, out.err
    assert out.out.splitlines()[0].startswith("16 devices (8 NPUs, 2 dies each) on cloudmatrix384, global batch 16")
    out = run_cli(["eval", "1f1b(p=4, m=4)", "-w", str(path), "--parallel", "tp=2"])
    assert out.code == 0, out.err
    line = next(line for line in out.out.splitlines() if line.startswith("devices"))
    assert line.startswith("devices      8 devices (4 NPUs, 2 dies each) in all (4 pipeline devices x 2")


def test_tune_devices_are_devices_in_all_with_tp(tmp_path):
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(TINY_NPU))
    out = run_cli(["tune", "-w", str(path), "--parallel", "tp=2", "--devices", "8", "-m", "4", "--time-limit", "5"])
    assert out.code == 0, out.err
    assert out.out.splitlines()[0] == ("8 devices (4 NPUs, 2 dies each): 4 pipeline devices, each tp·cp·dp = 2 "
                                       "devices")
    assert "(p=4, m=4" in out.out and "(p=8," not in out.out
    assert "on 8 devices (4 NPUs, 2 dies each)" in out.out  # the best's step: devices in all
    out = run_cli(["tune", "-w", str(path), "--parallel", "tp=2", "--devices", "8", "-m", "4", "--time-limit", "5",
                   "--json"])
    doc = json.loads(out.out)
    assert {r["devices_total"] for r in doc["candidates"] if "devices_total" in r} == {8}


def test_tune_refuses_devices_that_are_not_whole_pipeline_devices(tmp_path):
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(TINY_NPU))
    out = run_cli(["tune", "-w", str(path), "--parallel", "tp=4", "--devices", "6", "-m", "4"])
    assert out.code == 2 and out.traceback is None
    assert out.error_lines == ["error: --devices 6 is not a multiple of tp·cp·dp = 4 (tp=4, cp=1, dp=1): every "
                               "pipeline device is 4 devices; give devices in all, e.g. --devices 4"]
