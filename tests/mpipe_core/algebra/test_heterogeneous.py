"""colocated, encoder_batch and disaggregate: closed forms, brute force, an
independent list-scheduling oracle, dependencies read off the timeline, and
bad input."""
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpipe_core.algebra.combinators.colocated import shares
from mpipe_core.algebra.combinators.common import group_encoder_work
from mpipe_core.api import evaluate
from mpipe_core.compare import compare
from mpipe_core.errors import TermError
from mpipe_core.ir.ops import ALLREDUCE, BW, GATHER, LLM, SCATTER, B, F, W
from mpipe_core.workloads.units import human, percent
from mpipe_core.workloads.workload import parse_workload

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def workload(trainable=False, f=3.0, b=2.0, w=1.0, llm=(1.0, 1.0, 1.0), layers=8, link=None, dispatch=0.0,
             images=None, param_bytes=0.0, output_bytes=0.0, activation=1.0):
    enc = {"name": "vision", "f": f, "b": b, "w": w, "trainable": trainable, "param_bytes": param_bytes,
           "output_bytes": output_bytes, "activation": activation}
    if images:
        enc["images"] = images
    doc = {"llm": {"layers": layers, "f": llm[0], "b": llm[1], "w": llm[2]}, "encoders": [enc],
           "link": link or {"latency": 0.0, "bandwidth": None}, "host": {"dispatch": dispatch}}
    return parse_workload(doc)


def text_only(wl):
    from dataclasses import replace

    return replace(wl, encoders=())


def times(ev):
    return {op: (s, e, d) for op, d, s, e in ev.timeline.rows()}


# ------------------------------------------------------------------ colocated

# (p, M, encoder f, b, w, LLM f, b, w): costs in halves so every sum is exact.
CLOSED_FORM_CASES = [(4, 8, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0), (2, 4, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0),
                     (4, 4, 5.5, 1.5, 0.5, 0.5, 1.0, 0.5), (2, 8, 0.5, 0.5, 0.5, 2.0, 1.5, 1.0),
                     (8, 16, 2.0, 2.0, 2.0, 1.0, 2.0, 1.0), (1, 3, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0)]


@pytest.mark.parametrize("p, m, ef, eb, ew, lf, lb, lw", CLOSED_FORM_CASES)
def test_colocated_meets_megatron_mimo_closed_form(p, m, ef, eb, ew, lf, lb, lw):
    """Frozen, zero link costs, p | M, body 1f1b: T = (M/p) f_enc + T(1f1b, text only);
    trainable with free collectives: + (M/p)(b_enc + w_enc)."""
    body = f"1f1b(p={p}, m={m})"
    frozen = workload(False, ef, eb, ew, (lf, lb, lw))
    trainable = workload(True, ef, eb, ew, (lf, lb, lw))
    text = evaluate(body, text_only(frozen)).timeline.makespan
    assert evaluate(f"colocated({body})", frozen).timeline.makespan == (m // p) * ef + text
    assert evaluate(f"colocated({body})", trainable).timeline.makespan == (m // p) * ef + text + (m // p) * (eb + ew)


def test_closed_form_values_by_hand():
    # 1f1b(p=4, m=8), F=1 and BW=2 per chunk: (8 + 3) * 3 = 33; share 2 encoder forwards of 3, backwards of 3.
    assert evaluate("1f1b(p=4, m=8)", text_only(workload(layers=4))).timeline.makespan == 33.0
    assert evaluate("colocated(1f1b(p=4, m=8))", workload(layers=4)).timeline.makespan == 39.0
    assert evaluate("colocated(1f1b(p=4, m=8))", workload(True, layers=4)).timeline.makespan == 45.0


def test_colocated_phases_are_barriers_on_every_device():
    wl = workload(True, link={"latency": 0.25, "bandwidth": 4.0}, output_bytes=2.0, param_bytes=8.0,
                  images={"min": 1, "max": 3, "seed": 1})
    ev = evaluate("colocated(zb_h1(p=4, m=8))", wl)
    t = times(ev)
    forwards_done = max(e + (0.0 if d == 0 else 0.25 + 2.0 * 1 / 4.0)
                        for op, (s, e, d) in t.items() if op.module == "vision" and op.kind == F)
    llm_start = min(s for op, (s, e, d) in t.items() if op.module == LLM)
    assert llm_start >= forwards_done - 1e-9  # phase 2 waits for every share's features at stage 0
    chunk0_done = max(e for op, (s, e, d) in t.items() if op.module == LLM and op.chunk == 0 and op.kind in (B, BW))
    enc_back = [s for op, (s, e, d) in t.items() if op.module == "vision" and op.kind in (B, BW)]
    assert min(enc_back) >= chunk0_done - 1e-9  # phase 3 waits for every input gradient
    # One barrier of each kind per device, the all-reduce over all 4 devices.
    kinds = [[op.kind for op in order if op.module == "vision"] for order in ev.schedule.orders]
    assert all(k.count(GATHER) == 1 and k.count(SCATTER) == 1 and k[-1] == ALLREDUCE for k in kinds)
    ar = next(e - s for op, (s, e, d) in t.items() if op.kind == ALLREDUCE)
    assert ar == pytest.approx(2 * 3 * (0.25 + 8.0 / 4 / 4.0))


def brute_force_best_share(work, parts):
    """The least largest-share work over every split into `parts` non-empty contiguous slices."""
    n = len(work)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(work[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@SETTINGS
@given(st.integers(1, 5), st.integers(1, 9), st.integers(0, 50), st.sampled_from([1, 2, 3]), st.booleans())
def test_colocated_shares_are_the_best_contiguous_split(p, m, seed, k, trainable):
    wl = workload(trainable, images={"min": 1, "max": 5, "seed": seed})
    ev = evaluate(f"encoder_batch(colocated(gpipe(p={p}, m={m})), {min(k, m)})", wl)
    pipe = ev.schedule.pipelines[0]
    by_group = group_encoder_work(pipe, wl, backward=True)
    work = list(by_group.values())
    got = shares(pipe, wl, p)
    assert [g for share in got for g in share] == [g for g, _ in pipe.groups()]  # contiguous, in order
    largest = max(sum(by_group[g] for g in share) for share in got)
    if len(work) >= p:
        assert largest == pytest.approx(brute_force_best_share(work, p))
        assert all(share for share in got)
    # The schedule puts share i on the i-th device (chunk 0's device first).
    placed = [[op.mb for op in order if op.module == "vision" and op.kind == F] for order in ev.schedule.orders]
    assert placed == got


def test_colocated_equal_costs_give_m_over_p_each():
    wl = workload()
    pipe = evaluate("colocated(1f1b(p=4, m=12))", wl).schedule.pipelines[0]
    assert [len(s) for s in shares(pipe, wl, 4)] == [3, 3, 3, 3]


# ------------------------------------------------------------------ encoder_batch

PLACEMENTS = ["1f1b(p=3, m=6)", "split_bw(zb_h1(p=2, m=4))", "colocated(1f1b(p=3, m=6))",
              "transpose(1f1b(p=3, m=6))", "transpose(1f1b(p=3, m=6), overflow=min, backward=owner)",
              "transpose(zbv(p=2, m=4), mode=dynamic)", "transpose(1f1b(p=2, m=6), mode=dynamic, shards=2)",
              "disaggregate(1f1b(p=2, m=5), encoder_devices=2)", "encoder_stage(gpipe(p=2, m=4))"]


@pytest.mark.parametrize("term", PLACEMENTS)
@pytest.mark.parametrize("trainable", [False, True])
def test_encoder_batch_of_one_evaluates_exactly_like_its_term(term, trainable):
    wl = workload(trainable, link={"latency": 0.1, "bandwidth": 2.0}, output_bytes=1.0, dispatch=0.25,
                  images={"min": 1, "max": 3, "seed": 4})
    plain, grouped = evaluate(term, wl), evaluate(f"encoder_batch({term}, 1)", wl)
    assert grouped.schedule == plain.schedule
    assert (grouped.timeline.start, grouped.timeline.end) == (plain.timeline.start, plain.timeline.end)
    assert grouped.metrics.as_dict() == plain.metrics.as_dict()


@pytest.mark.parametrize("m, k", [(6, 2), (7, 3), (5, 5), (4, 1)])
def test_encoder_batch_on_one_device_is_the_sum_of_its_ops_costs(m, k):
    """One device, no transfers: T = every op's cost.  A group costs its
    microbatches' costs less (k - 1) x dispatch; the last may hold fewer."""
    f, b, w, dispatch = [2.0, 1.5, 3.0, 2.5, 1.0, 4.0, 2.0][:m], 1.0, 0.75, 0.5
    wl = parse_workload({"llm": {"layers": 2, "f": 1.0, "b": 1.0, "w": 1.0},
                         "encoders": [{"name": "vision", "f": f, "b": b, "w": w, "trainable": True}],
                         "host": {"dispatch": dispatch}})
    ev = evaluate(f"encoder_batch(1f1b(p=1, m={m}), {k})", wl)
    groups = [list(range(g, min(g + k, m))) for g in range(0, m, k)]
    encoder = sum(sum(f[i] for i in g) - (len(g) - 1) * dispatch for g in groups) \
        + sum(len(g) * (b + w) - (len(g) - 1) * dispatch for g in groups)  # fused BW: one op per group
    llm = m * 2 * (1.0 + 1.0 + 1.0)  # 2 layers on the one chunk, F + BW
    assert ev.timeline.makespan == pytest.approx(encoder + llm)
    assert ev.timeline.makespan == pytest.approx(sum(e - s for _, _, s, e in ev.timeline.rows()))
    assert sum(1 for op in ev.schedule.ops() if op.module == "vision" and op.kind == F) == len(groups)


def test_encoder_batch_dependencies_and_memory():
    wl = workload(True, link={"latency": 0.5, "bandwidth": 1.0}, output_bytes=1.0, activation=2.0)
    ev = evaluate("encoder_batch(transpose(1f1b(p=4, m=8), backward=owner), 4)", wl)
    t = times(ev)
    pipe = ev.schedule.pipelines[0]
    for op, (s, e, d) in t.items():
        if op.module == LLM and op.kind == F and op.chunk == 0:
            group_op = t[op._replace(module="vision", mb=pipe.group_of(op.mb))]
            arrival = group_op[1] + (0.0 if group_op[2] == d else 0.5 + 4 * 1.0)  # the group's features at once
            assert s >= arrival - 1e-9
        if op.module == "vision" and op.kind == BW:
            for m in range(op.mb, op.mb + 4):
                grad = t[(LLM, BW, 0, m, 0)]
                assert s >= grad[1] + (0.0 if grad[2] == d else 0.5 + 1.0) - 1e-9  # each microbatch's gradient
    # Two groups of 4, each with 4 microbatches' activations (2 each) on its device.
    frozen = workload(False, activation=2.0)
    fused = evaluate("encoder_batch(1f1b(p=2, m=4), 2)", frozen)
    assert max(fused.metrics.peak_memory) >= 2 * 2.0
    # The group's features (2 x 2) stay live until its last microbatch's F(0, 1)
    # has run: chunk 0 (4 layers of 1) holds 4 per forward beside them.
    series = fused.memory_over_time[0]

    def level(at):
        return [v for when, v in series if when <= at][-1]

    t0 = times(fused)
    first, second = t0[(LLM, F, 0, 0, 0)], t0[(LLM, F, 0, 1, 0)]
    assert t0[("vision", F, 0, 0, 0)][1] <= first[0]  # the group's forward ended before either
    assert level(first[1]) == 4 + 4 + 4 and level(second[1]) == 4 + 4


@pytest.mark.parametrize("term, message", [
    ("encoder_batch(1f1b(p=2, m=4), 0)", "1:31: encoder_batch: argument 'k' must be >= 1, got 0"),
    ("encoder_batch(1f1b(p=2, m=4), 5)",
     "1:31: encoder_batch: k=5 is more than the 4 microbatches of a step (a group holds at most all of them)"),
    ("encoder_batch(encoder_batch(1f1b(p=2, m=4), 2), 2)",
     "1:15: encoder_batch: encoder_batch inside encoder_batch (k=2 inside k=2): write one"),
    ("encoder_batch(balanced(1f1b(p=2, m=4)), 2)",
     "1:1: encoder_batch: balanced(...) already folded the encoders into the LLM chunks: there are no encoder ops "
     "to group"),
    ("transpose(disaggregate(1f1b(p=2, m=4), encoder_devices=1))",
     "1:1: transpose: disaggregate(...) already put the encoders on devices of their own (apply "
     "transpose to its inner term instead)"),
    ("colocated(par(1f1b(p=2, m=4), 1f1b(p=2, m=4)))",
     "1:1: colocated: colocated works on a single pipeline (not par/overlay)"),
    ("disaggregate(encoder_stage(1f1b(p=2, m=4)), encoder_devices=1)",
     "1:1: disaggregate: disaggregate needs LLM work on every device of its input (the input has a device of "
     "encoders only, as encoder_stage makes)"),
])
def test_bad_terms_are_refused_with_where_and_why(term, message):
    with pytest.raises(TermError) as error:
        evaluate(term, workload())
    assert str(error.value) == message


@pytest.mark.parametrize("term", ["disaggregate(1f1b(p=2, m=4), encoder_devices=1)", "colocated(1f1b(p=2, m=4))",
                                  "encoder_batch(1f1b(p=2, m=4), 2)"])
def test_strategies_refuse_a_text_only_workload(term):
    with pytest.raises(TermError) as error:
        evaluate(term, {"llm": {"layers": 4}})
    assert error.value.message.endswith("needs a workload with encoders (this one has none)")


# ------------------------------------------------------------------ disaggregate

def list_scheduling_oracle(costs, devices):
    """Written apart from the combinator: each unit in order to the device whose
    total so far is least, the lowest-numbered one on ties."""
    load = [0.0] * devices
    owner = []
    for c in costs:
        j = min(range(devices), key=lambda i: (load[i], i))
        owner.append(j)
        load[j] += c
    return owner


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 12), st.integers(0, 99), st.integers(1, 4),
       st.booleans())
def test_disaggregate_assignment_equals_list_scheduling(p, k_devices, m, seed, k, trainable):
    k = min(k, m)
    wl = workload(trainable, f={"uniform": [0.5, 4.0], "seed": seed}, dispatch=0.1,
                  images={"min": 1, "max": 4, "seed": seed})
    ev = evaluate(f"encoder_batch(disaggregate(gpipe(p={p}, m={m}), encoder_devices={k_devices}), {k})", wl)
    per_mb = wl.encoders[0].costs("F", m)
    groups = [list(range(g, min(g + k, m))) for g in range(0, m, k)]
    costs = [sum(per_mb[i] for i in g) - (len(g) - 1) * min(0.1, *(per_mb[i] for i in g)) for g in groups]
    expected = list_scheduling_oracle(costs, k_devices)
    placement = ev.schedule.placement()
    got = [placement[("vision", F, 0, g[0], 0)] - p for g in groups]
    assert got == expected
    # Encoder work only on the k extra devices, the LLM's orders as the input's.
    for d, order in enumerate(ev.schedule.orders):
        assert all((op.module == LLM) == (d < p) for op in order)
    body = evaluate(f"gpipe(p={p}, m={m})", text_only(wl)).schedule.orders
    assert ev.schedule.orders[:p] == body
    if trainable:  # backward on the forward's device
        for op in ev.schedule.ops():
            if op.module == "vision" and op.kind in (B, W, BW):
                assert placement[op] == placement[op._replace(kind=F)]


def test_disaggregate_counts_every_device_and_all_reduces_over_the_encoder_devices():
    wl = workload(True, link={"latency": 0.25, "bandwidth": 4.0}, param_bytes=8.0, output_bytes=1.0)
    ev = evaluate("disaggregate(1f1b(p=4, m=8), encoder_devices=2)", wl)
    s = ev.summary()
    assert s["devices"] == 6 and len(s["idle"]) == len(s["peak_memory"]) == 6
    assert s["bubble_ratio"] == pytest.approx(sum(s["idle"]) / (6 * s["makespan"]))
    ars = [(op, e - st_) for op, d, st_, e in ev.timeline.rows() if op.kind == ALLREDUCE]
    assert [op.chunk for op, _ in ars] == [4, 5]
    assert all(dur == pytest.approx(2 * 1 * (0.25 + 8.0 / 2 / 4.0)) for _, dur in ars)  # a ring of 2, not 6
    encoder_work = 8 * (3.0 + 2.0 + 1.0)
    assert ev.metrics.lower_bound >= encoder_work / 2  # only the 2 encoder devices can do it
    assert ev.metrics.lower_bound <= ev.timeline.makespan
    # Features reach stage 0 over the link before its forward.
    t = times(ev)
    for m in range(8):
        enc = t[("vision", F, 0, m, 0)]
        assert t[(LLM, F, 0, m, 0)][0] >= enc[1] + 0.25 + 1.0 / 4.0 - 1e-9


def test_disaggregate_with_one_encoder_device_has_no_all_reduce():
    ev = evaluate("disaggregate(1f1b(p=2, m=4), encoder_devices=1)", workload(True))
    assert not any(op.kind == ALLREDUCE for op in ev.schedule.ops())
    assert [op.kind for op in ev.schedule.orders[2]] == [F] * 4 + [BW] * 4


def test_the_gantt_rows_are_the_devices_encoder_devices_included():
    from mpipe_core.formats.ascii_gantt import render

    text = render(evaluate("disaggregate(1f1b(p=2, m=4), encoder_devices=2)", workload(True)).timeline)
    rows = [line for line in text.splitlines() if line.startswith("dev")]
    assert len(rows) == 4 and set(rows[2].split("|")[1]) <= {"e", "d", "."} and "F" in rows[0]


def test_disaggregated_terms_print_canonically():
    ev = evaluate("encoder_batch(disaggregate(1f1b(m=4, p=2), 1), k=2)", workload())
    assert ev.term == "encoder_batch(disaggregate(1f1b(p=2, m=4), encoder_devices=1), k=2)"
    assert json.loads(json.dumps(ev.summary()))["devices"] == 3


# ------------------------------------------------------------------ mpipe compare's explanation

def test_compare_explains_colocated_phase_by_phase():
    wl = workload(True, layers=4)  # the closed-form case: phases of 6, 33 and 6
    rows = compare(["1f1b(p=4, m=8)", "colocated(1f1b(p=4, m=8))"], wl)
    costs = rows[1].layout
    fused = evaluate("1f1b(p=4, m=8)", wl).timeline.makespan
    assert (costs.layout, costs.baseline, costs.baseline_makespan, costs.makespan) == \
        ("colocated", "1f1b(p=4, m=8)", fused, 45.0)
    text = costs.verdict()
    assert text.startswith(f"colocated saves {percent((fused - 45) / fused)} ({human(fused - 45)} of {human(fused)}) "
                           f"against 1f1b(p=4, m=8): phase 1 (encoder forwards, then the gather) took 6: the longest "
                           f"share, device 0's, took 6; the gather closed at 6 on the first stage's device, and no LLM "
                           f"op started before it; phase 2 (the LLM) took 33; phase 3 waited for chunk 0's last input "
                           f"gradient at 39, then took 6: device 0's share of encoder backward 6 and the all-reduce 0; "
                           f"6 + 33 + 6 = 45")
    for d in costs.devices:  # what each device added, and its idle time, make up the makespan
        assert sum(d.busy.values()) + d.idle == pytest.approx(45.0)
        assert d.busy["encoder forward"] == 6.0 and d.busy["encoder backward"] == 6.0
    assert rows[1].as_dict()["layout"]["verdict"] == text
    assert rows[0].layout is None and rows[1].transpose is None


def test_compare_explains_what_a_disaggregated_layout_waited_for():
    wl = workload(False, link={"latency": 0.5, "bandwidth": None})
    rows = compare(["1f1b(p=2, m=4)", "encoder_batch(disaggregate(1f1b(p=2, m=4), encoder_devices=1), 2)"], wl)
    costs = rows[1].layout
    ev = rows[1].evaluation
    assert costs.layout == "disaggregate" and costs.baseline == "1f1b(p=2, m=4)"
    assert [d.role for d in costs.devices] == ["LLM", "LLM", "encoder"]
    # The waits, read off the timeline here independently: each F(0, m) on device 0 that
    # started after the previous op there ended waited for its features.
    rows0 = [(op, s, e) for op, d, s, e in ev.timeline.rows() if d == 0]
    waited = sum(s - prev for (_, _, prev), (op, s, _) in zip([(None, 0.0, 0.0)] + rows0[:-1], rows0)
                 if op.kind == F and op.chunk == 0 and s > prev)
    text = costs.verdict()
    assert " on 3 devices instead of 2: " in text
    assert f"the first stage's forwards waited {human(waited)} in all for features" in text
    encoder = costs.devices[2]
    assert encoder.busy["encoder forward"] == 2 * (2 * 3.0) and encoder.idle == pytest.approx(ev.timeline.makespan - 12)
    lines = costs.device_lines()
    assert lines[2] == f"device 2 (encoder): encoder forward 12; idle {human(ev.timeline.makespan - 12)}"


def test_mpipe_compare_prints_the_layout_explanations():
    import contextlib
    import io

    from mpipe_cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["compare", "1f1b(p=4, m=4)", "colocated(1f1b(p=4, m=4))",
                     "disaggregate(1f1b(p=3, m=4), encoder_devices=1)", "-w", "vit-heavy-small"])
    assert code == 0
    text = out.getvalue()
    assert "\ncolocated(1f1b(p=4, m=4)):\n  colocated " in text and "phase 1 (encoder forwards" in text
    assert "\ndisaggregate(1f1b(p=3, m=4), encoder_devices=1):\n  disaggregate " in text
    assert "    device 3 (encoder): encoder forward " in text


def test_a_group_is_held_until_its_own_steps_forwards_consumed_it():
    frozen = workload(False, activation=2.0)
    one = evaluate("encoder_batch(1f1b(p=2, m=4), 2)", frozen)
    two = evaluate("repeat(encoder_batch(1f1b(p=2, m=4), 2), 2)", frozen)
    # Step 1 repeats step 0 after the barrier: the same peaks, nothing held across the update.
    assert two.metrics.peak_memory == one.metrics.peak_memory
    # Between the steps device 0 holds nothing (frees come before allocations at one instant).
    assert (one.timeline.makespan, 0.0) in two.memory_over_time[0]
