"""The Runs page launches a `disaggregate(...)` schedule (p + k ranks, the
rank count checked inline), and once its measured timings are in (the run
executed as a worker prepares it, ranks as threads), its Gantt charts draw the
encoder rank as a row of its own, beside the LLM's."""
from __future__ import annotations

import numpy as np
import pytest
from app_helpers import array, button, errors, figure, metric, open_page, shown, start_app

from storage import add_timings, claim_next_run, finish_run, list_runs, save_schedule

pytestmark = pytest.mark.databases("sqlite")
TERM = "disaggregate(1f1b(p=2, m=4), encoder_devices=1)"


def _rows_by_module(fig: dict) -> dict[str, set[int]]:
    """Trace module -> the device rows its bars sit on (both panels of an overlay)."""
    out: dict[str, set[int]] = {}
    for trace in fig["data"]:
        if trace.get("type") == "bar" and not trace["name"].startswith("idle"):
            module = next(w for w in trace["name"].split() if w in ("llm", "vision"))
            out.setdefault(module, set()).update(int(round(y)) for y in np.asarray(array(trace["y"]), float))
    return out


def test_launch_a_disaggregated_run_and_see_the_encoder_rank_as_a_row(db, db_url):
    from executor.runtime.model import MODEL_PRESETS
    from executor.runtime.model_workload import workload_for
    from executor.runtime.rank import run_local
    from executor.service.run_setup import prepare_run

    save_schedule(db, "dis", TERM, workload=workload_for(MODEL_PRESETS["tiny"], name="tiny"))
    at = open_page(start_app(), "runs")
    assert at.number_input(key="runs.nproc.dis@1").value == 3  # 2 LLM + 1 encoder device
    at.number_input(key="runs.nproc.dis@1").set_value(2)
    button(at, "Launch").click().run()
    assert "runs on 3 devices (p + k = 2 LLM + 1 encoder device of disaggregate)" in errors(at)[0]
    assert not list_runs(db)
    at.number_input(key="runs.nproc.dis@1").set_value(3)
    at.number_input(key="runs.steps").set_value(2)
    button(at, "Launch").click().run()
    [run] = list_runs(db)
    assert (run.ref, run.status, run.nproc, run.steps) == ("dis@1", "queued", 3, 2)
    assert [shown(s.value) for s in at.success] == [f"Queued run #{run.id} of dis@1"]

    claimed = claim_next_run(db, "w", 120)
    prep = prepare_run(claimed)
    (result,) = run_local([prep.job], prep.devices)
    add_timings(db, run.id, result.timeline, worker_id="w", attempt=claimed.attempt)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)
    at.run()
    assert not at.exception and not errors(at)
    assert metric(at, "Status") == "succeeded"
    charts = [figure(at, i) for i in range(len(at.get("plotly_chart")))]
    titles = [c["layout"]["title"]["text"] for c in charts]
    gantts = [c for c, t in zip(charts, titles) if t.startswith("Measured")]
    assert len(gantts) >= 2, titles  # every step measured, and measured vs predicted
    for chart in gantts:
        assert _rows_by_module(chart) == {"llm": {0, 1}, "vision": {2}}, chart["layout"]["title"]["text"]
        assert list(chart["layout"]["yaxis"]["tickvals"]) == [0, 1, 2]
    assert list(at.dataframe[1].value["device"]) == [0, 1, 2]  # per device, the encoder rank included
