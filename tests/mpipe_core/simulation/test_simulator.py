"""The simulator and metrics against closed forms and hand-checked cases."""
import pytest

from mpipe_core.api import evaluate
from mpipe_core.errors import ScheduleError
from mpipe_core.ir.ops import BW, LLM, F, Op
from mpipe_core.ir.schedule import single_pipeline
from mpipe_core.simulation.simulator import simulate
from mpipe_core.workloads.workload import load_workload


def wl(f=1.0, b=1.0, w=1.0, layers=None, latency=0.0, **llm):
    return {"llm": {"layers": layers, "f": f, "b": b, "w": w, **llm}, "link": {"latency": latency}}


COSTS = [(1, 1, 1), (1, 2, 1), (2, 3, 0.5), (0.5, 1.5, 1.25)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 4), (8, 32)])
@pytest.mark.parametrize("f, b, w", COSTS)
def test_gpipe_and_1f1b_makespan_is_m_plus_p_minus_1_times_f_plus_b(name, p, m, f, b, w):
    ev = evaluate(f"{name}(p={p}, m={m})", wl(f, b, w))
    assert ev.summary()["makespan"] == pytest.approx((m + p - 1) * (f + b + w))


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 2)])
@pytest.mark.parametrize("f, b, w", COSTS)
def test_interleaved_bubble_is_p_minus_1_times_f_plus_b_over_v(p, m, v, f, b, w):
    # one layer per chunk, so a device's whole share costs v*(f+b+w) per microbatch
    ev = evaluate(f"interleaved(p={p}, m={m}, v={v})", wl(f, b, w))
    per_stage = v * (f + b + w)
    assert ev.summary()["makespan"] == pytest.approx(m * per_stage + (p - 1) * per_stage / v)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 12), (8, 32)])
@pytest.mark.parametrize("f, b, w", [(1, 1, 1), (2, 2, 2), (1.5, 1.5, 1.5)])
def test_zb_h1_bubble_is_p_minus_1_times_f_plus_b_minus_2w(p, m, f, b, w):
    ev = evaluate(f"zb_h1(p={p}, m={m})", wl(f, b, w))
    full_backward = b + w
    assert ev.summary()["makespan"] == pytest.approx(m * (f + b + w) + (p - 1) * (f + full_backward - 2 * w))


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 12), (8, 32)])
def test_defer_w_of_split_1f1b_reaches_zb_h1(p, m):
    derived = evaluate(f"defer_w(split_bw(1f1b(p={p}, m={m})))").summary()["makespan"]
    zb_h1 = evaluate(f"zb_h1(p={p}, m={m})").summary()["makespan"]
    assert derived == zb_h1 == 3 * m + p - 1


def test_torch_simulation_figures_from_the_engineering_notes():
    for term, expected in [("gpipe(p=4, m=8)", 33), ("1f1b(p=4, m=8)", 33), ("interleaved(p=4, m=8)", 57),
                           ("zbv(p=4, m=8)", 51), ("zbv(p=8, m=32)", 199)]:
        assert evaluate(term).summary()["makespan"] == expected, term


def test_metrics_of_1f1b_by_hand():
    s = evaluate("1f1b(p=4, m=8)").summary()
    assert s["busy"] == [24.0] * 4
    assert s["idle"] == [9.0] * 4
    assert s["bubble_ratio"] == pytest.approx(36 / (4 * 33))
    assert s["peak_memory"] == [4.0, 3.0, 2.0, 1.0]  # rank r holds p-r microbatches
    assert s["lower_bound"] == 24.0
    assert s["efficiency"] == pytest.approx(24 / 33)
    assert evaluate("gpipe(p=4, m=8)").summary()["peak_memory"] == [8.0] * 4


def test_latency_and_bandwidth_price_cross_device_dependencies():
    base = evaluate("gpipe(p=2, m=1)", wl()).summary()["makespan"]  # F F BW BW = 1+1+2+2
    assert base == 6
    slow = evaluate("gpipe(p=2, m=1)", wl(latency=0.5, boundary_bytes=10.0) | {"link": {"latency": 0.5, "bandwidth": 20.0}})
    # two crossings (forward activation, backward gradient), each 0.5 + 10/20
    assert slow.summary()["makespan"] == pytest.approx(6 + 2 * 1.0)


def test_chunk_cost_is_layers_times_per_layer_cost_earlier_chunks_take_remainder():
    ev = evaluate("gpipe(p=3, m=1)", wl(layers=8))
    rows = {(r["chunk"], r["kind"]): r["end"] - r["start"] for r in ev.timeline_rows()}
    assert [rows[(c, "F")] for c in range(3)] == [3, 3, 2]
    with pytest.raises(Exception, match="the LLM has 2 layers but the schedule needs 3 chunks"):
        evaluate("gpipe(p=3, m=1)", wl(layers=2))


def test_deadlock_is_reported_as_the_cycle_of_ops():
    orders = [[Op(LLM, BW, 0, 0), Op(LLM, F, 0, 0)], [Op(LLM, F, 1, 0), Op(LLM, BW, 1, 0)]]
    with pytest.raises(ScheduleError) as info:
        simulate(single_pipeline(orders, chunks=2, microbatches=1), load_workload(None))
    message = str(info.value)
    assert message.startswith("deadlock: ")
    assert "device 0: llm:0BW0" in message and "device 1: llm:1F0" in message
    assert {d for d, _ in info.value.cycle} == {0, 1}


def test_missing_and_duplicate_ops_are_named():
    full = evaluate("1f1b(p=2, m=2)").schedule
    orders = [list(o) for o in full.orders]
    orders[1].remove(Op(LLM, BW, 1, 1))
    with pytest.raises(ScheduleError, match=r"chunk 1 microbatch 1 of llm: no B \(or BW\), no W \(or BW\)"):
        simulate(full.with_orders(orders), load_workload(None))
    orders = [list(o) for o in full.orders]
    orders[0].append(Op(LLM, F, 1, 0))
    with pytest.raises(ScheduleError, match=r"op llm:1F0 appears more than once \(devices \[0, 1\]\)"):
        simulate(full.with_orders(orders), load_workload(None))


def test_repeat_runs_steps_back_to_back_after_the_optimizer_barrier():
    one = evaluate("1f1b(p=2, m=4)").summary()["makespan"]
    three = evaluate("repeat(1f1b(p=2, m=4), 3)").summary()
    assert three["makespan"] == 3 * one
    assert three["ops"] == 3 * evaluate("1f1b(p=2, m=4)").summary()["ops"]
