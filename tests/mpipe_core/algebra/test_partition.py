"""partition and balanced: exact splits, laws, bad input; transpose backward=auto."""
from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from term_strategies import generators, workloads

from mpipe_core.algebra.combinators.partition import layer_weights, split_min_max
from mpipe_core.algebra.terms import parse
from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError, TermError
from mpipe_core.workloads.workload import parse_workload

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def brute_force_bottleneck(weights, parts):
    """The smallest largest-piece sum over every contiguous split (independent check)."""
    n = len(weights)
    best = None
    for cuts in combinations(range(1, n), parts - 1):
        bounds = (0,) + cuts + (n,)
        worst = max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=9), st.integers(1, 9))
@SETTINGS
def test_split_min_max_equals_brute_force(weights, parts):
    parts = min(parts, len(weights))
    sizes = split_min_max(weights, parts)
    assert len(sizes) == parts and min(sizes) >= 1 and sum(sizes) == len(weights)
    starts = [sum(sizes[:i]) for i in range(parts)]
    worst = max(sum(weights[s:s + k]) for s, k in zip(starts, sizes))
    assert worst == pytest.approx(brute_force_bottleneck(weights, parts), rel=1e-9)


ENCODED = {
    "llm": {"layers": 6, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.0},
    "encoders": [{"name": "vision", "f": 9.0, "b": 3.0, "w": 3.0, "layers": 3, "trainable": False,
                  "activation": 3.0}],
}


def test_balanced_split_of_a_schedule_is_the_brute_force_optimum():
    ev = evaluate("balanced(1f1b(p=3, m=3))", ENCODED)
    pipe = ev.schedule.pipelines[0]
    weights = layer_weights(ev.workload, 3, 3)
    assert weights == [3.0, 3.0, 3.0] + [3.0] * 6  # frozen encoder counts F only
    sizes = [e + k for e, k in zip(pipe.encoder_layers, pipe.layers)]
    starts = [sum(sizes[:i]) for i in range(3)]
    assert max(sum(weights[s:s + k]) for s, k in zip(starts, sizes)) == brute_force_bottleneck(weights, 3) == 9.0
    assert pipe.encoder_layers == (3, 0, 0) and pipe.layers == (0, 3, 3)
    # The encoder runs inside chunk 0's forward: 9 per microbatch, no backward there.
    rows = {(op.kind, op.chunk, op.mb): (s, e) for op, _, s, e in ev.timeline.rows()}
    assert rows[("F", 0, 0)] == (0.0, 9.0)
    assert rows[("BW", 0, 0)][1] - rows[("BW", 0, 0)][0] == 0.0
    assert not ev.schedule.encoders and all(op.module == "llm" for op in ev.schedule.ops())


def test_balanced_beats_fused_when_the_encoder_is_heavy():
    fused = evaluate("1f1b(p=3, m=6)", ENCODED).timeline.makespan
    balanced = evaluate("balanced(1f1b(p=3, m=6))", ENCODED).timeline.makespan
    assert balanced < fused


def test_partition_gives_each_chunk_its_layers():
    ev = evaluate("partition(1f1b(p=2, m=2), [1, 5])", ENCODED)
    rows = {(op.module, op.kind, op.chunk, op.mb): (s, e) for op, _, s, e in ev.timeline.rows()}
    assert rows[("llm", "F", 0, 0)][1] - rows[("llm", "F", 0, 0)][0] == 1.0
    assert rows[("llm", "F", 1, 0)][1] - rows[("llm", "F", 1, 0)][0] == 5.0
    assert ev.term == "partition(1f1b(p=2, m=2), layers=[1, 5])"



def test_partition_sums_measured_per_layer_costs_and_keeps_embedding_and_head_costs():
    # What `mpipe profile` writes: a cost per layer, plus the embedding (chunk 0) and head (last chunk).
    profiled = parse_workload({"llm": {"layers": 4, "layer_costs": {"F": [1, 2, 3, 4], "B": [2, 2, 2, 2],
                                                                       "W": [1, 1, 1, 1]},
                                       "embed": {"F": 0.5}, "head": {"F": 10}}})
    ev = evaluate("partition(1f1b(p=2, m=2), [1, 3])", profiled)
    f = {op.chunk: e - s for op, _, s, e in ev.timeline.rows() if op.kind == "F" and op.mb == 0}
    assert f == {0: 1 + 0.5, 1: 2 + 3 + 4 + 10}

@pytest.mark.parametrize("term, message", [
    ("partition(1f1b(p=2, m=2), [6])",
     "1:27: partition: 1 layer counts for 2 chunks (give one per chunk, in chunk order)"),
    ("partition(1f1b(p=2, m=2), [6, 0])", "1:27: partition: argument 'layers': entry 1 is 0, each must be >= 1"),
    ("partition(1f1b(p=2, m=2), [3, 4])", "1:27: partition: the counts add up to 7 but the LLM has 6 layers"),
    ("1f1b(p=8, m=8)", "the LLM has 6 layers but the schedule needs 8 chunks "
                       "(each chunk needs at least one layer)"),
    ("balanced(zbv(p=8, m=8))", "1:1: balanced: the chain has 9 layers (3 encoder + 6 LLM) but the schedule "
                                "has 16 chunks (each chunk needs at least one layer)"),
    ("transpose(balanced(1f1b(p=2, m=2)))", "1:1: transpose: balanced(...) already folded the encoders into "
                                            "the LLM chunks (transpose the inner term instead, or use partition)"),
])
def test_bad_partitions_say_what_and_where(term, message):
    with pytest.raises(MpipeError) as info:
        evaluate(term, ENCODED)
    assert info.value.message == message


@st.composite
def partitioned(draw):
    inner = draw(generators())
    chunks = evaluate(inner).schedule.pipelines[0].chunks
    cuts = sorted(draw(st.lists(st.integers(1, 31), min_size=chunks - 1, max_size=chunks - 1, unique=True)))
    bounds = [0] + cuts + [32]
    layers = [b - a for a, b in zip(bounds, bounds[1:])]
    wrap = draw(st.sampled_from(["{}", "split_bw({})", "defer_w(split_bw({}))", "repeat({}, 2)", "mirror({})"]))
    if draw(st.booleans()):
        return wrap.format(f"balanced({inner})")
    return wrap.format(f"partition({inner}, {layers})")


@given(partitioned(), workloads())
@SETTINGS
def test_partitioned_terms_are_valid_round_trip_and_respect_the_lower_bound(term, workload):
    try:
        ev = evaluate(term, workload)
    except TermError as error:
        assert "needs at least one layer" in error.message or "needs split B/W" in error.message
        return
    assert str(parse(ev.term)) == ev.term
    assert evaluate(ev.term, workload).timeline.makespan == ev.timeline.makespan
    m = ev.metrics
    assert m.lower_bound <= m.makespan + 1e-9


@given(generators(), workloads())
@SETTINGS
def test_partition_with_the_even_split_evaluates_exactly_like_the_term(inner, workload):
    plain = evaluate(inner, workload)
    even = plain.workload.llm.layers_per_chunk(plain.schedule.pipelines[0].chunks)
    split = evaluate(f"partition({inner}, {even})", workload)
    assert split.timeline.start == plain.timeline.start and split.timeline.end == plain.timeline.end
    assert split.metrics.peak_memory == plain.metrics.peak_memory
    assert split.metrics.lower_bound == plain.metrics.lower_bound


@st.composite
def trainable_workloads(draw):
    doc = draw(workloads(encoders=False))
    doc["encoders"] = [{"name": "vision", "f": draw(st.floats(0.1, 8.0)), "b": draw(st.floats(0.1, 8.0)),
                        "w": draw(st.floats(0.1, 8.0)), "trainable": True,
                        "output_bytes": draw(st.floats(0, 2)), "input_bytes": draw(st.floats(0, 8)),
                        "param_bytes": draw(st.floats(0, 8)), "activation": 1.0}]
    return doc


@given(generators(), trainable_workloads(), st.sampled_from(["", ", shards=2", ", overflow=min"]))
@SETTINGS
def test_backward_auto_is_never_worse_than_either_explicit_mode(inner, workload, options):
    wl = parse_workload(workload)
    auto = evaluate(f"transpose({inner}, mode=dynamic{options})", wl).timeline.makespan
    for mode in ("recompute", "owner"):
        explicit = evaluate(f"transpose({inner}, mode=dynamic, backward={mode}{options})", wl).timeline.makespan
        assert auto <= explicit + 1e-9


FROZEN_TOWER = {"name": "frozen", "llm": {"layers": 4, "f": 1, "b": 1, "w": 1, "activation": 1.0},
                "encoders": [{"name": "vision", "f": 4, "trainable": False, "activation": 10.0, "layers": 4,
                              "output_bytes": 1}]}


def test_a_frozen_tower_holds_one_layers_working_set_only_while_its_forward_runs():
    # The tower runs under no_grad: one of its 4 layers' working set (10 / 4 = 2.5) is live while
    # its forward runs, and nothing is kept for a backward.  Fused, device 0 runs microbatch 1's
    # tower op while holding microbatch 0's 2 LLM layers (2 x 1.0): 2 + 2.5.  Folded by `balanced`
    # (all 4 tower layers and 1 LLM layer on chunk 0), microbatch 1's chunk-0 forward holds its
    # own LLM layer and the tower's working set beside microbatch 0's layer: 1 + 1 + 2.5.  A
    # trained tower keeps its 10 per microbatch until its backward: 2 microbatches in flight, 20.
    fused = evaluate("1f1b(p=2, m=2)", FROZEN_TOWER)
    folded = evaluate("balanced(1f1b(p=2, m=2))", FROZEN_TOWER)
    assert folded.schedule.pipelines[0].encoder_layers == (4, 0)
    assert folded.schedule.pipelines[0].layers == (1, 3)
    assert fused.metrics.peak_memory[0] == folded.metrics.peak_memory[0] == 4.5
    trained = {**FROZEN_TOWER, "encoders": [{**FROZEN_TOWER["encoders"][0], "trainable": True, "b": 4, "w": 4}]}
    assert evaluate("balanced(1f1b(p=2, m=2))", trained).metrics.peak_memory[0] == 20.0
