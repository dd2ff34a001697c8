"""`mpipe compare`: one lower bound for every row (named), units in the column
heads, and whether each schedule fits the device."""
import contextlib
import io
import json

import pytest

from mpipe_cli.main import main
from mpipe_core.api import evaluate
from mpipe_core.compare import compare, shared_bound


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


DISAGGREGATED = "disaggregate(1f1b(p=3, m=8), encoder_devices=1)"
FUSED = "1f1b(p=4, m=8)"


def test_every_row_divides_the_same_lower_bound_so_eff_ranks_as_speed_does():
    rows = compare([DISAGGREGATED, FUSED], "llava-7b")
    own = {r.evaluation.term: r.evaluation.metrics.lower_bound for r in rows}
    bound, of = shared_bound(rows)
    assert bound == min(own.values()) == own[FUSED] and of == FUSED  # the fused 1f1b's own bound is the lower
    spans = {r.evaluation.term: r.evaluation.timeline.makespan for r in rows}
    for r in rows:
        assert r.shared_lower_bound == bound
        assert r.shared_efficiency == pytest.approx(bound / spans[r.evaluation.term])
    # Its own bound rates the slower disaggregated layout higher; the shared one does not.
    dis, fused = rows
    assert spans[DISAGGREGATED] > spans[FUSED]
    assert dis.evaluation.metrics.efficiency > fused.evaluation.metrics.efficiency
    assert dis.shared_efficiency < fused.shared_efficiency
    assert dis.shared_efficiency / fused.shared_efficiency == pytest.approx(spans[FUSED] / spans[DISAGGREGATED])
    assert fused.shared_efficiency == fused.evaluation.metrics.efficiency  # the row the bound is of


def test_the_table_names_the_bound_and_has_units_and_a_fits_column():
    code, out, err = cli("compare", DISAGGREGATED, FUSED, "-w", "llava-7b")
    assert code == 0 and err == ""
    fused, dis = evaluate(FUSED, "llava-7b"), evaluate(DISAGGREGATED, "llava-7b")
    bound = fused.metrics.lower_bound
    lines = out.splitlines()
    assert lines[:4] == [
        f"lower bound {bound:,.0f} ms: the lowest of the rows' own ({FUSED}); eff = this bound / makespan, "
        f"the same for every row",
        "device memory 80 GB",
        "",
        # an analytic workload: the step's MFU and its time in seconds lead
        f"{'term':<{len(DISAGGREGATED)}}    MFU step (s) makespan (ms) speedup bubble   eff peak mem (GB) fits"]
    row = lines[4].split()
    assert row[0] + " " + row[1] + " " + row[2] == DISAGGREGATED
    assert row[3:] == [f"{dis.step.mfu:.1%}", f"{dis.step.step_time_s:.4g}", f"{dis.timeline.makespan:,.0f}",
                       "1.00x", f"{dis.metrics.bubble_ratio:.1%}", f"{bound / dis.timeline.makespan:.1%}",
                       f"{max(dis.metrics.peak_memory):.4g}", "yes"]
    assert lines[5].split()[-1] == "yes" and lines[5].split()[-3] == f"{fused.metrics.efficiency:.1%}"


def test_a_schedule_over_the_device_memory_says_no_and_a_unitless_workload_has_no_units():
    code, out, _ = cli("compare", "1f1b(p=8, m=16)", "balanced(zbv(p=8, m=16))", "-w", "internvl-26b",
                       "--parallel", "tp=8,sp")
    lines = out.splitlines()
    assert code == 0 and lines[1] == "device memory 64 GB"
    assert lines[4].startswith("1f1b(p=8, m=16) ") and lines[4].split()[-1] == "no"  # 246.6 GB on 64
    assert lines[5].startswith("balanced(zbv(p=8, m=16)) ") and lines[5].split()[-1] == "yes"
    # uniform: F = B = W = 1 per chunk; 2 chunks x 4 microbatches x 3 over 2 devices = 12 for both
    code, out, _ = cli("compare", "1f1b(p=2, m=4)", "gpipe(p=2, m=4)")
    lines = out.splitlines()
    assert lines[0].startswith("lower bound 12: the lowest of the rows' own (1f1b(p=2, m=4))")
    assert lines[1] == "device memory unknown (fits: ?)"
    assert lines[3].split()[1:] == ["makespan", "speedup", "bubble", "eff", "peak", "mem", "fits"]
    assert lines[4].split()[-1] == "?"


def test_the_json_rows_carry_the_shared_bound_beside_their_own():
    code, out, _ = cli("compare", DISAGGREGATED, FUSED, "-w", "llava-7b", "--json")
    rows = json.loads(out)
    assert code == 0 and rows[0]["shared_lower_bound"] == rows[1]["shared_lower_bound"] == rows[1]["lower_bound"]
    assert rows[0]["shared_efficiency"] == pytest.approx(rows[1]["lower_bound"] / rows[0]["makespan"])
    assert rows[0]["efficiency"] == pytest.approx(rows[0]["lower_bound"] / rows[0]["makespan"])  # its own, as eval
