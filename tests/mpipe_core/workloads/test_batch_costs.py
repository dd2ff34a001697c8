"""What a drawn microbatch costs: encoder per tile, LLM by its tokens."""
import math

import pytest

from mpipe_core.api import evaluate
from mpipe_core.data.packing import Pack
from mpipe_core.errors import WorkloadError
from mpipe_core.simulation.simulator import simulate
from mpipe_core.workloads.analytic import analytic_to_explicit
from mpipe_core.workloads.batch_costs import evened, mean_workload, microbatch_workload, replicas
from mpipe_core.workloads.workload import parse_workload

EXPLICIT = {"llm": {"layers": 2, "f": 1.0, "b": 2.0, "w": 1.0},
            "encoders": [{"name": "vision", "f": 0.5, "b": 0.5, "w": 0.5, "trainable": False}],
            "data": {"samples": {"images": 1, "tiles": {"uniform": [1, 4]}, "text_tokens": 10},
                     "tokens": {"per_tile": 10}, "packing": {"max_tiles": 8, "max_tokens": 100}}}


def test_explicit_costs_are_per_tile_and_linear_in_tokens_of_a_full_pack():
    wl = parse_workload(EXPLICIT)
    batch = microbatch_workload(wl, [Pack((), 3, 50), Pack((), 8, 100)])
    assert batch.encoders[0].costs("F", 2) == [1.5, 4.0]
    assert batch.llm.token_scale["F"] == (0.5, 1.0) and batch.llm.token_scale["W"] == (0.5, 1.0)
    # one device, so the makespan is all the work: encoder F (1.5 + 4) + LLM 2 layers x (1 + 2 + 1) x (0.5 + 1)
    ev = simulate(evaluate("1f1b(p=1, m=2)", batch).schedule, batch)
    assert ev.makespan == pytest.approx(5.5 + 2 * 4 * 1.5)


def test_an_evened_batch_holds_its_own_mean_in_every_microbatch():
    wl = parse_workload(EXPLICIT)
    batch = microbatch_workload(wl, [Pack((), 3, 50), Pack((), 8, 100)])
    even = evened(batch)
    assert even.encoders[0].counts == (5.5, 5.5) and even.llm.token_scale["F"] == (0.75, 0.75)
    # one device: the same work in all, so the same makespan
    schedule = evaluate("1f1b(p=1, m=2)", batch).schedule
    assert simulate(schedule, even).makespan == pytest.approx(simulate(schedule, batch).makespan)
    assert evened(evened(batch)) == evened(batch)


def test_analytic_llm_costs_at_a_microbatch_s_length_are_the_model_s_at_that_length():
    doc = {"model": "llama2-7b", "device": "a100", "data": "internvl"}
    wl = parse_workload(doc)
    batch = microbatch_workload(wl, [Pack((), 0, 1024)])
    short = analytic_to_explicit({"model": {"preset": "llama2-7b", "seq_len": 1024}, "device": "a100"})["llm"]
    for kind, key in (("F", "f"), ("B", "b"), ("W", "w")):
        assert math.isclose(getattr(wl.llm, key) * batch.llm.token_scale[kind][0], short[key], rel_tol=1e-12)


def test_the_mean_workload_holds_the_mean_of_the_drawn_packs_and_replicas_come_from_the_workload():
    wl = parse_workload(EXPLICIT)
    mean = mean_workload(wl, 4, batches=2)
    assert len(set(mean.encoders[0].counts)) == 1 and 1 <= mean.encoders[0].counts[0] <= 8
    assert replicas(wl) == 1
    assert replicas(parse_workload({**EXPLICIT, "data": {**EXPLICIT["data"], "dp": 3}})) == 3
    assert replicas(parse_workload({"model": "llama2-7b", "device": "a100", "parallel": {"dp": 4},
                                    "data": "internvl"})) == 4
    with pytest.raises(WorkloadError) as caught:
        parse_workload({"model": "llama2-7b", "device": "a100", "data": {"preset": "internvl", "dp": 2}})
    assert caught.value.message == "data.dp: an analytic workload states its replicas as parallel.dp"


def test_images_and_data_both_counting_inputs_is_refused():
    doc = {**EXPLICIT, "encoders": [{"name": "vision", "images": {"min": 1, "max": 3}}]}
    with pytest.raises(WorkloadError) as caught:
        parse_workload(doc)
    assert caught.value.message == ("encoder 'vision': images and a data section both count a microbatch's "
                                    "inputs; drop images (with data, its f/b/w are per tile)")
