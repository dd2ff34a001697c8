"""recompute(t, mode, chunks | layers): the time it adds and the memory it saves,
against figures computed by hand; how it composes; what it refuses."""
import contextlib
import io

import pytest

from mpipe_cli.main import main
from mpipe_core.algebra.terms import parse
from mpipe_core.api import evaluate
from mpipe_core.errors import TermError
from mpipe_core.ir.ops import R
from mpipe_core.simulation.chunks import chunk_costs

# Two LLM layers, F = B = W = 1 per layer; a layer keeps 1 without recompute,
# 0.1 under full recompute, 0.5 under selective (which adds 0.25 per layer).
W = {"llm": {"layers": 2, "activation": 1.0,
             "recompute": {"full": {"activation": 0.1}, "selective": {"activation": 0.5, "f": 0.25}}}}


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


# The lower bound counts essential work only (recompute is not): one device does
# all of it, m x 2 layers x (F + B + W) = 6m; on two devices of one layer each,
# a device's pinned 4 x 3 = 12 beats one microbatch's critical path of 6.
@pytest.mark.parametrize("term, makespan, peak, bound", [
    # one device, 3 microbatches of 2 layers: 3 x (F 2 + BW 4) = 18; all 3 kept: 6
    ("gpipe(p=1, m=3)", 18.0, [6.0], 18.0),
    # full: each BW redoes the forward (+2): 3 x 8 = 24; kept 3 x 0.2, and a fused
    # backward rebuilds one layer at a time (0.9): 0.6 + 0.9 = 1.5
    ("recompute(gpipe(p=1, m=3))", 24.0, [1.5], 18.0),
    # split backward: the recompute goes into B (B 4, W 2); W needs both rebuilt layers: 0.4 + 1.8 = 2.2
    ("recompute(split_bw(gpipe(p=1, m=2)))", 16.0, [2.2], 12.0),
    # selective: +0.25 per layer per backward: 2 x (2 + 4.5) = 13; kept 2 x 0.5 per microbatch,
    # one layer's 0.5 rebuilt: 1 + 1 + 0.5 = 2.5
    ("recompute(gpipe(p=1, m=2), mode=selective)", 13.0, [2.5], 12.0),
    # 1F1B on 2 devices (one layer each): every BW 2 + 1 = 3, so (m + p - 1)(F + BW) = 5 x 4;
    # device 0 holds 2 microbatches at once: 0.1 kept + 0.1 kept + 0.9 rebuilt = 1.1 (2 without)
    ("1f1b(p=2, m=4)", 15.0, [2.0, 1.0], 12.0),
    ("recompute(1f1b(p=2, m=4))", 20.0, [1.1, 1.0], 12.0),
])
def test_time_and_memory_of_recompute_by_hand(term, makespan, peak, bound):
    m = evaluate(term, W).metrics
    assert m.makespan == makespan
    assert m.peak_activation_memory == pytest.approx(peak, rel=1e-12)
    assert m.lower_bound == bound
    if term.startswith("recompute("):
        # recompute is not essential work: the body's bound, though the makespan grew
        body = evaluate(parse(term).kwargs[0][1], W).metrics
        assert m.lower_bound == body.lower_bound and m.makespan > body.makespan


def test_layers_recompute_the_first_layers_of_each_chunk():
    wl = {"llm": {"layers": 6, "activation": 1.0, "recompute": {"full": {"activation": 0.0}}}}
    ev = evaluate("recompute(gpipe(p=2, m=1), layers=[1, 3])", wl)
    assert ev.schedule.pipelines[0].recompute == ((1, 0), (3, 0))
    costs = chunk_costs(ev.schedule.pipelines[0], ev.workload)
    assert costs.llm["BW"] == [6 + 1, 6 + 3]  # 3 layers of B + W each, plus the recomputed layers' F
    assert costs.llm_activation == [2.0, 0.0] and costs.recompute_activation == [1.0, 3.0]


def test_measured_per_layer_forwards_are_what_a_recompute_redoes():
    wl = {"llm": {"layers": 4, "layer_costs": {"F": [1, 2, 3, 4], "B": [1, 1, 1, 1], "W": [1, 1, 1, 1]}}}
    ev = evaluate("recompute(gpipe(p=2, m=1), layers=[1, 2])", wl)
    assert chunk_costs(ev.schedule.pipelines[0], ev.workload).llm["B"] == [2 + 1, 2 + 3 + 4]


def test_recomputes_compose_and_full_wins_over_selective():
    wl = {"llm": {"layers": 4}}
    assert evaluate("recompute(recompute(gpipe(p=2, m=1), mode=selective), layers=[1, 0])",
                    wl).schedule.pipelines[0].recompute == ((1, 1), (0, 2))
    assert evaluate("recompute(recompute(gpipe(p=2, m=1), layers=[1, 0]), mode=selective, chunks=[0])",
                    wl).schedule.pipelines[0].recompute == ((1, 1), (0, 0))
    assert evaluate("recompute(recompute(gpipe(p=2, m=1), chunks=[1]), chunks=[0])",
                    wl).schedule.pipelines[0].recompute == ((2, 0), (2, 0))


def test_a_selective_recompute_costs_at_most_the_full_one():
    # the workload says selective redoes 5 per layer; a layer's whole forward is 1
    wl = {"llm": {"layers": 1, "recompute": {"selective": {"activation": 0.5, "f": 5.0}}}}
    assert evaluate("recompute(gpipe(p=1, m=1), mode=selective)", wl).metrics.makespan == 1 + 2 + 1


def test_recompute_of_balanced_chunks_redoes_their_folded_encoder_layers_too():
    wl = {"llm": {"layers": 4, "activation": 1.0, "recompute": {"full": {"activation": 0.0}}},
          "encoders": [{"name": "vision", "f": 4.0, "b": 4.0, "w": 4.0, "trainable": True, "layers": 4,
                        "activation": 4.0, "recompute": {"full": {"activation": 0.0}}}]}
    plain = evaluate("balanced(gpipe(p=2, m=1))", wl)
    pipe = plain.schedule.pipelines[0]
    assert pipe.encoder_layers == (4, 0) and pipe.layers == (0, 4)  # 12 of work per microbatch each
    again = evaluate("recompute(balanced(gpipe(p=2, m=1)), chunks=[0])", wl)
    before = chunk_costs(pipe, plain.workload)
    after = chunk_costs(again.schedule.pipelines[0], again.workload)
    assert after.duration("BW", 0, 0) == before.duration("BW", 0, 0) + 4.0  # the encoder's forward again
    assert after.duration("BW", 1, 0) == before.duration("BW", 1, 0)
    assert (after.activation(0, 0), after.encoder_rebuilt[0][0], after.encoder_rebuilt_fused[0][0]) == (0.0, 4.0, 1.0)
    # device 0 keeps the encoder's 4 without recompute; with it nothing, and one layer's 1 in its fused backward
    assert plain.metrics.peak_activation_memory[0] == 4.0 and again.metrics.peak_activation_memory[0] == 1.0
    # layers count the chunk's encoder layers first
    assert evaluate("recompute(balanced(gpipe(p=2, m=1)), layers=[2, 1])", wl).schedule.pipelines[0].recompute \
        == ((2, 0), (1, 0))


def test_recompute_composes_with_transpose_whose_encoder_recompute_keeps_its_meaning():
    wl = dict(W, encoders=[{"name": "vision", "f": 3.0, "b": 1.0, "w": 1.0, "trainable": True,
                            "output_bytes": 1.0, "input_bytes": 1.0, "activation": 1.0}])
    base = evaluate("transpose(1f1b(p=2, m=4))", wl)
    inside = evaluate("transpose(recompute(1f1b(p=2, m=4)))", wl)
    outside = evaluate("recompute(transpose(1f1b(p=2, m=4)))", wl)
    encoder_recomputes = [op for op in base.schedule.ops() if op.kind == R]
    assert encoder_recomputes  # the reference's recompute backward for the encoder
    for ev in (inside, outside):
        assert [op for op in ev.schedule.ops() if op.kind == R] == encoder_recomputes
        assert ev.schedule.llm_only().orders == base.schedule.llm_only().orders
        assert ev.metrics.makespan > base.metrics.makespan
    assert outside.schedule.orders == base.schedule.orders


def test_recompute_prints_canonically():
    assert str(parse("recompute(1f1b(p=2, m=4), mode=full, chunks=none, layers=none)")) == "recompute(1f1b(p=2, m=4))"
    assert str(parse("recompute(1f1b(p=2, m=4), chunks=[1], mode=selective)")) == \
        "recompute(1f1b(p=2, m=4), mode=selective, chunks=[1])"


@pytest.mark.parametrize("term, message", [
    ("recompute(1f1b(p=2, m=4), chunks=[2])", "1:27: recompute: chunk 2 is not in the term (it has chunks 0-1)"),
    ("recompute(zbv(p=2, m=4), chunks=[0, 4])", "1:26: recompute: chunk 4 is not in the term (it has chunks 0-3)"),
    ("recompute(1f1b(p=2, m=4), layers=[3, 1])", "1:27: recompute: layers[0] is 3 but chunk 0 holds 2 layers"),
    ("recompute(1f1b(p=4, m=4), layers=[1, 1, 1, 2])", "1:27: recompute: layers[3] is 2 but chunk 3 holds 1 layer"),
    ("recompute(1f1b(p=2, m=4), chunks=[0, 0])", "1:27: recompute: chunk 0 is named twice"),
    ("partition(recompute(1f1b(p=2, m=4)), [1, 1])",
     "1:1: partition: partition cannot re-split a recompute(...) schedule (put partition inside recompute)"),
    ("balanced(recompute(1f1b(p=2, m=4)))",
     "1:1: balanced: balanced cannot re-split a recompute(...) schedule (put balanced inside recompute)"),
    ("seq(recompute(1f1b(p=2, m=4)), 1f1b(p=2, m=4))",
     "1:1: seq: seq needs both schedules to recompute the same layers (put recompute(...) around seq, or the "
     "same one inside both)"),
])
def test_what_recompute_refuses(term, message):
    with pytest.raises(TermError) as info:
        evaluate(term, {"llm": {"layers": 4}})
    assert info.value.message == message


def test_recompute_errors_through_the_cli_are_one_line_and_exit_2():
    code, out, err = cli("eval", "recompute(1f1b(p=2, m=4), layers=[17, 16])", "-w", "llama2-7b")
    assert (code, out, err) == (2, "", "error: 1:27: recompute: layers[0] is 17 but chunk 0 holds 16 layers\n")
    code, out, err = cli("eval", "recompute(interleaved(p=2, m=4), chunks=[7])")
    assert (code, out, err) == (2, "", "error: 1:34: recompute: chunk 7 is not in the term (it has chunks 0-3)\n")


# What the embedding and the head (with the loss) keep per microbatch: on the
# first and the last chunk, never recomputed.
PARTS = {"llm": {"layers": 2, "activation": 1.0, "recompute": {"full": {"activation": 0.1}},
                 "embed": {"activation": 0.25}, "head": {"F": 0.5, "activation": 0.5}}}


def test_embedding_and_head_keep_their_activation_on_the_first_and_last_chunk():
    ev = evaluate("gpipe(p=2, m=1)", PARTS)
    costs = chunk_costs(ev.schedule.pipelines[0], ev.workload)
    assert costs.llm_activation == [1.25, 1.5] and costs.llm["F"] == [1.0, 1.5]
    assert ev.metrics.peak_activation_memory == [1.25, 1.5]
    # one chunk holds both; a full recompute keeps them as they are
    assert evaluate("gpipe(p=1, m=1)", PARTS).metrics.peak_activation_memory == [2.75]
    ev = evaluate("recompute(gpipe(p=1, m=1))", PARTS)
    assert chunk_costs(ev.schedule.pipelines[0], ev.workload).llm_activation == [0.2 + 0.75]
    # the workload round-trips them beside the times
    from mpipe_core.workloads.workload import explicit_dict, load_workload

    llm = explicit_dict(load_workload(PARTS))["llm"]
    assert llm["embed"] == {"activation": 0.25} and llm["head"] == {"F": 0.5, "activation": 0.5}


@pytest.mark.parametrize("term, peak", [
    # 2 layers, both fully recomputed: kept 0.1 + 0.1 + embedding 0.25 + head 0.5 = 0.95; the fused
    # BW frees the head's 0.5 before it rebuilds a layer (0.9 beyond its kept input): 0.95 + 0.4
    ("recompute(gpipe(p=1, m=1))", 1.35),
    # only the first layer: kept 0.1 + 1 + 0.25 + 0.5 = 1.85; by the time the BW reaches it, the second
    # layer's 1 and the head's 0.5 are freed, more than the 0.9 it rebuilds: nothing on top
    ("recompute(gpipe(p=1, m=1), layers=[1])", 1.85),
    # a split B keeps everything for W: 1.85 + 0.9
    ("recompute(split_bw(gpipe(p=1, m=1)), layers=[1])", 2.75),
])
def test_a_fused_backward_rebuilds_once_what_follows_is_freed(term, peak):
    assert evaluate(term, PARTS).metrics.peak_activation_memory == pytest.approx([peak], rel=1e-12)


def test_embedding_and_head_activation_must_be_numbers():
    from mpipe_core.errors import WorkloadError
    from mpipe_core.workloads.workload import load_workload

    with pytest.raises(WorkloadError, match=r"^llm\.head\.activation: expected a number, got 'x'$"):
        load_workload({"llm": {"head": {"activation": "x"}}})
    with pytest.raises(WorkloadError, match=r"^llm\.embed: expected \{'F': time, 'B': time, 'W': time, "
                                            r"'activation': memory\}$"):
        load_workload({"llm": {"embed": {"memory": 1}}})


# ---- encoders that run as ops of their own: recompute(..., encoders=yes|only)
# A trained encoder of 4 layers: F 2, B 1, W 1 per microbatch; it keeps 4 without recompute
# and 0.4 under full recompute (the backward rebuilds 3.6: one layer's 0.9 at a time in a fused BW).
ENC = {"llm": {"layers": 2, "activation": 0.0},
       "encoders": [{"name": "vision", "f": 2.0, "b": 1.0, "w": 1.0, "trainable": True, "layers": 4,
                     "activation": 4.0, "recompute": {"full": {"activation": 0.4}}}],
       "link": {"latency": 0.0, "bandwidth": 1e9}}


def _encoder_rows(ev, kind):
    return [(d, e - s) for op, d, s, e in ev.timeline.rows() if op.module == "vision" and op.kind == kind]


def test_an_encoder_of_its_own_redoes_its_forward_before_its_backward():
    plain = evaluate("colocated(1f1b(p=2, m=2))", ENC)
    redo = evaluate("recompute(colocated(1f1b(p=2, m=2)), encoders=only)", ENC)
    assert redo.schedule.pipelines[0].encoder_recompute == "full"
    assert redo.schedule.pipelines[0].recompute is None  # no LLM layer recomputed
    assert [t for _, t in _encoder_rows(plain, "BW")] == [2.0, 2.0]
    assert [t for _, t in _encoder_rows(redo, "BW")] == [4.0, 4.0]  # + the forward's 2
    # each device runs one microbatch's share: it keeps 0.4 and its fused BW rebuilds one layer (0.9)
    # at a time, where it kept 4 before
    assert max(plain.metrics.peak_memory) == pytest.approx(4.0)
    assert max(redo.metrics.peak_memory) == pytest.approx(0.4 + 0.9)
    # HFU has no step model on an explicit workload; the term prints back as written
    assert redo.term == "recompute(colocated(1f1b(p=2, m=2)), encoders=only)"


def test_a_split_encoder_backward_rebuilds_every_layer_for_its_w():
    ev = evaluate("recompute(colocated(zb_h1(p=2, m=2)), encoders=only)", ENC)
    assert [t for _, t in _encoder_rows(ev, "B")] == [3.0, 3.0]  # B 1 + the forward's 2
    assert max(ev.metrics.peak_memory) == pytest.approx(0.4 + 3.6)


def test_encoders_yes_recomputes_the_llm_too_and_only_refuses_chunks():
    both = evaluate("recompute(transpose(1f1b(p=2, m=2), backward=owner), encoders=yes)", ENC)
    assert both.schedule.pipelines[0].encoder_recompute == "full"
    assert both.schedule.pipelines[0].recompute == ((1, 0), (1, 0))
    with pytest.raises(Exception, match="encoders=only recomputes no LLM layer"):
        evaluate("recompute(colocated(1f1b(p=2, m=2)), chunks=[0], encoders=only)", ENC)
    frozen = {**ENC, "encoders": [dict(ENC["encoders"][0], trainable=False)]}
    with pytest.raises(Exception, match="no trained encoder to recompute"):
        evaluate("recompute(colocated(1f1b(p=2, m=2)), encoders=only)", frozen)


def test_inside_transpose_the_dynamic_placement_sees_the_longer_backward():
    ev = evaluate("transpose(recompute(1f1b(p=2, m=2), encoders=only), mode=dynamic, backward=owner)", ENC)
    assert ev.schedule.pipelines[0].encoder_recompute == "full"
    assert all(t == 4.0 for _, t in _encoder_rows(ev, "BW"))
