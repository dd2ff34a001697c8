"""Plans: every generator's schedule gets a deadlock-free protocol; what cannot
run is refused before launch with a message naming the problem."""
import pytest
from executor_matrix import TRAIN, TRANSPOSE_TERMS

from executor.errors import ExecutorError
from executor.runtime.model_workload import workload_for
from executor.runtime.plan import build_plan
from mpipe_core.algebra.generators import GENERATORS
from mpipe_core.api import evaluate
from mpipe_core.ir.ops import BW, LLM, F, Op
from mpipe_core.ir.schedule import single_pipeline


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 8), (4, 16)])
def test_every_generator_plans(name, p, m):
    plan = build_plan(GENERATORS[name](p=p, m=m))
    assert plan.devices == p
    # Channel order is the receiver's consumption order.
    for (src, dst), edges in plan.channel_edges.items():
        pos = {pl.op: pl.index for pl in plan.ranks[dst].ops}
        assert [pos[e.consumer] for e in edges] == sorted(pos[e.consumer] for e in edges)


@pytest.mark.parametrize("kind,term", TRANSPOSE_TERMS + [("train", "encoder_stage(1f1b(p={p}, m={m}))")])
def test_encoder_schedules_plan(kind, term):
    ev = evaluate(term.format(p=4, m=8), workload_for(TRAIN))
    plan = build_plan(ev.schedule)
    assert plan.encoder == "vision" and plan.trainable


def test_a_cycle_is_refused_naming_the_stuck_ops():
    # Device 1 wants F(1,0)'s backward before device 0 has run F(0,1)... make a real cycle:
    # device 0 runs BW(0,0) before F(0,0) is sent on.
    orders = [[Op(LLM, BW, 0, 0), Op(LLM, F, 0, 0)], [Op(LLM, F, 1, 0), Op(LLM, BW, 1, 0)]]
    with pytest.raises(ExecutorError, match="would deadlock: device 0 at llm:0BW0"):
        build_plan(single_pipeline(orders, chunks=2, microbatches=1))


def test_a_chunk_split_across_devices_is_refused():
    orders = [[Op(LLM, F, 0, 0), Op(LLM, F, 1, 0), Op(LLM, BW, 1, 0)], [Op(LLM, BW, 0, 0)]]
    with pytest.raises(ExecutorError, match="chunk 0 has ops on devices 0 and 1"):
        build_plan(single_pipeline(orders, chunks=2, microbatches=1))


def test_replicas_and_steps_are_refused_clearly():
    ev = evaluate("overlay(1f1b(p=2, m=2), mirror(1f1b(p=2, m=2)))")
    with pytest.raises(ExecutorError, match="one pipeline"):
        build_plan(ev.schedule)
    ev = evaluate("repeat(1f1b(p=2, m=2), n=2)")
    with pytest.raises(ExecutorError, match="--steps"):
        build_plan(ev.schedule)


def test_missing_backward_is_refused():
    orders = [[Op(LLM, F, 0, 0)], [Op(LLM, F, 1, 0), Op(LLM, BW, 1, 0)]]
    with pytest.raises(ExecutorError, match="chunk 0 microbatch 0 has ops"):
        build_plan(single_pipeline(orders, chunks=2, microbatches=1))
