"""The simulator's numpy fast path gives exactly the general simulator's timeline."""
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from term_strategies import generators, placed_terms, workloads

import mpipe_core.simulation.llm_fast_path as fast_path
import mpipe_core.simulation.simulator as simulator
import mpipe_core.simulation.step_fast_path as step_fast_path
from mpipe_core.api import evaluate
from mpipe_core.errors import ScheduleError
from mpipe_core.ir.ops import Op
from mpipe_core.simulation.simulator import simulate

# Recompute terms take the fast path too (longer backwards, smaller activations).
WRAPS = ["{}", "split_bw({})", "defer_w(split_bw({}))", "recompute({})", "recompute(split_bw({}), chunks=[0])",
         "recompute({}, mode=selective)"]
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(generators(), workloads(encoders=False), st.sampled_from(WRAPS))
@SETTINGS
def test_fast_path_equals_the_general_simulator(inner, workload, wrap):
    ev = evaluate(wrap.format(inner), workload)
    assert fast_path.simulate_llm_pipeline(ev.schedule, ev.workload) is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast_path, "simulate_llm_pipeline", lambda s, w: None)
        slow = simulate(ev.schedule, ev.workload)
    assert (ev.timeline.ops, ev.timeline.device) == (slow.ops, slow.device)
    assert ev.timeline.start == slow.start and ev.timeline.end == slow.end


@given(placed_terms(), workloads(always=True, dispatch=True))
@SETTINGS
def test_fast_path_with_encoder_ops_equals_the_general_simulator(term, workload):
    ev = evaluate(term, workload)
    one_step = ev.schedule.pipelines[0].steps == 1
    assert (step_fast_path.simulate_step_with_encoders(ev.schedule, ev.workload, ev.schedule.placement())
            is not None) == one_step
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_fast_path, "simulate_step_with_encoders", lambda s, w, i: None)
        patch.setattr(simulator, "_RECENT", type(simulator._RECENT)())  # simulate it again, not remembered
        slow = simulate(ev.schedule, ev.workload)
    assert slow is not ev.timeline
    assert (ev.timeline.ops, ev.timeline.device) == (slow.ops, slow.device)
    assert ev.timeline.start == slow.start and ev.timeline.end == slow.end


def test_schedules_the_fast_path_refuses_get_the_general_errors():
    ev = evaluate("1f1b(p=2, m=2)")
    orders = [list(o) for o in ev.schedule.orders]
    orders[0] = orders[0][::-1]  # backward before forward on device 0: a deadlock
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(ev.schedule.with_orders(orders), ev.workload)
    orders = [list(o) for o in ev.schedule.orders]
    orders[1].append(Op("llm", "F", 1, 0))
    with pytest.raises(ScheduleError, match="appears more than once"):
        simulate(ev.schedule.with_orders(orders), ev.workload)


def test_shared_hosts_take_the_processor_sharing_path():
    doc = {"llm": {"layers": 4}, "host": {"contention": 0.5}}
    ev = evaluate("1f1b(p=2, m=4)", doc)
    assert fast_path.simulate_llm_pipeline(ev.schedule, ev.workload) is None
    assert ev.timeline.makespan > evaluate("1f1b(p=2, m=4)", {"llm": {"layers": 4}}).timeline.makespan


@given(generators(), workloads(encoders=False), st.sampled_from(WRAPS))
@SETTINGS
def test_memory_from_the_fast_path_columns_equals_the_general_grouping(inner, workload, wrap):
    from dataclasses import replace

    from mpipe_core.simulation.metrics import memory_over_time, peak_memory

    ev = evaluate(wrap.format(inner), workload)
    assert "llm_key" in ev.timeline.columns
    general = replace(ev.timeline, columns=None)  # rebuilt from the op tuples, grouped by np.unique
    assert peak_memory(ev.schedule, ev.workload, ev.timeline) == peak_memory(ev.schedule, ev.workload, general)
    assert memory_over_time(ev.schedule, ev.workload, ev.timeline) == \
        memory_over_time(ev.schedule, ev.workload, general)


@pytest.mark.parametrize("p, m", [(1, 1), (2, 2), (3, 8), (4, 5), (5, 16)])
def test_zbv_hands_over_columns_that_are_its_ops(p, m):
    from mpipe_core.algebra.generators.v_shape import zbv
    from mpipe_core.ir.ops import COMPUTE_KINDS

    schedule = zbv(p, m)
    columns = schedule.llm_columns
    rows = zip(columns.kind.tolist(), columns.chunk.tolist(), columns.mb.tolist())
    assert [Op("llm", COMPUTE_KINDS[k], c, mb) for k, c, mb in rows] == list(schedule.ops())


def test_new_orders_drop_the_columns_and_a_partition_keeps_them():
    ev = evaluate("zbv(p=2, m=4)")
    assert ev.schedule.llm_columns is not None
    assert ev.schedule.with_orders(ev.schedule.orders[::-1]).llm_columns is None
    assert evaluate("partition(zbv(p=2, m=4), [1, 2, 3, 2])", {"llm": {"layers": 8}}).schedule.llm_columns \
        is not None
    assert evaluate("split_bw(zbv(p=2, m=4))").schedule.llm_columns is None


@given(placed_terms(), workloads(always=True, dispatch=True), workloads(always=True, dispatch=True))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_one_schedule_on_another_workload_is_priced_again(term, workload, other):
    """The fast path keeps what it reads from a schedule (per schedule object);
    simulating the same schedule on other costs must give that workload's own
    timeline, as a fresh simulation of it does."""
    ev = evaluate(term, workload)
    other = evaluate(term, other).workload
    assume([e.name for e in other.encoders] == [e.name for e in ev.workload.encoders])
    again = simulate(ev.schedule, other, check=False, remember=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_fast_path, "_SHAPES", type(step_fast_path._SHAPES)())
        patch.setattr(simulator, "_PLACEMENTS", type(simulator._PLACEMENTS)())
        fresh = simulate(ev.schedule, other, check=False, remember=False)
    assert again.start == fresh.start and again.end == fresh.end
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_fast_path, "simulate_step_with_encoders", lambda s, w, i: None)
        slow = simulate(ev.schedule, other, check=False, remember=False)
    assert again.start == slow.start and again.end == slow.end
