"""colocated(...), encoder_batch(...) and disaggregate(...) executed, ranks as
threads: loss and gradients equal the unpipelined model's (built-in MLLM with a
varying image count, HF tiny LLaVA; trainable and frozen encoders), and the
measured timelines show what each layout promises: colocated's phases are
barriers, a group's encoder runs once, disaggregate's encoder rank runs only
the encoder.  The torchrun launch is in test_layouts_torchrun.py."""
from __future__ import annotations

import pytest
from executor_matrix import TRAIN, job
from layouts_matrix import CASES, COLOCATED, DISAGGREGATED, GROUPED, RANKS, figures, layout_job

from executor.runtime.encoder_rows import EncoderRows
from executor.runtime.jobs import schedule_from_dict
from executor.runtime.model_workload import workload_for
from executor.runtime.plan import FEAT, TOKEN, build_plan
from executor.runtime.rank import run_local
from mpipe_core.api import evaluate
from mpipe_core.ir.ops import Op, format_op


@pytest.fixture(scope="module")
def results():
    jobs = {case: layout_job(*case) for case in CASES}
    out = {}
    for ranks in sorted(set(RANKS.values())):
        mine = [case for case in CASES if RANKS[case[0]] == ranks]
        for case, result in zip(mine, run_local([jobs[c] for c in mine], ranks)):
            assert result.name == jobs[case].name
            out[case] = (jobs[case], result)
    print()
    for case in CASES:
        print(figures(out[case][1]))
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{m}|{'frozen' if f else 'trainable'}|{t}" for t, m, f in CASES])
def test_loss_and_gradients_equal_the_unpipelined_model(results, case):
    j, result = results[case]
    check = result.grad_check
    assert check["ok"], check["steps"][0]["failures"][:5]
    assert result.devices == RANKS[case[0]]
    # Every op of the schedule was run and timed, under the identity the simulator gives it.
    schedule = schedule_from_dict(j.schedule)
    ran = sorted((r.device, format_op(Op(r.module, r.kind, r.chunk, r.microbatch, r.step))) for r in result.timeline)
    assert ran == sorted((d, format_op(op)) for d, order in enumerate(schedule.orders) for op in order)


def _rows(result, device=None, module=None, kinds=None):
    return [r for r in result.timeline if (device is None or r.device == device)
            and (module is None or r.module == module) and (kinds is None or r.kind in kinds)]


@pytest.mark.parametrize("model", ["builtin", "hf:llava"])
def test_colocated_phases_are_barriers(results, model):
    _, train = results[(COLOCATED, model, False)]
    # Phase 1 -> 2: the first stage starts no LLM op before every share's features have arrived.
    first_llm = min(r.start for r in _rows(train, device=0, module="llm"))
    assert first_llm >= max(r.end for r in _rows(train, module="vision", kinds={"F"}))
    # Phase 2 -> 3: no device starts its encoder backward before the first stage's last input
    # gradient (device 1's own microbatches' gradients were ready earlier than that).
    last_chunk0 = max(r.end for r in _rows(train, device=0, module="llm", kinds={"B", "BW"}))
    for d in (0, 1):
        assert min(r.start for r in _rows(train, device=d, module="vision", kinds={"B", "BW"})) >= last_chunk0
        assert {r.kind for r in _rows(train, device=d, module="vision")} == {"F", "GATHER", "SCATTER", "BW", "AR"}
    _, frozen = results[(COLOCATED, model, True)]
    assert {r.kind for r in _rows(frozen, module="vision")} == {"F", "GATHER"}
    assert min(r.start for r in _rows(frozen, device=0, module="llm")) >= max(
        r.end for r in _rows(frozen, module="vision", kinds={"F"}))


def test_colocated_plan_gathers_on_the_first_stage_and_releases_the_others():
    plan = build_plan(evaluate("colocated(1f1b(p=3, m=6))", workload_for(TRAIN)).schedule)
    by_op = {format_op(p.op): p for r in plan.ranks for p in r.ops}
    gather = by_op["vision:0GATHER"]
    assert sorted(str(e) for e in gather.recvs) == [
        f"vision:0F{m}->llm:0F{m}(feat, {m // 2}->0)" for m in range(2, 6)]
    assert sorted(str(e) for e in gather.sends_after) == [
        "vision:0GATHER->vision:1GATHER(token, 0->1)", "vision:0GATHER->vision:2GATHER(token, 0->2)"]
    for d in (1, 2):
        assert [e.what for e in by_op[f"vision:{d}GATHER"].recvs] == [TOKEN]
        assert [e.what for e in by_op[f"vision:{d}SCATTER"].recvs] == [TOKEN]
    # The first stage's forwards read the gathered features; nothing is sent twice.
    assert not by_op["llm:0F2"].recvs and [e.what for e in by_op["llm:0F2"].inputs] == [FEAT]
    assert plan.ar_group == (0, 1, 2)


@pytest.mark.parametrize("model", ["builtin", "hf:llava"])
@pytest.mark.parametrize("frozen", [False, True], ids=["trainable", "frozen"])
def test_a_group_runs_its_encoder_once(results, model, frozen):
    _, result = results[(GROUPED, model, frozen)]
    forwards = sorted((r.device, r.microbatch) for r in _rows(result, module="vision", kinds={"F"}))
    assert forwards == [(0, 0), (1, 2)]  # groups {0, 1} and {2, 3}, one per device (prefix)
    if not frozen:  # one backward per group; the second group's recomputed on the first stage
        assert sorted((r.kind, r.microbatch) for r in _rows(result, device=0, module="vision",
                                                             kinds={"BW", "R"})) == [("BW", 0), ("BW", 2), ("R", 2)]


@pytest.mark.parametrize("model", ["builtin", "hf:llava"])
def test_disaggregate_encoder_rank_runs_only_the_encoder(results, model):
    for frozen in (False, True):
        _, result = results[(DISAGGREGATED, model, frozen)]
        assert {r.module for r in _rows(result, device=2)} == {"vision"}
        assert {r.module for r in _rows(result, device=0)} == {r.module for r in _rows(result, device=1)} == {"llm"}
        assert {r.kind for r in _rows(result, device=2)} == ({"F"} if frozen else {"F", "BW"})


def test_encoder_rows_of_shards_within_groups():
    rows = EncoderRows([1, 2, 3, 1, 2], {0: 3, 2: 2, 4: 1}, batch=2)
    assert [rows.rows(m) for m in range(5)] == [(0, 1), (1, 3), (0, 3), (3, 4), (0, 2)]
    assert [rows.shard(k, 0) for k in range(3)] == [(0, 1), (1, 2), (2, 3)]
    # Shard 0 of group {0, 1} is microbatch 0's image; shards 1 and 2 are microbatch 1's.
    assert [rows.piece(k, 0) for k in range(3)] == [(0, 1), (1, 1), (2, 2)]
    assert [rows.piece(k, 1) for k in range(3)] == [(1, 1), (1, 2), (2, 3)]
    assert [rows.shard(k, 2) for k in range(2)] == [(0, 2), (2, 4)]
    assert [rows.piece(k, 2) for k in range(2)] == [(0, 2), (2, 3)]
    assert [rows.piece(k, 3) for k in range(2)] == [(3, 3), (3, 4)]
    assert rows.members(4) == range(4, 5) and rows.piece(0, 4) == (0, 2)


def test_shards_of_a_group_that_miss_a_microbatch_run_exactly():
    """A shard of a group may hold none of one member's images: its messages (features,
    and their gradient back) carry no rows, and the gradient check still holds."""
    terms = ["encoder_batch(transpose(1f1b(p=2, m=4), mode=dynamic, shards=4, backward=owner), 2)",
             "encoder_batch(transpose(dualpipev(p=2, m=4), mode=dynamic, shards=3), 2)"]
    jobs = [job(t, TRAIN) for t in terms]
    for j in jobs:
        plan = build_plan(schedule_from_dict(j.schedule))
        rows = EncoderRows(TRAIN.image_counts(4), plan.shards, plan.encoder_batch)
        feats = [e for r in plan.ranks for p in r.ops for e in p.outputs if e.what == FEAT]
        sizes = [rows.piece(e.producer.chunk, e.consumer.mb) for e in feats]
        assert 0 < sum(hi == lo for lo, hi in sizes) < len(feats) and min(plan.shards.values()) >= 3
    for result in run_local(jobs, 2):
        assert result.grad_check["ok"], result.grad_check["steps"][0]["failures"][:3]


def test_disaggregate_with_two_encoder_ranks_all_reduces_among_them_only():
    term = "encoder_batch(disaggregate(1f1b(p=2, m=6), encoder_devices=2), 2)"
    j = job(term, TRAIN, steps=2)
    plan = build_plan(schedule_from_dict(j.schedule))
    assert plan.ar_group == (2, 3) and [r.chunks for r in plan.ranks] == [[0], [1], [], []]
    (result,) = run_local([j], 4)
    check = result.grad_check
    assert check["ok"] and check["final_params_ok"], check["steps"][-1]["failures"][:3]
    # Both encoder ranks trained every encoder parameter, and ended with equal copies.
    enc = [n for n, v in check["steps"][0]["parameters"].items() if n.startswith("vision.")]
    assert enc and all(check["steps"][0]["parameters"][n]["ranks"] == [2, 3] for n in enc)

