"""A drawn batch's memory and transfers follow each microbatch: the LLM's
activation and hidden state its tokens (n / R), an encoder's activation and
features its tiles (docs/data.md)."""
import json

import pytest

from mpipe_core.api import evaluate
from mpipe_core.data.packing import Pack
from mpipe_core.ir.ops import Op
from mpipe_core.simulation.chunks import chunk_costs
from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import EDGE_FEATURES, collect_facts
from mpipe_core.simulation.metrics import compute_metrics, peak_fits
from mpipe_core.simulation.simulator import simulate
from mpipe_core.workloads.batch_costs import microbatch_workload
from mpipe_core.workloads.workload import parse_workload

# R = packing.max_tokens = 100: a microbatch of 50 tokens is half a nominal one.
DOC = {"llm": {"layers": 2, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.0, "boundary_bytes": 10.0},
       "link": {"latency": 0.5, "bandwidth": 10.0}, "device": {"memory": 1.8},
       "data": {"samples": {"images": 1, "tiles": 1, "text_tokens": 90},
                "tokens": {"per_tile": 10}, "packing": {"max_tiles": 8, "max_tokens": 100}}}
ENCODER = {"name": "vision", "f": 0.5, "b": 0.5, "w": 0.5, "trainable": False, "output_bytes": 2.0,
           "activation": 0.25}
# Microbatch 1 holds twice microbatch 0's tokens, and twice its tiles.
PACKS = [Pack((), 1, 50), Pack((), 2, 100)]


def _batch(doc=DOC):
    return microbatch_workload(parse_workload(doc), PACKS)


def test_twice_the_tokens_hold_twice_the_llm_activation_and_ship_twice_the_hidden_state():
    wl = _batch()
    assert wl.llm.token_ratio == (0.5, 1.0)
    schedule = evaluate("1f1b(p=2, m=2)", wl).schedule
    costs = chunk_costs(schedule.pipelines[0], wl)
    assert [costs.activation(0, m) for m in (0, 1)] == [0.5, 1.0]
    assert [wl.llm.boundary_bytes_of(m) for m in (0, 1)] == [5.0, 10.0]
    model = CostModel(schedule, wl, collect_facts(schedule))
    # latency 0.5 + bytes / 10
    assert [model.boundary(0, 1, m) for m in (0, 1)] == [1.0, 1.5]
    # 1f1b, device 0: F(0,0) F(0,1) B(0,0) B(0,1): both held at once, 0.5 + 1.0;
    # device 1: F(1,0) B(1,0) F(1,1) B(1,1): one at a time, at most 1.0
    tl = simulate(schedule, wl)
    metrics = compute_metrics(schedule, wl, tl)
    assert metrics.peak_activation_memory == [1.5, 1.0]
    assert metrics.fits is True
    assert peak_fits(schedule, wl, tl) == (1.5, True)
    assert peak_fits(schedule, wl, tl, cap=1.4) == (1.5, False)
    # the nominal batch (both microbatches at R tokens) holds 2.0 on device 0: over the 1.8 there is
    nominal = microbatch_workload(parse_workload(DOC), [Pack((), 1, 100), Pack((), 1, 100)])
    tl = simulate(schedule, nominal)
    assert compute_metrics(schedule, nominal, tl).peak_activation_memory == [2.0, 1.0]
    assert peak_fits(schedule, nominal, tl) == (2.0, False)


def test_a_longer_microbatch_s_hidden_state_takes_longer_on_the_link():
    """One microbatch per run, so device 1 waits only for the hidden state: 1.0 for
    50 tokens, 1.5 for 100, on the general simulator and the fast path alike."""
    for packs, wait in (([Pack((), 1, 50)], 1.0), ([Pack((), 2, 100)], 1.5)):
        wl = microbatch_workload(parse_workload(DOC), packs)
        for term in ("gpipe(p=2, m=1)", "repeat(gpipe(p=2, m=1), 2)"):  # the fast path, the general one
            tl = evaluate(term, wl).timeline
            at = {op: (s, e) for op, _, s, e in tl.rows()}
            forward = [at[Op("llm", "F", c, 0, 0)] for c in (0, 1)]
            assert forward[1][0] - forward[0][1] == wait, term
            # and the gradient back, chunk 1's backward to chunk 0's
            back = [at[Op("llm", "BW", c, 0, 0)] for c in (0, 1)]
            assert back[0][0] - back[1][1] == wait, term


def test_recompute_rebuilds_a_microbatch_s_own_share():
    doc = json.loads(json.dumps(DOC))
    doc["llm"]["recompute"] = {"full": {"activation": 0.0}}
    wl = _batch(doc)
    ev = evaluate("recompute(gpipe(p=2, m=1))", microbatch_workload(parse_workload(doc), PACKS[:1]))
    # one microbatch of 50 tokens: the fused BW rebuilds its one layer at half the nominal size
    assert ev.metrics.peak_activation_memory == [0.5, 0.5]
    ev = evaluate("recompute(1f1b(p=2, m=2))", wl)
    assert ev.metrics.peak_activation_memory == [1.0, 1.0]


def test_an_encoder_s_activation_and_features_follow_its_tiles():
    wl = _batch({**DOC, "encoders": [ENCODER]})
    assert wl.encoders[0].counts == (1.0, 2.0)
    assert [wl.encoders[0].output_bytes_of(m) for m in (0, 1)] == [2.0, 4.0]
    assert wl.encoders[0].activations(2) == [0.25, 0.5]
    schedule = evaluate("transpose(1f1b(p=2, m=2), mode=prefix)", wl).schedule
    model = CostModel(schedule, wl, collect_facts(schedule))
    llm = [Op("llm", "F", 0, m, 0) for m in (0, 1)]
    enc = [Op("vision", "F", 0, m, 0) for m in (0, 1)]
    # latency 0.5 + 2 bytes per tile / 10
    assert [model.transfer(e, f, EDGE_FEATURES) for e, f in zip(enc, llm)] == [0.7, 0.9]


def test_constant_data_at_the_reference_length_is_the_workload_without_data():
    """Every pack one tile and R tokens: the same timeline, memory and transfers as no data."""
    doc = {**DOC, "encoders": [ENCODER]}
    bare = parse_workload({k: v for k, v in doc.items() if k != "data"})
    with_data = parse_workload(doc)
    for term in ("1f1b(p=2, m=4)", "transpose(1f1b(p=2, m=4), mode=dynamic)",
                 "encoder_batch(transpose(1f1b(p=2, m=4), mode=prefix), k=2)", "recompute(zb_h1(p=2, m=4))"):
        a, b = evaluate(term, bare), evaluate(term, with_data)
        assert b.workload.llm.token_ratio == (1.0,) * 4
        assert a.metrics == b.metrics, term
        assert list(a.timeline.rows()) == list(b.timeline.rows()), term


def test_constant_data_on_a_cluster_is_the_workload_without_data():
    """Analytic, with Megatron's all-gather after each exchange and blocking sends: the
    same sends and gathers at R tokens; twice the tokens cost more on every hop."""
    base = {"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100"}
    data = {"samples": {"images": 0, "tiles": 1, "text_tokens": 4096}, "packing": {"max_tiles": 8,
                                                                                   "max_tokens": 4096}}
    for parallel in ({"tp": 4}, {"tp": 4, "p2p_overlap": False}):
        bare = parse_workload({**base, "parallel": parallel})
        with_data = parse_workload({**base, "parallel": parallel, "data": data})
        a, b = evaluate("1f1b(p=4, m=4)", bare), evaluate("1f1b(p=4, m=4)", with_data)
        assert b.workload.llm.token_ratio == (1.0,) * 4
        assert a.metrics.peak_memory == b.metrics.peak_memory
        assert a.metrics.makespan == pytest.approx(b.metrics.makespan, rel=1e-12)
        halves = microbatch_workload(with_data, [Pack((), 0, 2048)] * 4)
        half = evaluate("1f1b(p=4, m=4)", halves)
        assert half.metrics.peak_activation_memory == pytest.approx([x / 2 for x in a.metrics.peak_activation_memory])
        assert half.metrics.makespan < a.metrics.makespan


CLUSTER = {"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100",
           "encoders": [{"name": "vision", "vit": "vit-l-0.3b", "trainable": True}], "data": "internvl"}


@pytest.mark.parametrize("doc", [{**DOC, "llm": {**DOC["llm"], "layers": 4},
                                  "encoders": [{**ENCODER, "trainable": True, "input_bytes": 3.0}]},
                                 {**CLUSTER, "parallel": {"tp": 4}},
                                 {**CLUSTER, "parallel": {"tp": 4, "p2p_overlap": False}}])
@pytest.mark.parametrize("term", ["interleaved(p=2, v=2, m=4)", "transpose(1f1b(p=2, m=4), mode=dynamic)",
                                  "transpose(1f1b(p=2, m=4), mode=prefix, backward=recompute)",
                                  "encoder_batch(1f1b(p=2, m=4), k=2)", "balanced(1f1b(p=2, m=4))"])
def test_a_drawn_batch_s_fast_paths_equal_the_general_simulator(doc, term):
    import mpipe_core.simulation.llm_fast_path as fast_path
    import mpipe_core.simulation.simulator as simulator
    import mpipe_core.simulation.step_fast_path as step_fast_path

    packs = [Pack((), 1, 300), Pack((), 6, 4096), Pack((), 3, 1000), Pack((), 12, 9000)]
    wl = microbatch_workload(parse_workload(doc), packs)
    ev = evaluate(term, wl)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast_path, "simulate_llm_pipeline", lambda s, w: None)
        patch.setattr(step_fast_path, "simulate_step_with_encoders", lambda s, w, i: None)
        patch.setattr(simulator, "_RECENT", type(simulator._RECENT)())
        slow = simulate(ev.schedule, wl)
    assert (ev.timeline.ops, ev.timeline.device) == (slow.ops, slow.device)
    assert ev.timeline.start == slow.start and ev.timeline.end == slow.end
