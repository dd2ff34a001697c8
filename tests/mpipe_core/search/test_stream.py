"""`eval --batches`: each batch's peak memory (the worst device) beside its makespan."""
import json

from mpipe_core.api import evaluate
from mpipe_core.search.stream import evaluate_stream
from mpipe_core.simulation.metrics import peak_fits
from mpipe_core.workloads.batch_costs import drawn_batches, microbatch_workload
from mpipe_core.workloads.workload import parse_workload
from mpipe_cli.main import main

# Samples of 1 tile (10 tokens) plus 10 or 90 text tokens: a pack of R = 100 tokens holds one
# long sample or several short ones; the LLM keeps 1.0 a layer at R tokens, on 2 GB devices.
DOC = {"llm": {"layers": 2, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.0, "boundary_bytes": 10.0},
       "link": {"latency": 0.5, "bandwidth": 10.0}, "units": {"time": "ms", "memory": "GB"},
       "device": {"memory": 2.0},
       "data": {"samples": {"images": 1, "tiles": 1, "text_tokens": {"weights": [1, 1], "from": 0}},
                "tokens": {"per_tile": 10}, "packing": {"max_tiles": 8, "max_tokens": 100, "buffer": 1}}}


def _doc(tmp_path, doc=DOC):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_each_batch_s_peak_memory_is_its_plan_s_worst_device_on_its_own_costs():
    wl = parse_workload(DOC)
    result = evaluate_stream("1f1b(p=2, m=2)", wl, 4)
    static = evaluate("1f1b(p=2, m=2)", wl).schedule
    for b, drawn in zip(result.batches, drawn_batches(wl, 2, 4)):
        costs = microbatch_workload(wl, drawn.of(0))
        tl = evaluate("1f1b(p=2, m=2)", costs).timeline
        assert b.peak_memory == peak_fits(static, costs, tl)[0]
    peaks = [b.peak_memory for b in result.batches]
    assert len(set(peaks)) > 1  # packs of other tokens hold other activations
    assert result.summary()["peak_memory_max"] == max(peaks)


def test_json_gains_peak_memory_per_batch_and_its_max_and_the_text_flags_a_batch_over(tmp_path, capsys):
    doc = {**DOC, "device": {"memory": 1.6}}
    assert main(["eval", "1f1b(p=2, m=2)", "-w", _doc(tmp_path, doc), "--batches", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    first = out["batches"][0]
    assert list(first) == ["batch", "makespan", "step_time_s", "tokens", "tiles", "peak_memory"]
    peaks = [b["peak_memory"] for b in out["batches"]]
    assert out["summary"]["peak_memory_max"] == max(peaks)
    over = [b["batch"] for b in out["batches"] if b["peak_memory"] > 1.6]
    assert over and out["summary"]["over_capacity"] == over
    assert (out["capacity"], out["memory_unit"]) == (1.6, "GB")
    assert main(["eval", "1f1b(p=2, m=2)", "-w", _doc(tmp_path, doc), "--batches", "4"]) == 0
    text = capsys.readouterr().out
    assert "peak mem" in text.splitlines()[3]
    flagged = [line for line in text.splitlines() if line.startswith("over memory:")]
    assert [int(line.split()[3]) for line in flagged] == over
    b = out["batches"][over[0]]
    assert flagged[0] == (f"over memory: batch {over[0]} peaks at {b['peak_memory']:g} GB on its worst device, "
                          f"{b['peak_memory'] - 1.6:.3g} GB over the device's 1.6 GB")


def test_without_a_capacity_nothing_is_flagged(tmp_path, capsys):
    doc = {k: v for k, v in DOC.items() if k != "device"}
    assert main(["eval", "1f1b(p=2, m=2)", "-w", _doc(tmp_path, doc), "--batches", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["capacity"] is None and "over_capacity" not in out["summary"]
    assert main(["eval", "1f1b(p=2, m=2)", "-w", _doc(tmp_path, doc), "--batches", "2"]) == 0
    assert "over memory" not in capsys.readouterr().out
