"""One evaluation per (canonical term, workload), and the one timeline record."""
from mpipe_core.api import evaluate, evaluate_once
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.workloads.presets import preset_document


def test_one_evaluation_per_canonical_term_and_workload():
    a = evaluate_once("1f1b(p=2, m=4)", "vit-heavy-small")
    assert evaluate_once("1f1b(p=2,m=4)", "vit-heavy-small") is a  # another spelling, same term
    assert evaluate_once("1f1b(p=2, m=4)", preset_document("vit-heavy-small")) is a  # same costs
    slower = preset_document("vit-heavy-small")
    slower["llm"]["f"] = 2.0  # same name, other costs: not the same evaluation
    b = evaluate_once("1f1b(p=2, m=4)", slower)
    assert b is not a and b.summary()["makespan"] > a.summary()["makespan"]
    assert a.summary() == evaluate("1f1b(p=2, m=4)", "vit-heavy-small").summary()


def test_simulated_records_are_the_timeline_rows():
    ev = evaluate("transpose(1f1b(p=2, m=4), mode=dynamic)", "vit-heavy-small")
    records = ev.timeline.records()
    assert [r.as_dict() for r in records] == ev.timeline_rows()
    assert all(r.host == "" and "host" not in r.as_dict() for r in records)
    assert [TimelineRecord.from_dict(r.as_dict()) for r in records] == records
    measured = records[0]._replace(host="node1/cuda:0")
    assert TimelineRecord.from_dict(measured.as_dict()) == measured
