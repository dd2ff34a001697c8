"""`explain_gap` on synthetic 'measured' timelines with a known injected cause."""
import pytest

from mpipe_core.api import evaluate
from mpipe_core.simulation.explain import DISPATCH, ELSEWHERE, START, TRANSFER, explain_gap
from mpipe_core.simulation.simulator import simulate
from mpipe_core.workloads.workload import load_workload

TERM = "transpose(1f1b(p=2, m=4), mode=dynamic)"


def _doc(**over):
    doc = {"llm": {"layers": 2, "f": 1.0, "b": 1.0, "w": 1.0},
           "encoders": [{"name": "vision", "f": [3.0, 3.0, 3.0, 3.0], "b": 0.0, "w": 0.0, "trainable": False}],
           "link": {"latency": 0.1, "bandwidth": None}}
    doc.update(over)
    return doc


def _explain(measured_doc, predicted_doc=None, shift=0.0, overhead=0.0):
    ev = evaluate(TERM, predicted_doc or _doc())
    wl = load_workload(predicted_doc or _doc())
    measured = simulate(ev.schedule, load_workload(measured_doc))
    rows = {op: (s + shift, e + shift) for op, _, s, e in measured.rows()}
    return ev, explain_gap(ev.schedule, wl, rows, ev.timeline, overhead=overhead)


def _by(ex):
    return {c.cause: c for c in ex.causes}


def test_parts_add_up_to_the_gap_and_nothing_is_blamed_when_it_matches():
    ev, ex = _explain(_doc(), shift=5.0)
    assert ex.measured == pytest.approx(ev.timeline.makespan)
    assert ex.gap == pytest.approx(0.0, abs=1e-9)
    assert all(c.gap == pytest.approx(0.0, abs=1e-9) for c in ex.causes)


def test_a_slowed_encoder_op_is_blamed_on_that_op():
    ev, ex = _explain(_doc(), shift=0.0)
    slow_mb = next(op.mb for op, d, s, e in ev.timeline.rows() if op.module == "vision" and d == 1)
    slowed = _doc()
    slowed["encoders"][0]["f"] = [3.0 + (2.0 if m == slow_mb else 0.0) for m in range(4)]
    _, ex = _explain(slowed)
    causes = _by(ex)
    assert ex.gap > 0.5
    assert sum(c.gap for c in ex.causes) == pytest.approx(ex.gap)
    # the slowed op's 2.0 shows on its group; what the path gained elsewhere is the slack
    assert causes["op:vision F on device 1"].gap == pytest.approx(2.0)
    assert causes[TRANSFER].gap == pytest.approx(0.0, abs=1e-9)
    assert causes[ELSEWHERE].gap == pytest.approx(ex.gap - 2.0)


def test_a_delayed_transfer_is_blamed_on_transfers():
    _, ex = _explain(_doc(link={"latency": 0.6, "bandwidth": None}))
    causes = _by(ex)
    assert ex.gap > 0.4
    hops = causes[TRANSFER].ops
    assert hops >= 1
    assert causes[TRANSFER].gap == pytest.approx(0.5 * hops)
    assert all(c.gap == pytest.approx(0.0, abs=1e-9) for c in ex.causes if c.cause.startswith("op:"))
    assert sum(c.gap for c in ex.causes) == pytest.approx(ex.gap)


def test_dispatch_beyond_the_fitted_overhead_and_contention_are_named():
    # Prediction on a contended host with a 0.05 per-op overhead folded into its costs;
    # the measured ops are the same but each waits 0.05 more before starting.
    host = {"devices": None, "contention": 0.5}
    wl_doc = _doc(host=host)
    ev = evaluate(TERM, wl_doc)
    rows = {}
    for d, order in enumerate(ev.schedule.orders):
        lag = 0.0
        for op in order:
            s, e = next((s, e) for o, _, s, e in ev.timeline.rows() if o == op)
            lag += 0.05
            rows[op] = (s + lag, e + lag)
    ex = explain_gap(ev.schedule, load_workload(wl_doc), rows, ev.timeline, overhead=0.01)
    causes = _by(ex)
    assert sum(c.gap for c in ex.causes) == pytest.approx(ex.gap)
    # The path's 12 ops are linked by 11 waits: 4 for transfers, 7 after the device's own previous op,
    # each 0.05 longer than predicted (where the prediction waited 0).  Of the prediction, 0.01 of every
    # op on the path is the fitted overhead: dispatch, not op time.
    assert ex.path == 12 and causes[TRANSFER].ops == 4
    assert causes[DISPATCH].measured == pytest.approx(7 * 0.05)
    assert causes[DISPATCH].predicted == pytest.approx(12 * 0.01)
    assert causes[DISPATCH].gap == pytest.approx(0.35 - 0.12)
    # vision F on device 0 (mb 0 and 2): 4.5 each, 1.5 of it contention, less the overhead
    assert causes["op:vision F on device 0"].predicted == pytest.approx(2 * (4.5 - 0.01))
    assert causes["op:vision F on device 0"].contention == pytest.approx(2 * 1.5)
    assert sum(c.contention for c in ex.causes) > 0  # the prediction's modelled slowdown is reported
    assert START in causes
