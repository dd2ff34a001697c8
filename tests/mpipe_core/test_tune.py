"""mpipe tune: the JSON contract, reproduction with mpipe eval, memory caps,
the exact placement against brute force, and bad input."""
import contextlib
import io
import json
from itertools import product

import pytest

from mpipe_cli.main import main
from mpipe_core.api import evaluate
from mpipe_core.errors import ScheduleError
from mpipe_core.ops import ALLREDUCE, BCAST, BW, F, LLM, Op
from mpipe_core.simulator import simulate
from mpipe_core.tune import tune
from mpipe_core.tune.exact import solve
from mpipe_core.workload import parse_workload

from benchmarks.mllm_suite import CASES


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
    assert set(tuned) == {"lower_bound", "baselines", "candidates", "best", "optimal"}
    assert set(tuned["baselines"]) == {"fused", "balanced", "colocated", "disaggregated", "transpose"}
    for base in tuned["baselines"].values():
        assert set(base) == {"term", "makespan", "peak_memory"}
    assert tuned["baselines"]["colocated"]["term"].startswith(("colocated(", "encoder_batch(colocated("))
    assert "disaggregate(" in tuned["baselines"]["disaggregated"]["term"]
    assert "transpose(" in tuned["baselines"]["transpose"]["term"]
    keys = {"term", "makespan", "peak_memory", "efficiency", "pareto"}
    assert all(set(c) == keys for c in tuned["candidates"]) and set(tuned["best"]) == keys
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


@pytest.mark.parametrize("label, workload, p, m", [(c[0], c[1], c[2], c[3]) for c in CASES])
def test_tune_best_is_no_worse_than_both_baselines_on_every_suite_case(label, workload, p, m):
    result = tune(workload, p, m, time_limit=3)
    assert result.best.makespan <= result.fused.makespan
    assert result.best.makespan <= result.balanced.makespan
    assert result.best.makespan >= result.lower_bound - 1e-9


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
    assert "colocated (Megatron MIMO)" not in out and out.splitlines()[3].startswith("fused ")


def test_the_text_output_names_every_baseline_with_its_speedup():
    code, out, _ = cli("tune", "-w", "vit-heavy-small", "-p", "4", "-m", "4")
    assert code == 0
    lines = out.splitlines()
    names = [line[:26].strip() for line in lines[3:8]]
    assert names == ["fused", "balanced", "colocated (Megatron MIMO)", "disaggregated (best)", "transpose (best)"]
    fused = float(lines[3].split()[1])
    for line in lines[3:8]:
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
