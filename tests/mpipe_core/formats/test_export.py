"""Interop: torch pipelining CSV both ways, Chrome traces, and the CLI contract."""
import json
import subprocess
import sys

import pytest

from benchmarks.torch_construction import construct
from mpipe_cli.main import main
from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.formats.chrome_trace import chrome_trace
from mpipe_core.formats.torch_csv import from_torch_csv, to_torch_csv


@pytest.mark.parametrize("name, term", [("zbv", "zbv(p=2, m=4)"), ("interleaved", "interleaved(p=2, m=4)"),
                                        ("zbv", "zbv(p=4, m=8)")])
def test_torch_loads_our_csv_and_gets_the_same_order(tmp_path, name, term):
    schedule = evaluate(term).schedule
    text, notes = to_torch_csv(schedule)
    assert notes == []
    path = tmp_path / "schedule.csv"
    path.write_text(text)
    p = schedule.devices
    torch_schedule = construct(name, p, schedule.pipelines[0].microbatches)
    expected = {rank: [str(a) for a in torch_schedule.pipeline_order[rank] if a is not None] for rank in range(p)}
    torch_schedule._load_csv(str(path))  # torch's own loader validates it
    loaded = {rank: [str(a) for a in torch_schedule.pipeline_order[rank] if a is not None] for rank in range(p)}
    assert loaded == expected
    # and back: the imported schedule is ours again
    assert from_torch_csv(text).orders == schedule.orders


def test_csv_refuses_what_torch_cannot_express():
    with pytest.raises(MpipeError, match="torch-csv cannot express vision:0F1 on device 1"):
        to_torch_csv(evaluate("transpose(1f1b(p=2, m=2))", "vit-heavy-small").schedule)
    text, notes = to_torch_csv(evaluate("1f1b(p=2, m=2)", "vit-heavy-small").schedule)
    assert notes == ["2 encoder ops fused into stage 0 are part of stage 0's module in torch; not listed"]
    with pytest.raises(MpipeError, match=r"bad.csv:1:2: '0SEND_F0' is not a compute action"):
        from_torch_csv("0F0,0SEND_F0\n", source="bad.csv")


def test_chrome_trace_has_real_durations():
    ev = evaluate("1f1b(p=2, m=2)")
    trace = chrome_trace(ev.timeline_rows(), 2)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == ev.schedule.num_ops
    assert max(e["ts"] + e["dur"] for e in spans) == ev.summary()["makespan"] * 1000
    assert {e["dur"] for e in spans} == {1000.0, 2000.0}  # F=1, BW=2 time units


def test_eval_json_contract(capsys):
    assert main(["eval", "1f1b(p=2, m=2)", "--json", "--timeline"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("term", "devices", "ops", "makespan", "bubble_ratio", "lower_bound", "efficiency",
                "busy", "idle", "peak_memory", "timeline"):
        assert key in doc
    assert doc["makespan"] == 9.0 and doc["devices"] == 2 and doc["ops"] == 8
    row = doc["timeline"][0]
    assert set(row) >= {"device", "module", "kind", "chunk", "microbatch", "start", "end"}


def test_import_csv_command(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_text(to_torch_csv(evaluate("zbv(p=2, m=4)").schedule)[0])
    assert main(["import-csv", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == evaluate("zbv(p=2, m=4)").summary()["makespan"]


def test_user_errors_exit_2_with_one_line_and_no_traceback(tmp_path):
    broken = tmp_path / "w.json"
    broken.write_text('{"llm": {"layers": 8,}}')
    cases = [
        (["eval", "1f1b(p=4, m=8"], "error: 1:14: expected ')' or ',', got end of input\n"),
        (["eval", "1f1b(p=2, m=2)", "-w", str(broken)],
         f"error: {broken}:1:22: not valid json: Expecting property name enclosed in double quotes\n"),
        (["eval", "1f1b(p=2, m=2)", "-w", "llava7b"], "error: workload 'llava7b': no such file or preset; did you mean preset 'llava-7b'?\n"),
        (["import-csv", str(tmp_path / "missing.csv")], f"error: {tmp_path / 'missing.csv'}: no such file\n"),
    ]
    for argv, stderr in cases:
        done = subprocess.run([sys.executable, "-m", "mpipe_cli.main", *argv], capture_output=True, text=True)
        assert done.returncode == 2, argv
        assert done.stderr == stderr
        assert "Traceback" not in done.stderr
