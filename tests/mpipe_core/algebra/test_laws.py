"""Laws of the algebra as properties over random terms and random explicit-cost workloads."""
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from term_strategies import generators, placed_terms, terms, workloads

from mpipe_core.api import evaluate
from mpipe_core.errors import TermError
from mpipe_core.ir.ops import BW, B, W

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def evaluate_or_skip(term, workload):
    try:
        return evaluate(term, workload)
    except TermError as error:
        # encoder_stage/transpose on an LLM-only workload etc. are refused by design
        assume("needs a workload with encoders" not in error.message)
        raise


@SETTINGS
@given(terms(), workloads())
def test_every_combinator_preserves_validity(term, workload):
    ev = evaluate_or_skip(term, workload)  # simulate() raises on any invalid schedule
    s = ev.summary()
    # Checked here from the timeline itself, not taken from the summary: every op once,
    # no device runs two ops at a time, and the makespan is the last end.
    rows = list(ev.timeline.rows())
    assert len({op for op, *_ in rows}) == len(rows) == s["ops"]
    for device in range(s["devices"]):
        spans = sorted((start, end) for _, d, start, end in rows if d == device)
        assert all(end >= start for start, end in spans)
        assert all(later[0] >= earlier[1] - 1e-9 for earlier, later in zip(spans, spans[1:]))
    assert s["makespan"] == pytest.approx(max(end for *_, end in rows)) and s["makespan"] > 0
    assert s["lower_bound"] <= s["makespan"] + 1e-9


@SETTINGS
@given(placed_terms(), workloads(always=True, dispatch=True))
def test_every_encoder_placement_is_valid_and_bounded(term, workload):
    ev = evaluate(term, workload)
    rows = list(ev.timeline.rows())
    assert len({op for op, *_ in rows}) == len(rows) == ev.schedule.num_ops
    for device in range(ev.schedule.devices):
        spans = sorted((start, end) for _, d, start, end in rows if d == device)
        assert all(later[0] >= earlier[1] - 1e-9 for earlier, later in zip(spans, spans[1:]))
    assert 0 < ev.metrics.lower_bound <= ev.timeline.makespan + 1e-9
    assert ev.metrics.devices == ev.schedule.devices == len(ev.metrics.peak_memory)
    # The LLM's order is the input's (built with the same groups: defer_w
    # orders around the encoder ops): every strategy only layers encoder ops around it.
    inner = ev.ast
    while inner.name in ("encoder_batch", "colocated", "disaggregate", "transpose", "encoder_stage"):
        inner = inner.kw("term")
    if ev.ast.name == "encoder_batch":
        inner = f"encoder_batch({inner}, {ev.ast.kw('k')})"
    body = evaluate(inner, workload).schedule.llm_only().orders
    placed = [order for order in ev.schedule.llm_only().orders if order]
    assert placed == [order for order in body if order]


def _work_multiset(schedule):
    """Each fused BW counted as its B and W parts."""
    counts = Counter()
    for op in schedule.ops():
        if op.kind == BW:
            counts[op._replace(kind=B)] += 1
            counts[op._replace(kind=W)] += 1
        else:
            counts[op] += 1
    return counts


@SETTINGS
@given(terms(), workloads())
def test_split_bw_keeps_the_op_multiset(term, workload):
    before = evaluate_or_skip(term, workload).schedule
    after = evaluate_or_skip(f"split_bw({term})", workload).schedule
    assert not any(op.kind == BW for op in after.ops())
    assert _work_multiset(after) == _work_multiset(before)


@SETTINGS
@given(generators(), generators(), workloads(encoders=False))
def test_par_is_commutative_up_to_device_renumbering(a, b, workload):
    ab = evaluate(f"par({a}, {b})", workload).summary()
    ba = evaluate(f"par({b}, {a})", workload).summary()
    assert ab["makespan"] == ba["makespan"]
    assert sorted(ab["busy"]) == sorted(ba["busy"])
    assert sorted(ab["peak_memory"]) == sorted(ba["peak_memory"])


@SETTINGS
@given(generators(), workloads(), st.sampled_from(["", ", backward=owner", ", shards=2", ", overflow=min"]))
def test_dynamic_transpose_never_worse_than_its_input_or_prefix(inner, workload, options):
    assume("encoders" in workload)
    base = evaluate(inner, workload)
    dynamic = evaluate(f"transpose({inner}, mode=dynamic{options})", workload)
    prefix_options = options.replace(", shards=2", "")
    prefix = evaluate(f"transpose({inner}{prefix_options})", workload)
    assert dynamic.summary()["makespan"] <= base.summary()["makespan"] + 1e-9
    assert dynamic.summary()["makespan"] <= prefix.summary()["makespan"] + 1e-9
    # the body is untouched
    assert dynamic.schedule.llm_only().orders == base.schedule.llm_only().orders
    assert prefix.schedule.llm_only().orders == base.schedule.llm_only().orders


@SETTINGS
@given(generators(), workloads(encoders=False))
def test_overlay_with_mirror_is_a_valid_bidirectional_schedule(inner, workload):
    ev = evaluate(f"overlay({inner}, mirror({inner}))", workload)
    modules = {op.module for op in ev.schedule.ops()}
    assert modules == {"llm", "llm@1"}
    p = ev.schedule.devices
    if p > 1:
        first = {op.chunk: d for d, o in enumerate(ev.schedule.orders) for op in o if op.module == "llm" and op.kind == "F"}
        mirrored = {op.chunk: d for d, o in enumerate(ev.schedule.orders) for op in o if op.module == "llm@1" and op.kind == "F"}
        assert all(mirrored[c] == p - 1 - first[c] for c in first)


@SETTINGS
@given(terms(), workloads(), st.sampled_from(["", ", chunks=[0]"]))
def test_full_recompute_never_raises_peak_activation_memory_nor_shortens_the_makespan(term, workload, chunks):
    base = evaluate_or_skip(term, workload)
    again = evaluate_or_skip(f"recompute({term}{chunks})", workload)
    assert again.schedule.orders == base.schedule.orders  # the same ops in the same order
    assert again.summary()["makespan"] >= base.summary()["makespan"] - 1e-9
    for before, after in zip(base.metrics.peak_activation_memory, again.metrics.peak_activation_memory):
        assert after <= before + 1e-9
    assert again.metrics.static_memory == base.metrics.static_memory
    # the lower bound counts essential work only: a recompute adds none
    assert again.summary()["lower_bound"] == pytest.approx(base.summary()["lower_bound"], rel=1e-12)
