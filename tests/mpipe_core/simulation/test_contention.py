"""Devices sharing a host slow each other down (processor sharing), and
`mode=dynamic` places encoder work by that corrected model."""
import pytest

from mpipe_core.api import evaluate
from mpipe_core.errors import WorkloadError
from mpipe_core.simulation.contention import simulate_step_shared
from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import collect_facts
from mpipe_core.simulation.simulator import _simulate_step, rows_by_device, simulate
from mpipe_core.workloads.workload import load_workload, parse_workload

TERMS = ["1f1b(p=2, m=4)", "zb_h1(p=3, m=6)", "interleaved(p=2, m=4, v=2)", "zbv(p=2, m=4)",
         "transpose(1f1b(p=2, m=4), mode=prefix)", "transpose(1f1b(p=3, m=6), mode=dynamic, shards=2)",
         "repeat(1f1b(p=2, m=2), n=2)"]


def _doc(contention: float, devices=None, latency: float = 0.0) -> dict:
    return {"llm": {"layers": 4, "f": 1.0, "b": 2.0, "w": 1.0},
            "encoders": [{"name": "vision", "f": {"uniform": [1.0, 5.0], "seed": 3}, "b": 2.0, "w": 1.0,
                          "trainable": False}],
            "link": {"latency": latency, "bandwidth": None},
            "host": {"devices": devices, "contention": contention}}


@pytest.mark.parametrize("term", TERMS)
def test_no_contention_shared_path_equals_plain_simulator(term):
    # The event-driven path with contention 0 must reproduce list scheduling exactly.
    wl = load_workload(_doc(0.0, latency=0.25))
    sched = evaluate(term, wl).schedule
    index = {op: d for d, order in enumerate(sched.orders) for op in order}
    facts = collect_facts(sched)
    costs = CostModel(sched, wl, facts)
    orders = [[op for op in order if op.step == 0] for order in sched.orders]
    plain = _simulate_step(orders, index, facts, costs, 0.0)
    shared = rows_by_device(orders, *simulate_step_shared(orders, index, facts, costs, 0.0, wl.host))
    assert shared[0] == plain[0] and shared[1] == plain[1]
    assert shared[2] == pytest.approx(plain[2], abs=1e-9)
    assert shared[3] == pytest.approx(plain[3], abs=1e-9)


def _two_independent(contention, devices=None, f=(10.0, 4.0)):
    """Two devices each running only an encoder forward and nothing else depends across them:
    transpose(prefix) of gpipe(p=2, m=2) puts mb 0's encoder on device 0, mb 1's on device 1."""
    doc = {"llm": {"layers": 2, "f": 0.0, "b": 0.0, "w": 0.0},
           "encoders": [{"name": "vision", "f": list(f), "b": 0.0, "w": 0.0, "trainable": False}],
           "host": {"devices": devices, "contention": contention}}
    return simulate(evaluate("transpose(gpipe(p=2, m=2), mode=prefix)", doc).schedule, load_workload(doc))


def _encoder_rows(tl):
    return {(op.mb, d): (s, e) for op, d, s, e in tl.rows() if op.module == "vision"}


def test_overlapping_ops_share_the_host():
    # Both start at 0.  While both run, each advances at 1/1.5: the 4-unit op ends at 6;
    # the 10-unit one has 10 - 6/1.5 = 6 left, alone at full speed: ends at 12.
    rows = _encoder_rows(_two_independent(0.5))
    assert rows[(0, 0)] == pytest.approx((0.0, 12.0))
    assert rows[(1, 1)] == pytest.approx((0.0, 6.0))


def test_devices_on_separate_hosts_do_not_contend():
    rows = _encoder_rows(_two_independent(0.5, devices=1))
    assert rows[(0, 0)] == pytest.approx((0.0, 10.0))
    assert rows[(1, 1)] == pytest.approx((0.0, 4.0))


def test_host_section_is_validated():
    with pytest.raises(WorkloadError, match=r"host.contention: must be >= 0, got -1"):
        parse_workload({"llm": {}, "host": {"contention": -1}})
    with pytest.raises(WorkloadError, match=r"^host: unknown key 'cores' \(known: contention, devices, dispatch, pairs\)$"):
        parse_workload({"llm": {}, "host": {"cores": 2}})
    with pytest.raises(WorkloadError, match=r"^host.devices: expected an integer from 1 to 1000000, got 0$"):
        parse_workload({"llm": {}, "host": {"devices": 0}})


def test_contention_can_only_lengthen_a_schedule():
    for term in TERMS:
        plain = evaluate(term, _doc(0.0)).summary()["makespan"]
        slowed = evaluate(term, _doc(0.6)).summary()["makespan"]
        assert slowed >= plain - 1e-9, term


def test_dynamic_places_by_the_contended_model():
    # With encoder f=4 per microbatch, the free model puts encoder work on device 1 side by
    # side with device 0's; on a host where two busy ranks each run at 1/3 speed that placement
    # takes 57, and the placement dynamic picks on the contended model takes 51.
    doc = {"llm": {"layers": 2, "f": 1.0, "b": 1.0, "w": 1.0},
           "encoders": [{"name": "vision", "f": 4.0, "b": 0.0, "w": 0.0, "trainable": False}]}
    shared = dict(doc, host={"contention": 2.0})
    term = "transpose(1f1b(p=2, m=4), mode=dynamic, shards=2)"
    free = evaluate(term, doc)
    assert free.summary()["makespan"] == pytest.approx(23.0)
    assert simulate(free.schedule, load_workload(shared)).makespan == pytest.approx(57.0)
    assert evaluate(term, shared).summary()["makespan"] == pytest.approx(51.0)


def test_solo_work_inverts_the_shared_simulation():
    # Simulate with contention, then recover every op's own cost from the timeline alone.
    wl = load_workload(_doc(0.7, latency=0.1))
    ev = evaluate("transpose(zb_h1(p=3, m=6), mode=dynamic)", wl)
    tl = ev.timeline
    from mpipe_core.simulation.contention import solo_work

    solo = solo_work(tl.device, tl.start, tl.end, wl.host)
    sched = ev.schedule
    costs = CostModel(sched, wl, collect_facts(sched))
    assert solo == pytest.approx([costs.duration(op) for op in tl.ops], abs=1e-9)
    assert any(e - s > costs.duration(op) + 1e-6 for op, _, s, e in tl.rows())  # some did overlap


def test_each_shard_pays_the_dispatch_its_cost_includes():
    # 6 per microbatch including a 0.5 dispatch: two shards cost (6 - 0.5) / 2 + 0.5 = 3.25 each.
    doc = {"llm": {"layers": 2, "f": 1.0, "b": 1.0, "w": 1.0},
           "encoders": [{"name": "vision", "f": 6.0, "b": 0.0, "w": 0.0, "trainable": False}]}
    sharded = evaluate("transpose(1f1b(p=2, m=4), mode=dynamic, shards=2)", doc)
    shards = [e - s for op, _, s, e in sharded.timeline.rows() if op.module == "vision"]
    assert len(shards) == 8 and shards == pytest.approx([3.0] * 8)
    tl = simulate(sharded.schedule, load_workload(dict(doc, host={"dispatch": 0.5})))
    assert [e - s for op, _, s, e in tl.rows() if op.module == "vision"] == pytest.approx([3.25] * 8)
    # Placed on that model, dynamic keeps whole microbatches when the extra dispatches cost more.
    placed = evaluate("transpose(1f1b(p=2, m=4), mode=dynamic, shards=2)", dict(doc, host={"dispatch": 0.5}))
    assert placed.summary()["makespan"] <= tl.makespan + 1e-9


# --------------------------------------------------------------------------- contention by op class (host.pairs)

def _llm_beside_encoder(host: dict):
    """transpose(gpipe(p=2, m=2), mode=prefix): device 0 runs mb 0's encoder forward (2) then
    its LLM forward on chunk 0 (1), while device 1 runs mb 1's encoder forward (10)."""
    doc = {"llm": {"layers": 2, "f": 1.0, "b": 0.0, "w": 0.0},
           "encoders": [{"name": "vision", "f": [2.0, 10.0], "b": 0.0, "w": 0.0, "trainable": False}],
           "host": host}
    tl = simulate(evaluate("transpose(gpipe(p=2, m=2), mode=prefix)", doc).schedule, load_workload(doc))
    return {(op.module, op.kind, op.chunk, op.mb): (d, s, e) for op, d, s, e in tl.rows()}, tl


def test_an_llm_op_beside_an_encoder_slows_by_its_own_pair():
    # llm|encoder 1.0: device 0's LLM op (cost 1) runs at half speed beside device 1's encoder:
    # 2..4.  encoder|llm 0 and encoder|encoder 0: the encoders run at full speed, device 1's ends at 10.
    rows, _ = _llm_beside_encoder({"pairs": {"llm": {"encoder": 1.0}, "encoder": {"llm": 0.0, "encoder": 0.0}}})
    assert rows[("vision", "F", 0, 0)] == pytest.approx((0, 0.0, 2.0))
    assert rows[("vision", "F", 0, 1)] == pytest.approx((1, 0.0, 10.0))
    assert rows[("llm", "F", 0, 0)] == pytest.approx((0, 2.0, 4.0))
    # The other way round: the encoder slows by 1.0 beside the LLM op, the LLM op not at all.
    rows, _ = _llm_beside_encoder({"pairs": {"llm": {"encoder": 0.0}, "encoder": {"llm": 1.0, "encoder": 0.0}}})
    assert rows[("llm", "F", 0, 0)] == pytest.approx((0, 2.0, 3.0))
    # for 1 unit of time it advances at half speed: it loses 0.5
    assert rows[("vision", "F", 0, 1)] == pytest.approx((1, 0.0, 10.5))


def test_pairs_not_given_fall_back_to_the_contention():
    # Only llm|encoder named: encoder|encoder is the host's contention 0.5 (both encoders run 0..2
    # at 1/1.5: device 0's ends at 3), and llm|encoder 0 leaves the LLM op its own cost.
    rows, _ = _llm_beside_encoder({"contention": 0.5, "pairs": {"llm": {"encoder": 0.0}}})
    assert rows[("vision", "F", 0, 0)] == pytest.approx((0, 0.0, 3.0))
    assert rows[("llm", "F", 0, 0)] == pytest.approx((0, 3.0, 4.0))
    # Every pair equal to the contention is the plain contention model exactly.
    same = {"contention": 0.5, "pairs": {a: {b: 0.5 for b in ("llm", "encoder")} for a in ("llm", "encoder")}}
    _, with_pairs = _llm_beside_encoder(same)
    _, plain = _llm_beside_encoder({"contention": 0.5})
    assert with_pairs.start == pytest.approx(plain.start) and with_pairs.end == pytest.approx(plain.end)


def test_solo_work_inverts_the_simulation_by_pairs():
    doc = dict(_doc(0.2, latency=0.1), host={"contention": 0.2, "pairs": {"llm": {"encoder": 0.9, "llm": 0.0},
                                                                         "encoder": {"llm": 0.1}}})
    wl = load_workload(doc)
    ev = evaluate("transpose(zb_h1(p=3, m=6), mode=dynamic)", wl)
    tl = ev.timeline
    from mpipe_core.simulation.contention import solo_work

    solo = solo_work(tl.device, tl.start, tl.end, wl.host, list(tl.ops))
    costs = CostModel(ev.schedule, wl, collect_facts(ev.schedule))
    assert solo == pytest.approx([costs.duration(op) for op in tl.ops], abs=1e-9)
    with pytest.raises(ValueError, match="host.pairs needs the ops"):
        solo_work(tl.device, tl.start, tl.end, wl.host)


def test_pairs_are_validated_and_written_back():
    from mpipe_core.workloads.workload import explicit_dict

    with pytest.raises(WorkloadError, match=r"^host.pairs: unknown op class 'gpu' \(known: llm, encoder\)$"):
        parse_workload({"llm": {}, "host": {"pairs": {"gpu": {"llm": 1}}}})
    with pytest.raises(WorkloadError, match=r"^host.pairs.llm: unknown op class 'vision' \(known: llm, encoder\)$"):
        parse_workload({"llm": {}, "host": {"pairs": {"llm": {"vision": 1}}}})
    with pytest.raises(WorkloadError, match=r"^host.pairs.llm.encoder: must be >= 0, got -0.5$"):
        parse_workload({"llm": {}, "host": {"pairs": {"llm": {"encoder": -0.5}}}})
    with pytest.raises(WorkloadError, match=r"^host.pairs.llm: expected an object"):
        parse_workload({"llm": {}, "host": {"pairs": {"llm": 0.3}}})
    wl = parse_workload({"llm": {}, "host": {"pairs": {"llm": {"encoder": 0.4}}}})
    assert wl.host.contends and wl.host.slowdown("llm", "encoder") == 0.4 and wl.host.slowdown("encoder", "llm") == 0
    assert explicit_dict(wl)["host"]["pairs"] == {"llm": {"encoder": 0.4}}
    assert parse_workload(explicit_dict(wl)).host == wl.host
