"""Small things a newcomer hit: transposing an encoder twice is refused, `--parallel`'s
help names every key, `make run` takes a port, ordinals read as words."""
from __future__ import annotations

import subprocess

import pytest
from pathlib import Path

from tests.mpipe_cli.cli_runner import run_cli

REPO = Path(__file__).resolve().parents[2]


def test_transposing_an_encoder_twice_is_one_error_naming_the_inner_transpose():
    out = run_cli(["eval", "transpose(transpose(1f1b(p=4, m=4)), mode=dynamic)", "-w", "vit-heavy-small"])
    assert out.code == 2 and out.traceback is None
    assert out.error_lines == ["error: 1:1: transpose: its term already transposes vision (the transpose at line 1, "
                               "column 11): an encoder is transposed once; remove one transpose"]
    # Under a wrapper too.
    out = run_cli(["eval", "transpose(recompute(transpose(1f1b(p=4, m=4)), encoders=yes))", "-w", "vit-heavy-small"])
    assert out.code == 2 and "already transposes vision" in out.error_lines[0]


def test_parallel_help_names_every_key_of_the_parallel_section():
    from mpipe_core.workloads.analytic import PARALLEL_DEFAULTS

    out = run_cli(["eval", "--help"])
    text = " ".join(out.out.split())
    start = text.index("--parallel KEY=VALUE,... an analytic")
    help_text = text[start:start + 600]
    assert [key for key in PARALLEL_DEFAULTS if key not in help_text] == []


def test_make_run_takes_a_port():
    done = subprocess.run(["make", "-n", "run", "PORT=8600", "VENV=/nonexistent-venv"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert "/nonexistent-venv/bin/mpipe app --port 8600" in done.stdout
    done = subprocess.run(["make", "-n", "run", "VENV=/nonexistent-venv"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert "/nonexistent-venv/bin/mpipe app --port 8501" in done.stdout


def test_ordinals_read_as_words():
    from mpipe_core.search.plan import ordinal

    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 103, 111)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "103rd", "111th"]


def test_plan_prints_a_reproduce_command_that_runs(tmp_path, monkeypatch):
    import json
    import shlex

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tiny = {"model": {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 128, "vocab": 1000, "ffn": 1024},
            "device": "a100", "cluster": "dgx-a100"}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(tiny))
    out = run_cli(["plan", "-w", str(path), "--devices", "4", "--global-batch", "8", "--top", "1"])
    assert out.code == 0, out.err
    line = next(line.strip() for line in out.out.splitlines() if line.strip().startswith("reproduce:"))
    argv = shlex.split(line.removeprefix("reproduce:"))
    assert argv[:2] == ["mpipe", "eval"] and argv[3] == "-w" and argv[4].startswith(str(tmp_path / "cache"))
    again = run_cli(argv[1:] + ["--json"])
    assert again.code == 0, again.err
    best = json.loads(run_cli(["plan", "-w", str(path), "--devices", "4", "--global-batch", "8", "--top", "1",
                               "--json"]).out)["best"]
    assert json.loads(again.out)["step_time_s"] == best["step_time_s"] and argv[2] == best["term"]


@pytest.mark.databases("sqlite")
def test_library_list_and_diff_say_units_fits_percentage_points_and_devices_in_all(db_url):
    """`library list` gives each makespan in its workload's unit (never ms beside s in one
    unlabelled column) and whether it fits; `library diff` gives a fraction's change in
    percentage points and the devices in all (tp x pp x dp), as the app does."""
    from storage import open_database, save_schedule

    db = open_database(db_url)
    try:
        from mpipe_core.workloads.presets import preset_document

        save_schedule(db, "short", "1f1b(p=4, m=8)", workload="llava-7b")  # ms, under a second

        doc = preset_document("internvl-26b")
        doc["parallel"] = {"tp": 8, "sp": True, "dp": 8}
        save_schedule(db, "wide", "zbv(p=8, m=16)", workload=doc)
        doc2 = dict(doc, parallel={"tp": 8, "sp": True, "dp": 16})
        save_schedule(db, "wide", "zbv(p=4, m=16)", workload=doc2, update=True)
    finally:
        db.close()
    out = run_cli(["library", "list", "--db", db_url])
    assert out.code == 0, out.err
    header, *rows = out.out.splitlines()
    assert header.split()[:6] == ["NAME", "VER", "MAKESPAN", "BUBBLE", "EFF", "FITS"]
    makespans = {row.split()[0]: row.split()[2:4] for row in rows}
    assert makespans["short"][1] == "ms" and makespans["wide"][1] == "s"  # each with its unit
    assert {row.split()[0]: row.split()[6] for row in rows} == {"short": "yes", "wide": "no"}
    out = run_cli(["library", "diff", "wide@1", "wide@2", "--db", db_url])
    assert out.code == 0, out.err
    lines = out.out.splitlines()
    devices = next(line for line in lines if line.startswith("devices (in all)"))
    assert " ".join(devices.split()) == ("devices (in all) 512 (tp 8 × pp 8 × dp 8; 256 NPUs, 2 dies each) "
                                         "512 (tp 8 × pp 4 × dp 16; 256 NPUs, 2 dies each) +0")
    bubble = next(line for line in lines if line.startswith("bubble_ratio"))
    assert bubble.endswith(" pp") and "%" not in bubble.split()[-2]


def test_durations_read_without_exponents_or_leading_zeros():
    from mpipe_core.workloads.units import quantity, seconds

    assert quantity(11270.0, "ms") == "11.27 s" and "e+" not in quantity(11270.0, "")
    assert seconds(0.01854) == "18.54 ms" and seconds(5.052) == "5.052 s" and seconds(11270.0) == "11,270 s"
    assert seconds(0.9175, signed=True) == "+917.5 ms" and seconds(-2.5, signed=True) == "-2.5 s"
