"""transpose: the reference's worked examples, its invariant, its costs and verdicts."""
import pytest

from mpipe_core.api import evaluate
from mpipe_core.compare import compare
from mpipe_core.errors import TermError, WorkloadError
from mpipe_core.ir.ops import ALLREDUCE, BCAST, BW, LLM, NO_MICROBATCH, F, Op, R

FROZEN = {"llm": {"layers": 8}, "link": {"latency": 0.1},
          "encoders": [{"name": "vision", "f": 3.0, "trainable": False, "output_bytes": 1.0}]}
TRAINABLE = {"llm": {"layers": 8}, "link": {"latency": 0.1, "bandwidth": 10.0},
             "encoders": [{"name": "vision", "f": 3.0, "b": 3.0, "w": 3.0, "trainable": True,
                           "output_bytes": 1.0, "input_bytes": 2.0, "param_bytes": 5.0}]}


def enc(kind, mb, chunk=0):
    return Op("vision", kind, chunk, mb)


def test_p4_m4_every_rank_transposes_one_microbatch_and_rank0_receives_three():
    ev = evaluate("transpose(1f1b(p=4, m=4))", FROZEN)
    for rank in range(4):
        assert ev.schedule.orders[rank][0] == enc(F, rank)
    placement = ev.schedule.placement()
    shipped = [m for m in range(4) if placement[enc(F, m)] != placement[Op(LLM, F, 0, m)]]
    assert shipped == [1, 2, 3]
    rows = {(r["device"], r["module"], r["microbatch"]): r for r in ev.timeline_rows() if r["kind"] == "F"}
    # every rank starts its encoder forward at time 0, in parallel
    assert [rows[(r, "vision", r)]["start"] for r in range(4)] == [0, 0, 0, 0]
    # microbatch 1's LLM forward waits for the features from rank 1 plus the hop
    assert rows[(0, "llm", 1)]["start"] >= rows[(1, "vision", 1)]["end"] + 0.1


def test_p4_interleaved_m8_overflow_min_runs_overflow_inline_before_its_forward():
    ev = evaluate("transpose(interleaved(p=4, m=8, v=2), overflow=min)", FROZEN)
    rank0 = ev.schedule.orders[0]
    for m in range(4):
        assert ev.schedule.orders[m][0] == enc(F, m)
    for m in range(4, 8):
        i = rank0.index(Op(LLM, F, 0, m))
        assert rank0[i - 1] == enc(F, m)
    full = evaluate("transpose(interleaved(p=4, m=8, v=2), overflow=full)", FROZEN)
    assert [op for op in full.schedule.orders[1] if op.module == "vision"] == [enc(F, 1), enc(F, 5)]


def test_p4_m2_only_ranks_0_and_1_transpose():
    ev = evaluate("transpose(gpipe(p=4, m=2))", FROZEN)
    with_encoder = [d for d, order in enumerate(ev.schedule.orders) if any(op.module == "vision" for op in order)]
    assert with_encoder == [0, 1]


def test_trainable_recompute_broadcasts_then_recomputes_on_rank0_after_b0():
    ev = evaluate("transpose(1f1b(p=4, m=4), backward=recompute)", TRAINABLE)
    orders = ev.schedule.orders
    for d in range(4):
        assert orders[d][0] == Op("vision", BCAST, d, NO_MICROBATCH)
        assert orders[d][1] == enc(F, d)
    rank0 = orders[0]
    for m in range(1, 4):
        i = rank0.index(Op(LLM, BW, 0, m))
        assert list(rank0[i + 1:i + 3]) == [enc(R, m), enc(BW, m)]
    i = rank0.index(Op(LLM, BW, 0, 0))
    assert rank0[i + 1] == enc(BW, 0)  # rank 0's own microbatch needs no recompute
    assert not any(op.kind == ALLREDUCE for order in orders for op in order)


def test_trainable_owner_ships_gradient_back_and_all_reduces():
    ev = evaluate("transpose(1f1b(p=4, m=4), backward=owner)", TRAINABLE)
    orders = ev.schedule.orders
    for d in range(1, 4):
        assert list(orders[d][-2:]) == [enc(BW, d), Op("vision", ALLREDUCE, d, NO_MICROBATCH)]
    assert orders[0][-1] == Op("vision", ALLREDUCE, 0, NO_MICROBATCH)
    assert not any(op.kind == R for order in orders for op in order)


def test_frozen_encoder_ships_features_only():
    ev = evaluate("transpose(1f1b(p=4, m=4))", FROZEN)
    kinds = {op.kind for order in ev.schedule.orders for op in order if op.module == "vision"}
    assert kinds == {F}


@pytest.mark.parametrize("inner", ["1f1b(p=4, m=8)", "interleaved(p=4, m=8, v=2)", "zb_h1(p=4, m=8)",
                                   "zbv(p=4, m=8)", "dualpipev(p=4, m=8)", "gpipe(p=4, m=2)"])
@pytest.mark.parametrize("options", ["", ", overflow=min", ", backward=owner", ", mode=dynamic",
                                     ", mode=dynamic, shards=3", ", mode=dynamic, backward=owner, shards=2"])
@pytest.mark.parametrize("workload", [FROZEN, TRAINABLE])
def test_stripping_encoder_ops_gives_back_the_input_llm_order(inner, options, workload):
    base = evaluate(inner, workload).schedule.llm_only()
    transposed = evaluate(f"transpose({inner}{options})", workload)
    assert transposed.schedule.llm_only().orders == base.orders
    if "dynamic" in options:
        assert transposed.summary()["makespan"] <= evaluate(inner, workload).summary()["makespan"] + 1e-9
        assert transposed.summary()["makespan"] <= evaluate(f"transpose({inner})", workload).summary()["makespan"] + 1e-9


def test_reference_finding_frozen_heavy_vision_tower_wins_at_high_p_low_m():
    rows = compare(["1f1b(p=8, m=8)", "transpose(1f1b(p=8, m=8))"], {
        "llm": {"layers": 16}, "link": {"latency": 0.05},
        "encoders": [{"name": "vision", "f": 12.0, "trainable": False, "output_bytes": 1.0}]})
    assert rows[1].speedup > 1.4
    assert rows[1].transpose.verdict().startswith("transpose saves")


def test_reference_finding_trainable_text_block_loses_to_plain_1f1b():
    # a text embedding: almost no compute, many parameters to broadcast
    rows = compare(["1f1b(p=8, m=16)", "transpose(1f1b(p=8, m=16))"], {
        "llm": {"layers": 16}, "link": {"latency": 0.05, "bandwidth": 10.0},
        "encoders": [{"name": "text", "f": 0.05, "b": 0.05, "w": 0.05, "trainable": True,
                      "output_bytes": 1.0, "input_bytes": 0.1, "param_bytes": 200.0}]})
    assert rows[1].speedup < 1.0
    verdict = rows[1].transpose.verdict()
    assert verdict.startswith("transpose loses") and "broadcast costs more than the bubble it fills" in verdict


def test_dynamic_shards_split_one_microbatch_over_devices():
    ev = evaluate("transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)", "vit-heavy-small")
    placement = ev.schedule.placement()
    devices_of_mb0 = {placement[enc(F, 0, k)] for k in range(4)}
    assert len(devices_of_mb0) > 1
    prefix = evaluate("transpose(1f1b(p=4, m=4))", "vit-heavy-small").summary()["makespan"]
    assert ev.summary()["makespan"] < prefix


def test_bad_transpose_input_is_refused_clearly():
    with pytest.raises(TermError, match="shards > 1 needs mode=dynamic"):
        evaluate("transpose(1f1b(p=4, m=4), shards=2)", FROZEN)
    with pytest.raises(TermError, match="memory_cap=0.5 is impossible: device 0 needs 8 "):
        evaluate("transpose(1f1b(p=4, m=4), mode=dynamic, memory_cap=0.5)", FROZEN)
    with pytest.raises(WorkloadError, match=r"encoder 'vision'.f: has 3 per-microbatch costs but the schedule has 4"):
        evaluate("1f1b(p=4, m=4)", {"encoders": [{"name": "vision", "f": [1, 2, 3]}]})
    with pytest.raises(WorkloadError, match="unknown encoder 'audio'"):
        evaluate("1f1b(p=2, m=2)", FROZEN).workload.encoder("audio")


def test_encoder_stage_adds_a_device_ahead_of_the_llm():
    ev = evaluate("encoder_stage(1f1b(p=4, m=4))", TRAINABLE)
    assert ev.schedule.devices == 5
    assert {op.module for op in ev.schedule.orders[0]} == {"vision"}
    assert all(op.module == LLM for order in ev.schedule.orders[1:] for op in order)


def test_encoder_stage_in_front_of_gpipe_runs_the_forwards_gpipe_needs_before_a_backward():
    # gpipe's stage 0 forwards all 6 microbatches before its first backward: an
    # encoder stage that did only P = 2 forwards first would wait forever.
    ev = evaluate("encoder_stage(gpipe(p=2, m=6))", TRAINABLE)
    assert [op.kind for op in ev.schedule.orders[0]] == [F] * 6 + [BW] * 6
    first = [op.kind for op in evaluate("encoder_stage(1f1b(p=4, m=8))", TRAINABLE).schedule.orders[0]]
    assert first == [F] * 4 + [BW, F] * 4 + [BW] * 4  # 1F1B in front of the pipeline, as before
    # Two steps: no forward of step 1 before a backward of step 0 (the optimizer update is between).
    stage = evaluate("encoder_stage(repeat(1f1b(p=2, m=4), 2))", TRAINABLE).schedule.orders[0]
    assert [(op.kind, op.step) for op in stage] == ([(F, 0)] * 2 + [(BW, 0), (F, 0)] * 2 + [(BW, 0)] * 2
                                                    + [(F, 1)] * 2 + [(BW, 1), (F, 1)] * 2 + [(BW, 1)] * 2)


def test_dynamic_memory_cap_works_with_a_trainable_encoder():
    ev = evaluate("transpose(1f1b(p=4, m=8), mode=dynamic, memory_cap=9.0)",
                  dict(TRAINABLE, encoders=[dict(TRAINABLE["encoders"][0], activation=1.0)]))
    assert max(ev.metrics.peak_memory) <= 9.0


TWO_ENCODERS = {"llm": {"layers": 8}, "link": {"latency": 0.1},
                "encoders": [{"name": "vision", "f": 4.0, "trainable": False, "output_bytes": 1.0},
                             {"name": "audio", "f": 2.0, "b": 1.0, "w": 1.0, "trainable": True,
                              "output_bytes": 0.5, "param_bytes": 1.0}]}


def test_several_encoders_transposed_together_or_independently():
    fused = evaluate("1f1b(p=4, m=4)", TWO_ENCODERS).schedule
    only_audio = evaluate("transpose(1f1b(p=4, m=4), encoders=audio)", TWO_ENCODERS).schedule
    vision_ops = lambda s: [[op for op in o if op.module == "vision"] for o in s.orders]  # noqa: E731
    assert vision_ops(only_audio) == vision_ops(fused)  # untouched: still fused on rank 0
    assert {d for d, o in enumerate(only_audio.orders) for op in o if op.module == "audio" and op.kind == F} == {0, 1, 2, 3}
    together = evaluate("transpose(1f1b(p=4, m=4), encoders=[vision, audio])", TWO_ENCODERS)
    assert str(together.ast) == "transpose(1f1b(p=4, m=4), encoders=[vision, audio])"
    assert {d for d, o in enumerate(together.schedule.orders) for op in o if op.module == "vision"} == {0, 1, 2, 3}
    stepwise = evaluate("transpose(transpose(1f1b(p=4, m=4), encoders=vision), encoders=audio, mode=dynamic)",
                        TWO_ENCODERS)
    assert stepwise.schedule.llm_only().orders == fused.llm_only().orders
    assert stepwise.summary()["makespan"] <= evaluate("transpose(1f1b(p=4, m=4), encoders=vision)",
                                                      TWO_ENCODERS).summary()["makespan"] + 1e-9
    with pytest.raises(TermError, match=r"unknown encoder 'text' \(this workload has: vision, audio\)"):
        evaluate("transpose(1f1b(p=4, m=4), encoders=text)", TWO_ENCODERS)
