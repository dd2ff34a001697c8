"""The memory benchmark's rule on one case, fast (ranks as threads): a profiled
workload predicts each rank's peak activation memory within 10% of what the
run measures, and its static memory exactly."""
from benchmarks.memory_bench import print_table, profiled_workload, rows_for
from executor.analysis.memory_check import TOLERANCE
from executor.runtime.rank import run_local

TERMS = ["recompute(zbv(p=2, m=4), layers=[1, 0, 1, 0])", "transpose(1f1b(p=2, m=4), mode=prefix)"]


def test_a_profiled_workload_predicts_the_measured_memory(capsys):
    doc = profiled_workload("tiny", warmup=0, repeats=1)
    assert doc["units"] == {"time": "s", "memory": "bytes"}
    rows = rows_for("tiny", doc, TERMS, lambda jobs: run_local(jobs, 2), steps=1)
    assert [r.rank for r in rows] == [0, 1, 0, 1]
    assert all(r.grads_ok for r in rows)
    assert all(abs(r.ratio - 1) <= TOLERANCE for r in rows), [(r.term, r.rank, r.ratio) for r in rows]
    assert all(r.predicted_static == r.measured_static for r in rows)
    assert print_table(rows, TOLERANCE)
    assert "target: every row within 10%: met" in capsys.readouterr().out
