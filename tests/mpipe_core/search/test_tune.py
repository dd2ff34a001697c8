"""mpipe tune: the JSON contract, reproduction with mpipe eval, memory caps,
the exact placement against brute force, and bad input."""
import contextlib
import io
import json

import pytest

from benchmarks.mllm_suite import TUNER_CASES as CASES
from mpipe_cli.main import main
from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError, ScheduleError
from mpipe_core.ir.ops import ALLREDUCE, BCAST, BW, LLM, F, Op
from mpipe_core.search.exact import solve
from mpipe_core.search.tune import Candidate, tune
from mpipe_core.simulation.simulator import simulate
from mpipe_core.workloads.workload import parse_workload


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tuned():
    code, out, err = cli("tune", "-w", "vit-heavy-small", "-p", "4", "-m", "4", "--json", "--top", "5")
    assert code == 0 and "tune: [1]" in err  # progress goes to stderr
    return json.loads(out)


def test_tune_json_is_the_contract(tuned):
    assert set(tuned) == {"lower_bound", "baselines", "candidates", "best", "optimal", "memory_cap", "capacity"}
    # vit-heavy-small states no device memory: no cap, and whether anything fits is unknown
    assert tuned["memory_cap"] is None and tuned["capacity"] is None
    assert set(tuned["baselines"]) == {"fused", "balanced", "colocated", "disaggregated", "transpose"}
    for base in tuned["baselines"].values():
        assert set(base) == {"term", "makespan", "peak_memory", "static_memory", "fits"}
    assert tuned["baselines"]["colocated"]["term"].startswith(("colocated(", "encoder_batch(colocated("))
    assert "disaggregate(" in tuned["baselines"]["disaggregated"]["term"]
    assert "transpose(" in tuned["baselines"]["transpose"]["term"]
    keys = {"term", "makespan", "peak_memory", "efficiency", "pareto", "static_memory", "fits"}
    assert all(set(c) == keys for c in tuned["candidates"]) and set(tuned["best"]) == keys
    assert all(c["fits"] is None and c["static_memory"] == 0 for c in tuned["candidates"])
    spans = [c["makespan"] for c in tuned["candidates"]]
    assert spans == sorted(spans) and tuned["best"] == tuned["candidates"][0]
    assert tuned["optimal"] is None
    assert tuned["best"]["makespan"] <= min(b["makespan"] for b in tuned["baselines"].values())
    for c in tuned["candidates"]:
        assert c["efficiency"] == pytest.approx(tuned["lower_bound"] / c["makespan"]) and c["efficiency"] <= 1
    # The front: no candidate is beaten on both makespan and memory by another.
    front = [c for c in tuned["candidates"] if c["pareto"]]
    for c in front:
        assert not any(o["makespan"] < c["makespan"] and o["peak_memory"] < c["peak_memory"]
                       for o in tuned["candidates"])


def test_every_candidate_reproduces_with_mpipe_eval(tuned):
    rows = tuned["candidates"] + [dict(b, efficiency=None) for b in tuned["baselines"].values() if b]
    for c in rows:
        code, out, _ = cli("eval", c["term"], "-w", "vit-heavy-small", "--json")
        assert code == 0
        ev = json.loads(out)
        assert ev["makespan"] == c["makespan"] and max(ev["peak_memory"]) == c["peak_memory"], c["term"]


def test_memory_cap_keeps_every_candidate_under_it():
    free = tune("internvl-26b", 4, 8, time_limit=5)
    cap = sorted(c.peak_memory for c in free.candidates)[len(free.candidates) // 3]
    capped = tune("internvl-26b", 4, 8, memory_cap=cap, time_limit=5)
    assert capped.candidates and all(c.peak_memory <= cap for c in capped.candidates)
    assert capped.best.makespan >= free.best.makespan


def test_an_impossible_memory_cap_is_one_line_and_exit_2():
    # Below one layer's activations: refused before searching, one line.
    code, out, err = cli("tune", "-w", "vit-heavy-small", "-p", "2", "-m", "2", "--memory-cap", "0.5")
    assert code == 2 and out == ""
    assert err == ("error: --memory-cap 0.5 is impossible: every schedule holds at least one LLM layer's "
                   "activations (1) on a device\n")
    # Above that but below every candidate: known once the search is done (after its progress lines).
    code, out, err = cli("tune", "-w", "vit-heavy-small", "-p", "2", "-m", "2", "--memory-cap", "1.5")
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == ("error: --memory-cap 1.5 is impossible: the least memory any candidate "
                                    "needs is 8 (transpose(zb_h1(p=2, m=2), mode=dynamic, shards=4))")
    assert all(line.startswith("tune: ") for line in err.splitlines()[:-1])


def test_exact_on_a_huge_instance_is_refused_before_searching():
    code, out, err = cli("tune", "-w", "internvl-26b", "-p", "16", "-m", "64", "--exact")
    assert code == 2 and out == "" and err == ("error: --exact handles instances of up to 600 ops; P=16, M=64 has "
                                               "up to 6,912 (use fewer --devices or --microbatches)\n")


@pytest.mark.parametrize("argv, message", [
    (("-p", "0", "-m", "4"), "error: --devices and --microbatches must be >= 1 (got 0, 4)\n"),
    (("-p", "2", "-m", "4", "--top", "0"), "error: --top must be >= 1 (got 0)\n"),
    (("-p", "4", "-m", "4", "--encoder-devices", "1,4"),
     "error: --encoder-devices 4 leaves no device for the LLM: it must be less than --devices (4)\n"),
])
def test_bad_tune_arguments(argv, message):
    code, out, err = cli("tune", "-w", "vit-heavy-small", *argv)
    assert code == 2 and err == message


# Every generator tune's baselines are drawn from, written out here (not read from the search).
GENERATORS = ("1f1b(p={p}, m={m})", "gpipe(p={p}, m={m})", "interleaved(p={p}, m={m}, v=2)",
              "interleaved(p={p}, m={m}, v=4)", "looped_bfs(p={p}, m={m}, v=2)", "zb_h1(p={p}, m={m})",
              "zb_h2(p={p}, m={m})", "zbv(p={p}, m={m})", "dualpipev(p={p}, m={m})")


def _fastest(terms: list[str], workload) -> tuple[float, list[str]]:
    """(the least makespan of those of `terms` that evaluate, the terms that reach it)."""
    spans = {}
    for term in terms:
        try:
            spans[term] = evaluate(term, workload).timeline.makespan
        except MpipeError:
            continue  # a size this generator refuses
    best = min(spans.values())
    return best, [t for t, v in spans.items() if v == best]


@pytest.mark.parametrize("label, workload, p, m", [(c[0], c[1], c[2], c[3]) for c in CASES])
def test_the_baselines_are_the_fastest_plain_and_balanced_generators_on_every_suite_case(label, workload, p, m):
    result = tune(workload, p, m, time_limit=3)
    plain = [g.format(p=p, m=m) for g in GENERATORS]
    fastest, terms = _fastest(plain, workload)
    assert result.fused.makespan == fastest and result.fused.term in terms
    fastest, terms = _fastest([f"balanced({t})" for t in plain], workload)
    assert result.balanced.makespan == fastest and result.balanced.term in terms
    # each baseline is among what the search evaluated, with the figures eval gives it
    evaluated = {c.term: c for c in result.candidates + result.over_cap}
    for base in (result.fused, result.balanced, result.colocated, result.transpose, result.disaggregated):
        assert base.term in evaluated and evaluated[base.term].makespan == base.makespan
    assert result.best.makespan >= result.lower_bound - 1e-9


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_tune_finds_the_optimum_on_the_uniform_workload(p, m):
    # F = B = W = 1 per chunk: the last device holds 3m units of work and can start only once the
    # first microbatch's forward has crossed the p - 1 devices before it, so no schedule beats
    # 3m + p - 1, which ZB-H1 reaches (13 at 2 x 4, 27 at 4 x 8).
    result = tune(None, p, m, time_limit=10)
    assert result.best.makespan == 3 * m + p - 1 == evaluate(f"zb_h1(p={p}, m={m})").timeline.makespan


def test_tune_counts_every_device_and_tries_each_layout_at_equal_device_count():
    result = tune("internvl-26b", 8, 16, time_limit=600)
    terms = [c.term for c in result.candidates]
    assert result.not_tried == 0
    # colocated on all 8, encoder_batch k = 2, 4, 8, disaggregate on 8 - k LLM devices + k encoder devices
    assert any(t.startswith("colocated(") for t in terms)
    assert {t.split("k=")[-1] for t in terms if t.startswith("encoder_batch(")} == {"2)", "4)", "8)"}
    disaggregated = [t for t in terms if t.startswith("disaggregate(")]
    assert disaggregated and all(f"(p={8 - int(t.split('encoder_devices=')[1][:-1])}," in t for t in disaggregated)
    for c in result.candidates:
        ev = evaluate(c.term, "internvl-26b")
        assert ev.schedule.devices == 8 and ev.timeline.makespan == c.makespan, c.term
    best = {name: c for name, c in result.baselines().items()}
    assert best["colocated"].makespan == min(c.makespan for c in result.candidates if "colocated(" in c.term)
    assert result.best.makespan <= min(c.makespan for c in best.values())


def test_encoder_devices_restrict_what_disaggregate_tries():
    result = tune("vit-heavy-small", 4, 4, time_limit=60, encoder_devices=(2,))
    counts = {c.term.split("encoder_devices=")[1].split(")")[0] for c in result.candidates if "disaggregate(" in c.term}
    assert counts == {"2"}


def test_text_only_workloads_have_no_encoder_layout_baselines():
    code, out, err = cli("tune", "-w", "llama2-7b", "-p", "2", "-m", "4", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["baselines"]["colocated"] is None and doc["baselines"]["disaggregated"] is None
    code, out, _ = cli("tune", "-w", "llama2-7b", "-p", "2", "-m", "4")
    assert "colocated (Megatron MIMO)" not in out and out.splitlines()[4].startswith("fused ")


def test_the_text_output_names_every_baseline_with_its_speedup():
    code, out, _ = cli("tune", "-w", "vit-heavy-small", "-p", "4", "-m", "4")
    assert code == 0
    lines = out.splitlines()
    assert lines[1] == "no memory cap (device memory unknown)"
    names = [line[:26].strip() for line in lines[4:9]]
    assert names == ["fused", "balanced", "colocated (Megatron MIMO)", "disaggregated (best)", "transpose (best)"]
    fused = float(lines[4].split()[1])
    for line in lines[4:9]:
        makespan, speedup = float(line[26:].split()[0]), line[26:].split()[2]
        assert speedup == f"{fused / makespan:.2f}x"
    assert lines[-1].startswith("best: ") and "over colocated" in lines[-1] and "over disaggregated" in lines[-1]


# ------------------------------------------------------------------ the exact placement

TINY = {
    "llm": {"layers": 2, "f": 1.0, "b": 1.0, "w": 1.0},
    "encoders": [{"name": "vision", "f": 3.0, "b": 2.0, "w": 1.0, "output_bytes": 1.0, "param_bytes": 2.0}],
    "link": {"latency": 0.0, "bandwidth": 1.0},
}


def _workload(trainable: bool):
    doc = json.loads(json.dumps(TINY))
    doc["encoders"][0]["trainable"] = trainable
    return parse_workload(doc)


def brute_force(body: str, wl) -> float:
    """The best makespan over every placement of the encoder's ops: each
    microbatch's F (and, trainable, its BW on the same device) inserted at
    every position of every device's order; a broadcast first and an
    all-reduce last on every device once any encoder op leaves device 0."""
    base = evaluate(body, wl).schedule.llm_only()
    trainable = wl.encoders[0].trainable
    M, P = base.pipelines[0].microbatches, base.devices
    groups = [[Op("vision", F, 0, mb)] + ([Op("vision", BW, 0, mb)] if trainable else []) for mb in range(M)]
    best = float("inf")

    def place(orders, g):
        nonlocal best
        if g == len(groups):
            off = any(op.module != LLM for d in range(1, P) for op in orders[d])
            final = [list(o) for o in orders]
            if trainable and off:
                final = [[Op("vision", BCAST, d, -1)] + o + [Op("vision", ALLREDUCE, d, -1)]
                         for d, o in enumerate(final)]
            sched = base.with_orders(final, encoders=("vision",))
            try:
                best = min(best, simulate(sched, wl).makespan)
            except ScheduleError:
                pass  # this order deadlocks
            return
        for d in range(P):
            n = len(orders[d])
            spots = [(i, j) for i in range(n + 1) for j in range(i + 1, n + 2)] if trainable else \
                [(i, None) for i in range(n + 1)]
            for i, j in spots:
                new = list(orders[d])
                new.insert(i, groups[g][0])
                if j is not None:
                    new.insert(j, groups[g][1])
                place([new if dd == d else orders[dd] for dd in range(P)], g + 1)

    place([list(o) for o in base.orders], 0)
    return best


@pytest.mark.parametrize("body, trainable", [("1f1b(p=2, m=3)", False), ("gpipe(p=2, m=2)", True),
                                             ("1f1b(p=2, m=2)", True)])
def test_exact_placement_equals_brute_force_on_tiny_instances(body, trainable):
    wl = _workload(trainable)
    exact = solve(body, wl, time_limit=20)
    assert exact.proved
    assert exact.makespan == brute_force(body, wl)
    assert simulate(exact.schedule, wl).makespan == exact.makespan  # a real, valid schedule


@pytest.mark.parametrize("trainable", [False, True])
def test_exact_optimum_is_no_worse_than_any_heuristic_of_its_family(trainable):
    wl = _workload(trainable)
    wl = parse_workload(dict(json.loads(json.dumps(TINY)), llm={"layers": 8, "f": 1.0, "b": 1.0, "w": 1.0},
                             encoders=[dict(TINY["encoders"][0], trainable=trainable, f=5.0)]))
    body = "zbv(p=3, m=6)"
    exact = solve(body, wl, time_limit=30)
    owner = ", backward=owner" if trainable else ""
    heuristics = [body, f"transpose({body}{owner})", f"transpose({body}, overflow=min{owner})",
                  f"transpose({body}, mode=dynamic{owner})"]
    for term in heuristics:
        assert exact.makespan <= evaluate(term, wl).timeline.makespan + 1e-9, term
    assert 0.0 <= exact.gap < 1e-3 or not exact.proved


# ------------------------------------------------------------------ under the device's memory

def test_tune_defaults_the_cap_to_the_device_memory_and_finds_internvl_a_schedule_that_fits():
    # InternVL-26B on 64 Ascend 910C dies (64 GB), 8 pipeline devices x tensor parallel 8 with sequence
    # parallelism (flash attention is the default), 16 microbatches
    code, out, err = cli("tune", "-w", "internvl-26b", "--parallel", "tp=8,sp", "-p", "64", "-m", "16", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["memory_cap"] == 64.0 and doc["capacity"] == 64.0
    assert doc["candidates"] and all(c["fits"] is True and c["peak_memory"] <= 64 for c in doc["candidates"])
    code, out, _ = cli("eval", doc["best"]["term"], "-w", "internvl-26b", "--parallel", "tp=8,sp", "--json")
    ev = json.loads(out)
    assert ev["fits"] is True and max(ev["peak_memory"]) == doc["best"]["peak_memory"] <= 64
    assert ev["makespan"] == doc["best"]["makespan"] and max(ev["static_memory"]) == doc["best"]["static_memory"]
    # without a cap the search keeps what does not fit, and says so
    code, out, _ = cli("tune", "-w", "internvl-26b", "--parallel", "tp=8,sp", "-p", "64", "-m", "16", "--json",
                       "--memory-cap", "none", "--time-limit", "5")
    free = json.loads(out)
    assert free["memory_cap"] is None and free["capacity"] == 64.0
    assert any(c["fits"] is False for c in free["candidates"]) and free["best"]["makespan"] <= doc["best"]["makespan"]


# 8 layers that keep 1 each per microbatch, 0.1 under full recompute, on devices of memory 6.
ONLY_RECOMPUTE_FITS = {"llm": {"layers": 8, "activation": 1.0, "recompute": {"full": {"activation": 0.1}}},
                       "device": {"memory": 6}}


def test_tune_recomputes_the_fewest_chunks_that_make_a_fast_candidate_fit():
    result = tune(ONLY_RECOMPUTE_FITS, 4, 8, memory_cap=6, time_limit=20)
    best = result.best
    assert best.term.startswith("recompute(") and best.fits is True and best.peak_memory <= 6
    assert result.memory_cap == 6 and result.capacity == 6
    ev = evaluate(best.term, ONLY_RECOMPUTE_FITS)
    assert (ev.metrics.makespan, max(ev.metrics.peak_memory)) == (best.makespan, best.peak_memory)
    chunks = list(ev.ast.kw("chunks"))
    inner = str(ev.ast.kw("term"))
    assert max(evaluate(inner, ONLY_RECOMPUTE_FITS).metrics.peak_memory) > 6  # it needs the recompute
    for dropped in chunks:  # and every chunk it recomputes
        fewer = [c for c in chunks if c != dropped]
        assert max(evaluate(f"recompute({inner}, chunks={fewer})", ONLY_RECOMPUTE_FITS).metrics.peak_memory) > 6


def test_when_nothing_fits_the_device_tune_says_what_rules_out_each_family(tmp_path):
    # 8 layers of static memory 10 on 4 devices of memory 5: 2 layers (20) on every device whatever the schedule
    path = tmp_path / "heavy.json"
    path.write_text(json.dumps({"llm": {"layers": 8, "static": {"layer": 10}}, "device": {"memory": 5}}))
    code, out, err = cli("tune", "-w", str(path), "-p", "4", "-m", "8")
    lines = err.splitlines()
    assert code == 2 and out == ""
    assert lines[-3:] == [
        "tune: balanced: static memory alone is at least 20 on a device in every candidate, over the 5 cap "
        "(balanced(zbv(p=4, m=8)))",
        "tune: fused (plain generators): static memory alone is at least 20 on a device in every candidate, over "
        "the 5 cap (zbv(p=4, m=8))",
        "error: no schedule fits the device's 5 of memory: the least any candidate needs is 28 "
        "(balanced(zbv(p=4, m=8))); --memory-cap none searches without a cap"]
    assert all(line.startswith("tune: ") for line in lines[:-1])


def test_a_family_that_only_activations_rule_out_says_the_least_it_needs():
    # static memory (2 per device) fits; the activations (1 per layer and microbatch, no recompute figure) do not
    wl = {"llm": {"layers": 8, "static": {"layer": 1.0}}, "device": {"memory": 4}}
    said: list[str] = []
    with pytest.raises(MpipeError):
        tune(wl, 4, 8, memory_cap=4, time_limit=5, progress=said.append)
    reasons = [line for line in said if ": the least any of its candidates needs is " in line]
    assert reasons and all(line.endswith(", over the 4 cap (" + line.rsplit(" (", 1)[1]) for line in reasons)
    for line in reasons:  # each names its family's least-memory candidate, whose figure eval reproduces
        term = line.rsplit(" (", 1)[1][:-1]
        needs = float(line.split(" needs is ")[1].split(" ")[0])
        assert f"{max(evaluate(term, wl).metrics.peak_memory):.4g}" == f"{needs:.4g}" and needs > 4


def _vit_in(memory: float) -> dict:
    """vit-heavy-small on devices of `memory`: at 2 x 4 and 9, of its three fastest
    transposes (peaks 10, 8.5 and 8) two fit."""
    from mpipe_core.workloads.presets import preset_document

    return {**preset_document("vit-heavy-small"), "device": {"memory": memory}}


def test_tune_under_a_cap_keeps_the_candidates_it_left_out_and_how_far_over_they_are():
    wl = _vit_in(9)
    capped = tune(wl, 2, 4, memory_cap=9, time_limit=5)
    free = tune(wl, 2, 4, memory_cap=None, time_limit=5)
    assert capped.over_cap and all(c.peak_memory > 9 for c in capped.over_cap)
    assert all(c.peak_memory <= 9 for c in capped.candidates)
    assert [c.makespan for c in capped.over_cap] == sorted(c.makespan for c in capped.over_cap)
    # every term tried is in one list or the other, never both
    assert not {c.term for c in capped.over_cap} & {c.term for c in capped.candidates}
    assert {c.term for c in free.candidates} <= {c.term for c in capped.candidates + capped.over_cap}
    for c in capped.over_cap:
        assert capped.over_cap_by(c) == pytest.approx(c.peak_memory - 9) and c.fits is False
    assert all(capped.over_cap_by(c) == 0 for c in capped.candidates)
    assert free.over_cap == [] and all(free.over_cap_by(c) == 0 for c in free.candidates)


def test_the_front_of_what_fits_leaves_out_a_faster_candidate_over_the_device_memory():
    free = tune(_vit_in(9), 2, 4, memory_cap=None, time_limit=5)
    fastest = free.candidates[0]
    assert fastest.fits is False and fastest.term in free.pareto  # on the front of everything, but over 9
    fitting = [c for c in free.candidates if c.fits]
    front = free.fitting_front
    assert front and fastest.term not in front and front <= {c.term for c in fitting}
    for c in fitting:  # nothing that fits beats a front member on both makespan and memory
        if c.term in front:
            assert not any(o.makespan <= c.makespan and o.peak_memory < c.peak_memory or
                           o.makespan < c.makespan and o.peak_memory <= c.peak_memory for o in fitting)
    # where everything fits, it is the front itself
    assert tune("vit-heavy-small", 2, 4, None, 5).fitting_front == tune("vit-heavy-small", 2, 4, None, 5).pareto


def test_when_nothing_fits_the_error_carries_the_reasons_tune_said():
    from mpipe_core.search.fit import NothingFitsError

    wl = {"llm": {"layers": 8, "static": {"layer": 10}}, "device": {"memory": 5}}
    said: list[str] = []
    with pytest.raises(NothingFitsError) as raised:
        tune(wl, 4, 8, memory_cap=5, time_limit=5, progress=said.append, cap_is_capacity=True)
    assert raised.value.reasons == [line for line in said if " cap (" in line] and len(raised.value.reasons) == 2
    assert raised.value.reasons[0].startswith("balanced: static memory alone is at least 20 on a device")


def test_phase_3_groups_encoders_around_every_family_but_balanced(monkeypatch):
    import mpipe_core.search.tune as search

    tried: list[str] = []

    def recording(term, *args, **kwargs):
        tried.append(term)
        return evaluate(term, *args, **kwargs)

    monkeypatch.setattr(search, "evaluate", recording)
    result = tune("vit-heavy-small", 4, 4, None, 60)
    grouped = [t for t in tried if t.startswith("encoder_batch(")]
    assert result.not_tried == 0 and any(t.startswith("balanced(") for t in tried)
    # balanced folds the encoders into the chain: encoder_batch would refuse it, an evaluation wasted
    assert grouped and not any(t.startswith("encoder_batch(balanced(") for t in grouped)
    assert {search.family(t) for t in grouped} == {"fused", "colocated", "disaggregate", "transpose", "encoder_stage"}


def test_one_family_sees_through_encoder_batch_for_the_baselines_and_the_reasons():
    from mpipe_core.search.fit import family

    assert family("encoder_batch(colocated(1f1b(p=2, m=4)), 2)") == "colocated"
    assert family("encoder_batch(colocated(1f1b(p=2, m=4)), 2)", detailed=True) == "colocated"
    assert family("recompute(encoder_batch(1f1b(p=2, m=4), 2))", detailed=True) == "fused (plain generators)"
    assert family("defer_w(split_bw(1f1b(p=2, m=4)))") == "fused"
    assert family("recompute(transpose(1f1b(p=2, m=4), mode=dynamic))", detailed=True) == "transpose mode=dynamic"


# ------------------------------------------------------------------ a search that fails keeps its work

# A trainable encoder whose activations (10 a microbatch) no device of 12 holds for 4 microbatches:
# disaggregate's encoder device misses the cap while its LLM devices do not.
ENCODER_DEVICE_OVER = {"llm": {"layers": 4, "activation": 1.0, "recompute": {"full": {"activation": 0.1}}},
                       "encoders": [{"name": "vision", "f": 2.0, "b": 2.0, "w": 2.0, "trainable": True,
                                     "activation": 10.0}],
                       "device": {"memory": 12.0}}


def test_recompute_is_not_tried_where_only_devices_without_an_llm_chunk_miss_the_cap():
    from mpipe_core.search.fit import recompute_to_fit

    term = "disaggregate(zb_h2(p=2, m=4), encoder_devices=1)"
    ev = evaluate(term, ENCODER_DEVICE_OVER)
    assert ev.metrics.peak_memory == [6.0, 6.0, 40.0]  # only the encoder device (2) is over 12
    c = Candidate(term, ev.timeline.makespan, 40.0, ev.metrics.lower_bound, 0.0, False)
    ran: list[str] = []
    assert recompute_to_fit([c], ran.append, parse_workload(ENCODER_DEVICE_OVER), 12.0, float("inf"),
                            lambda _: None) == 0
    assert ran == []  # before: recompute(disaggregate(...), chunks=[]), a term that does not parse


def test_tune_finishes_when_disaggregate_misses_the_cap_on_its_encoder_devices_only():
    result = tune(ENCODER_DEVICE_OVER, 3, 4, memory_cap=12, time_limit=10, cap_is_capacity=True)
    over = [c for c in result.over_cap if c.term.startswith("disaggregate(")]
    assert over and all(c.peak_memory > 12 for c in over)
    assert not any("recompute(disaggregate(" in c.term for c in result.candidates + result.over_cap)
    assert result.best.fits is True and result.best.peak_memory <= 12


def test_an_empty_chunk_list_is_named_empty():
    code, out, err = cli("eval", "recompute(1f1b(p=2, m=2), chunks=[])")
    assert code == 2 and out == ""
    assert err == ("error: 1:27: recompute: argument 'chunks' must be a list of integers like [4, 3, 3], "
                   "got an empty list\n")
    code, _, err = cli("eval", "recompute(1f1b(p=2, m=2), chunks=[0, x])")
    assert code == 2 and err.endswith("must be a list of integers like [4, 3, 3], got a list with 'x'\n")


def test_a_search_that_fails_after_phase_1_prints_what_it_found_then_the_error(monkeypatch):
    import mpipe_core.search.tune as search

    def failing(*args, **kwargs):
        raise MpipeError("recompute: something went wrong")

    monkeypatch.setattr(search, "recompute_to_fit", failing)
    code, out, err = cli("tune", "-w", "vit-heavy-small", "-p", "2", "-m", "2", "--memory-cap", "100")
    assert code == 2
    assert err.splitlines()[-1].startswith("error: the search stopped after ")
    assert err.splitlines()[-1].endswith(" candidates: recompute: something went wrong")
    found = int(err.splitlines()[-1].split(" after ")[1].split()[0])
    lines = out.splitlines()
    assert lines[0] == (f"the search stopped: the {found} candidates it had evaluated ({found} within the memory "
                        f"cap), fastest first; lower bound " + lines[0].rsplit("lower bound ", 1)[1])
    rows = lines[3:]
    assert found > 10 and len(rows) == found
    spans = [float(row.split()[-4]) for row in rows]
    assert spans == sorted(spans)
    for row in rows[:3]:  # each reproduces with mpipe eval
        term = row[:row.index("  ")]
        assert f"{evaluate(term, 'vit-heavy-small').timeline.makespan:.4g}" == f"{float(row.split()[-4]):.4g}"
    code, out, err = cli("tune", "-w", "vit-heavy-small", "-p", "2", "-m", "2", "--memory-cap", "100", "--json")
    doc = json.loads(out)
    assert code == 2 and len(doc["found"]) == found and doc["memory_cap"] == 100
    assert [c["makespan"] for c in doc["found"]] == sorted(c["makespan"] for c in doc["found"])
