"""The simulator's numpy fast path gives exactly the general simulator's timeline."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mpipe_core.llm_fast_path as fast_path
from mpipe_core.api import evaluate
from mpipe_core.errors import ScheduleError
from mpipe_core.ops import Op
from mpipe_core.simulator import simulate

from test_laws import generators, workloads

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(generators(), workloads(encoders=False), st.sampled_from(["{}", "split_bw({})", "defer_w(split_bw({}))"]))
@SETTINGS
def test_fast_path_equals_the_general_simulator(inner, workload, wrap):
    ev = evaluate(wrap.format(inner), workload)
    assert fast_path.simulate_llm_pipeline(ev.schedule, ev.workload) is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast_path, "simulate_llm_pipeline", lambda s, w: None)
        slow = simulate(ev.schedule, ev.workload)
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
