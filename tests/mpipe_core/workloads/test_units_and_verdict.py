"""Units a workload declares, numbers written for people, and a transpose
verdict whose figures add up."""
import re

import pytest

from mpipe_core.api import evaluate
from mpipe_core.compare import compare
from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.units import human, percent, quantity
from mpipe_core.workloads.workload import explicit_dict, load_workload, parse_workload


def test_analytic_workloads_are_in_milliseconds_and_gigabytes():
    wl = load_workload("llava-7b")
    assert (wl.time_unit, wl.memory_unit) == ("ms", "GB")
    assert evaluate("1f1b(p=2, m=2)", "llava-7b").units == ("ms", "GB")


def test_explicit_workloads_declare_units_or_are_unitless():
    assert load_workload("vit-heavy-small").time_unit == ""
    wl = parse_workload({"llm": {"f": 2.0}, "units": {"time": "s", "memory": "GiB"}})
    assert (wl.time_unit, wl.memory_unit) == ("s", "GiB")
    assert explicit_dict(wl)["units"] == {"time": "s", "memory": "GiB"}  # round-trips
    with pytest.raises(WorkloadError, match=r"^units.time: expected one of '', 'us', 'ms', 's', got 'h'$"):
        parse_workload({"units": {"time": "h"}})
    with pytest.raises(WorkloadError, match=r"^units: unknown key 'speed' \(known: memory, time\)$"):
        parse_workload({"units": {"time": "s", "speed": 1}})


@pytest.mark.parametrize("value, text", [
    (115312.7, "115,313"), (27.8123, "27.81"), (0.00012, "0.00012"), (1640.0, "1,640"), (0, "0"),
    (12, "12"), (-3.25, "-3.25"), (-5e-12, "0")])
def test_numbers_never_use_exponents(value, text):
    assert human(value) == text


def test_quantities_carry_their_unit_and_large_milliseconds_read_as_seconds():
    assert quantity(115312.7, "ms") == "115.3 s"
    assert quantity(27.81, "ms") == "27.81 ms"
    assert quantity(27.81, "") == "27.81"


def test_percentages_that_round_to_zero_keep_their_digits():
    assert percent(0.00108) == "0.1%"
    assert percent(0.000108) == "0.011%"
    assert percent(0.5) == "50.0%"
    assert percent(0.0) == "0.0%"


@pytest.mark.parametrize("workload", ["vit-heavy-small", "llava-7b"])
def test_the_verdict_arithmetic_adds_up_from_the_timelines(workload):
    rows = compare(["1f1b(p=4, m=4)", "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"], workload)
    costs = rows[1].transpose
    before, after = (r.evaluation.summary() for r in rows)
    devices = after["devices"]
    # Independent: idle time straight from the metrics of both timelines.
    assert costs.idle_filled == pytest.approx((sum(before["idle"]) - sum(after["idle"])) / devices)
    busy_added = (sum(after["busy"]) - sum(before["busy"])) / devices
    assert costs.work_added_total == pytest.approx(busy_added, abs=1e-9)
    assert costs.saved == pytest.approx(before["makespan"] - after["makespan"])
    assert costs.idle_filled - costs.work_added_total == pytest.approx(costs.saved)
    # The text states that same subtraction.
    a, b, c = re.search(r": ([\d.,]+) − ([\d.,]+) = ([\d.,]+) saved", costs.verdict()).groups()
    assert float(a.replace(",", "")) - float(b.replace(",", "")) == pytest.approx(
        float(c.replace(",", "")), abs=2e-3 * max(1.0, float(c.replace(",", ""))))


def test_a_recomputing_transpose_names_the_work_it_adds():
    wl = {"llm": {"layers": 8}, "encoders": [{"name": "vision", "f": 4.0, "b": 4.0, "w": 4.0,
                                               "trainable": True, "param_bytes": 1.0, "activation": 1.0}],
          "link": {"latency": 0.1, "bandwidth": 2.0},
          "units": {"time": "ms"}}
    costs = compare(["1f1b(p=4, m=4)", "transpose(1f1b(p=4, m=4))"], wl)[1].transpose
    assert costs.work_added["broadcast"] > 0 and costs.work_added["recompute"] > 0
    assert "broadcast 0.6 ms" in costs.arithmetic() and "recompute 3 ms" in costs.arithmetic()
    assert costs.verdict().startswith("transpose loses (17.4% slower, 12.6 ms of 72.6 ms): ")
    assert costs.idle_filled - costs.work_added_total == pytest.approx(costs.saved)
