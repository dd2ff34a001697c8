"""per_batch(t): its law on constant data, never worse than static on random
data, its budget and fallback, and `mpipe eval --batches`."""
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mpipe_core.algebra.terms import parse
from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.search.per_batch import Planner
from mpipe_core.search.stream import evaluate_stream, gap
from mpipe_core.simulation.simulator import simulate
from mpipe_core.workloads.batch_costs import drawn_batches, microbatch_workload, permuted
from mpipe_core.workloads.workload import parse_workload
from mpipe_cli.main import main

BODIES = ("1f1b", "zb_h1", "interleaved", "gpipe")


def _workload(samples, trainable=False, dp=None):
    data = {"samples": samples, "tokens": {"per_tile": 4}, "packing": {"max_tiles": 12, "max_tokens": 64,
                                                                        "buffer": 4}}
    if dp is not None:
        data["dp"] = dp
    return parse_workload({
        "llm": {"layers": 8, "f": 1.0, "b": 1.0, "w": 1.0},
        "encoders": [{"name": "vision", "f": 0.6, "b": 0.6, "w": 0.6, "trainable": trainable,
                      "output_bytes": 1.0, "input_bytes": 2.0, "param_bytes": 4.0}],
        "link": {"latency": 0.05, "bandwidth": 20.0}, "data": data})


def _term(body, p, m, transpose, mode="dynamic"):
    inner = f"{body}(p={p}, m={m})"
    return f"transpose({inner}, mode={mode})" if transpose else inner


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiles=st.integers(1, 6), text=st.integers(0, 20), body=st.sampled_from(BODIES),
       p=st.integers(2, 4), rounds=st.integers(1, 2), transpose=st.booleans(), trainable=st.booleans())
def test_law_per_batch_of_t_is_t_on_constant_data(tiles, text, body, p, rounds, transpose, trainable,
                                                  tmp_path_factory):
    m = p * rounds  # (every generator takes a multiple of p)
    path = tmp_path_factory.mktemp("d") / "one.jsonl"
    path.write_text(json.dumps({"images": 1, "tiles": [tiles], "text_tokens": text}) + "\n")
    wl = _workload(str(path), trainable)
    term = _term(body, p, m, transpose)
    planned = evaluate_stream(f"per_batch({term})", wl, 3)
    static = evaluate_stream(term, wl, 3)
    assert [b.makespan for b in planned.batches] == [b.makespan for b in static.batches]
    assert all(b.static_makespan == b.makespan for b in planned.batches)
    assert {h for b in planned.batches for h in b.how} == {"static (the mean batch)"}
    # ... and that is t's own makespan on the workload (every microbatch the same)
    assert planned.batches[0].makespan == evaluate(term, wl).timeline.makespan


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), hi=st.integers(2, 12), share=st.sampled_from([0.0, 0.3]),
       body=st.sampled_from(BODIES), p=st.integers(2, 4), rounds=st.integers(1, 2), trainable=st.booleans(),
       batched=st.booleans(), mode=st.sampled_from(["prefix", "dynamic"]))
def test_per_batch_is_never_worse_than_static_on_any_batch_of_random_data(seed, hi, share, body, p, rounds,
                                                                           trainable, batched, mode):
    m = p * rounds
    mix = {"images": {"weights": [1, 2, 1]}, "tiles": {"uniform": [1, hi]},
           "text_tokens": {"lognormal": [2.5, 1.0], "max": 60}}
    wl = _workload({**mix, "video": {"share": share, "frames": 3}} if share else mix, trainable)
    term = _term(body, p, m, True, mode)
    if batched:
        term = f"encoder_batch({term}, k=2)"
    planner = Planner(parse(term), wl)
    for batch in drawn_batches(wl, m, 3):
        costs = microbatch_workload(wl, batch.of(0))
        plan = planner.plan(costs, budget_ms=1e9, packs=batch.of(0))
        static = simulate(planner.static, costs).makespan
        assert plan.static_makespan == static
        assert plan.makespan <= static
        # the plan is a valid schedule whose makespan on its batch is the one reported
        assert simulate(plan.schedule, plan.workload).makespan == pytest.approx(plan.makespan)
        assert sorted(plan.order) == list(range(m))
        _same_samples(wl, batch.of(0), plan)


def _same_samples(wl, packs, plan):
    """A plan's microbatches hold the batch's samples, and its costs are theirs in its order."""
    held = plan.packs if plan.packs is not None else packs
    assert sorted(map(repr, (p for pk in held for p in pk.pieces))) == \
        sorted(map(repr, (p for pk in packs for p in pk.pieces)))
    assert all(pk.tiles <= wl.data.packing.max_tiles and pk.tokens <= wl.data.packing.max_tokens for pk in held)
    assert plan.workload == permuted(microbatch_workload(wl, held), plan.order)
    assert (plan.packs is not None) == ("regrouped" in plan.how)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), hi=st.integers(2, 12), body=st.sampled_from(BODIES), p=st.integers(2, 4),
       rounds=st.integers(1, 3), trainable=st.booleans(), wrap=st.sampled_from(["colocated", "none"]))
def test_regrouped_and_dealt_plans_are_never_worse_and_hold_the_same_samples(seed, hi, body, p, rounds, trainable,
                                                                             wrap):
    m = p * rounds
    mix = {"images": {"weights": [1, 2, 1]}, "tiles": {"uniform": [1, hi]},
           "text_tokens": {"lognormal": [2.5, 1.0], "max": 60}}
    wl = _workload(mix, trainable)
    term = f"{body}(p={p}, m={m})"
    planner = Planner(parse(f"colocated({term})" if wrap == "colocated" else term), wl)
    assert (planner.shares is not None) == (wrap == "colocated")
    for batch in drawn_batches(wl, m, 3):
        costs = microbatch_workload(wl, batch.of(0))
        plan = planner.plan(costs, budget_ms=1e9, packs=batch.of(0))
        assert plan.makespan <= simulate(planner.static, costs).makespan == plan.static_makespan
        assert simulate(plan.schedule, plan.workload).makespan == pytest.approx(plan.makespan)
        _same_samples(wl, batch.of(0), plan)


def test_dealing_to_the_encoder_shares_evens_them():
    from mpipe_core.search.per_batch import deal_to_shares

    # shares of slots (0, 1) and (2, 3); weights 9, 1, 8, 2: 9 -> share 0, 8 -> 1, 2 -> 1, 1 -> 0
    assert deal_to_shares(((0, 1), (2, 3)), [9.0, 1.0, 8.0, 2.0]) == (0, 1, 2, 3)
    assert deal_to_shares(((0, 1), (2, 3)), [9.0, 8.0, 1.0, 2.0]) == (0, 2, 1, 3)


def test_the_planner_honours_its_budget_and_falls_back_to_the_static_plan():
    mix = {"images": 1, "tiles": {"uniform": [1, 12]}, "text_tokens": {"uniform": [0, 40]}}
    wl = _workload(mix, trainable=True)
    planner = Planner(parse("transpose(1f1b(p=4, m=8), mode=dynamic)"), wl)
    packs = drawn_batches(wl, 8, 1)[0].of(0)
    costs = microbatch_workload(wl, packs)
    for given in (None, packs):  # (with the packs, re-composing them is a step the budget must allow too)
        nothing = planner.plan(costs, budget_ms=0.0, packs=given)
        assert nothing.how == "static" and nothing.fallback and nothing.schedule is planner.static
        assert nothing.makespan == nothing.static_makespan and nothing.packs is None
    full = planner.plan(costs, budget_ms=1e9)
    assert not full.fallback and full.makespan < full.static_makespan  # this batch gains
    # a budget that lets the static plan and the reorderings run but not a re-placement
    tight = planner.plan(costs, budget_ms=3 * max(nothing.plan_ms, 0.2))
    assert tight.makespan <= tight.static_makespan


def test_a_term_with_nothing_to_re_plan_is_allowed_and_noted():
    planner = Planner(parse("per_batch(1f1b(p=2, m=4))"), _workload({"images": 1, "tiles": 2, "text_tokens": 3}))
    assert planner.note == ("per_batch(1f1b(p=2, m=4)): no transpose or encoder_batch to re-plan; only the "
                            "microbatches' order and composition change per batch")
    with pytest.raises(MpipeError) as caught:
        Planner(parse("repeat(per_batch(1f1b(p=2, m=4)), n=2)"), _workload({"images": 1, "tiles": 2,
                                                                            "text_tokens": 3}))
    assert caught.value.message == "per_batch(...) goes around the whole term (it plans the whole step per batch)"


def test_replicas_set_the_step_and_balance_narrows_the_straggler_gap():
    mix = {"images": 1, "tiles": {"weights": [8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4], "from": 1},
           "text_tokens": {"uniform": [0, 40]}}
    wl = _workload(mix, dp=4)
    result = evaluate_stream("1f1b(p=2, m=4)", wl, 6)
    assert all(b.makespan == max(b.replicas) and len(b.replicas) == 4 for b in result.batches)
    gaps = result.summary()["straggler_gap"]
    assert set(gaps) == {"none", "tiles+tokens"} and gaps["tiles+tokens"] < gaps["none"]
    assert gap([2.0, 1.0]) == 0.25


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_batches_prints_a_table_and_json_with_batches_and_summary(tmp_path, capsys):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({**_workload({"images": 1, "tiles": {"uniform": [1, 12]},
                                             "text_tokens": 5}).source, "units": {"time": "ms"}}))
    code, out, err = _cli(capsys, "eval", "per_batch(transpose(1f1b(p=2, m=4), mode=dynamic))", "-w", str(path),
                          "--batches", "3", "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert len(doc["batches"]) == 3
    row = doc["batches"][0]
    assert {"makespan", "static_makespan", "plan_ms", "step_time_s"} <= set(row)
    assert row["step_time_s"] == row["makespan"] / 1000
    assert {"mean", "p50", "p95", "max", "gain", "tokens_per_s"} <= set(doc["summary"])
    assert doc["summary"]["max"] == max(r["makespan"] for r in doc["batches"])
    code, out, err = _cli(capsys, "eval", "1f1b(p=2, m=4)", "-w", str(path), "--batches", "2")
    assert code == 0 and "makespan mean" in out and "tokens/s" in out


def test_eval_batches_bad_input_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(_workload({"images": 1, "tiles": 2, "text_tokens": 3}).source))
    code, out, err = _cli(capsys, "eval", "1f1b(p=2, m=4)", "-w", str(path), "--batches", "0")
    assert (code, err) == (2, "error: --batches: expected a whole number of batches >= 1, got 0\n")
    code, out, err = _cli(capsys, "eval", "1f1b(p=2, m=4)", "--batches", "2")
    assert (code, err) == (2, "error: --batches needs a workload with a data section (docs/data.md); 'uniform' "
                              "has none\n")
    code, out, err = _cli(capsys, "eval", "per_batch(1f1b(p=2, m=4))", "-w", str(path), "--batches", "1")
    assert code == 0 and err == ("note: per_batch(1f1b(p=2, m=4)): no transpose or encoder_batch to re-plan; "
                                 "only the microbatches' order and composition change per batch\n")
    data = tmp_path / "bad.jsonl"
    data.write_text('{"images": 1, "tiles": [3], "text_tokens": -4}\n')
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"llm": {"layers": 2}, "data": {"samples": "bad.jsonl",
                                                              "packing": {"max_tiles": 8, "max_tokens": 64}}}))
    code, out, err = _cli(capsys, "eval", "1f1b(p=2, m=4)", "-w", str(bad), "--batches", "1")
    assert (code, err) == (2, f"error: {bad}: {data}:1: text_tokens: expected a whole number from 0 to 1048576, "
                              f"got -4\n")


def test_an_analytic_workload_s_step_time_is_the_cluster_model_s_for_each_batch():
    from mpipe_core.simulation.step_figures import step_figures

    wl = parse_workload({"model": "llama2-7b", "device": "a100", "data": "internvl",
                         "encoders": [{"name": "vision", "vit": "vit-l-0.3b"}]})
    result = evaluate_stream("1f1b(p=2, m=2)", wl, 2)
    planner = Planner(parse("1f1b(p=2, m=2)"), wl)
    for b, batch in zip(result.batches, drawn_batches(wl, 2, 2)):
        costs = microbatch_workload(wl, batch.of(0))
        expected = step_figures(planner.static, costs, simulate(planner.static, costs)).step_time_s
        assert b.step_time_s == expected and result.as_dict()["batches"][b.index]["step_time_s"] == expected
        assert expected > b.makespan / 1000 * 0.99  # the step holds the pipeline's makespan (ms) at least


def _with_memory(memory=None):
    """The random-data workload with activations (and a device capacity)."""
    doc = {"llm": {"layers": 8, "f": 1.0, "b": 1.0, "w": 1.0, "activation": 1.0},
           "encoders": [{"name": "vision", "f": 0.6, "b": 0.6, "w": 0.6, "trainable": True, "activation": 0.5,
                         "output_bytes": 1.0, "input_bytes": 2.0, "param_bytes": 4.0}],
           "link": {"latency": 0.05, "bandwidth": 20.0},
           "data": {"samples": {"images": {"weights": [1, 2, 1]}, "tiles": {"uniform": [1, 12]},
                                "text_tokens": {"lognormal": [2.5, 1.0], "max": 60}},
                    "tokens": {"per_tile": 4}, "packing": {"max_tiles": 12, "max_tokens": 64, "buffer": 4}}}
    if memory is not None:
        doc["device"] = {"memory": memory}
    return parse_workload(doc)


def test_a_faster_plan_over_the_devices_memory_is_passed_over():
    from mpipe_core.simulation.metrics import peak_fits

    term = parse("transpose(1f1b(p=4, m=8), mode=dynamic)")
    free = _with_memory()
    batch = drawn_batches(free, 8, 1)[0].of(0)
    planner = Planner(term, free)
    costs = microbatch_workload(free, batch)
    fastest = planner.plan(costs, budget_ms=1e9, packs=batch)
    static_peak = peak_fits(planner.static, costs, simulate(planner.static, costs))[0]
    fastest_peak = peak_fits(fastest.schedule, fastest.workload, fastest.timeline)[0]
    # Re-composed over the encoder shares, the batch runs faster but peaks higher (23 against 21.06).
    assert fastest.peak_memory is None and fastest.how == "regrouped, over the encoder shares"
    assert fastest.makespan < fastest.static_makespan and fastest_peak > static_peak
    cap = (static_peak + fastest_peak) / 2
    tight = _with_memory(cap)
    plan = Planner(term, tight).plan(microbatch_workload(tight, batch), budget_ms=1e9, packs=batch)
    assert plan.static_makespan == fastest.static_makespan
    assert fastest.makespan < plan.makespan < plan.static_makespan
    assert plan.how == "light first (2 faster over memory)"
    assert plan.peak_memory <= cap
    assert plan.peak_memory == peak_fits(plan.schedule, plan.workload, simulate(plan.schedule, plan.workload))[0]
    # Where the static plan (the user's) is over the device's memory already, a faster plan
    # may be too, but needs no more than it: the regrouped one (23) still does not.
    low = _with_memory(static_peak * 0.5)
    over = Planner(term, low).plan(microbatch_workload(low, batch), budget_ms=1e9, packs=batch)
    assert over.how == "light first (2 faster over memory)" and over.makespan == plan.makespan
    assert static_peak * 0.5 < over.peak_memory <= static_peak



def test_a_re_placement_out_of_time_stops_with_a_complete_schedule():
    from mpipe_core.algebra.combinators.transpose import replace_encoders

    wl = _with_memory()
    planner = Planner(parse("transpose(1f1b(p=4, m=8), mode=dynamic)"), wl)
    costs = microbatch_workload(wl, drawn_batches(wl, 8, 1)[0].of(0))
    asked = []

    def stop() -> bool:  # out of time after two simulations
        asked.append(1)
        return len(asked) > 2

    placed = replace_encoders(planner.static, costs, 8, stop=stop)
    assert len(asked) == 3
    simulate(placed, costs)  # complete and valid (raises otherwise)
    encoder_ops = sorted(op for order in placed.orders for op in order if op.module == "vision")
    assert encoder_ops == sorted(op for order in planner.static.orders for op in order if op.module == "vision")
    # what was not placed by then runs inline on chunk 0's device
    full = replace_encoders(planner.static, costs, 8)
    first = planner.static.orders.index(next(o for o in planner.static.orders if any(
        op.module == "llm" and op.kind == "F" and op.chunk == 0 for op in o)))
    on_first = lambda s: sum(op.module == "vision" for op in s.orders[first])  # noqa: E731
    assert on_first(placed) > on_first(full)


def test_a_plan_built_from_the_best_so_far_names_only_what_it_keeps_of_it():
    from mpipe_core.search.per_batch import _composition

    assert _composition("static") == ""
    assert _composition("heavy first") == ", heavy first"
    assert _composition("regrouped, over the encoder shares") == ", regrouped, over the encoder shares"
    # a re-placement or another group size is not what the next step keeps: only the microbatches
    assert _composition("re-placed (balanced), regrouped, heavy first") == ", regrouped, heavy first"
    assert _composition("re-placed (earliest arrival, 8 shards), light first") == ", light first"
    assert _composition("re-placed (balanced)") == ""
    assert _composition("encoder_batch k=2, light first") == ", light first"
    assert _composition("encoder_batch k=8") == ""
