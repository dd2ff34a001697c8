"""The Runs page's communication tab (issue 39 section 7): a cp2 x pp2 x dp2 run's
measured collectives drawn over its ops as the Designer draws predicted ones,
one pipeline at a time, picked by its dp / cp coordinates."""
from __future__ import annotations

import numpy as np
import pytest
from app_helpers import array, figure, open_page, start_app

from storage import add_timings, claim_next_run, enqueue, finish_run, save_schedule

pytestmark = pytest.mark.databases("sqlite")
TERM = "1f1b(p=2, m=4)"


def _comm_chart(at) -> dict | None:
    for i in range(len(at.get("plotly_chart"))):
        fig = figure(at, i)
        if fig["layout"]["title"]["text"].startswith("Measured communication"):
            return fig
    return None


def _traces(fig: dict) -> dict[str, dict]:
    return {t["name"]: t for t in fig["data"] if t.get("type") == "bar"}


def test_the_communication_tab_shows_the_picked_pipelines_collectives(db, db_url):
    from app.figures import COMM_STRIP
    from executor.runtime.jobs import Job
    from executor.runtime.model import ModelConfig
    from executor.runtime.model_workload import workload_for
    from executor.runtime.rank import run_local
    from mpipe_core.api import evaluate
    from mpipe_core.workloads.presets import preset_document

    doc = preset_document("llava-7b")
    doc["parallel"] = {"cp": 2, "dp": 2}
    save_schedule(db, "cp", TERM, workload=doc)
    run = enqueue(db, "cp@1", nproc=8)
    claimed = claim_next_run(db, "w", 120)
    cfg = ModelConfig(encoder=None)
    job = Job.make(TERM, evaluate(TERM, workload_for(cfg)).schedule, cfg, layout={"cp": 2, "dp": 2, "pp": 2})
    (result,) = run_local([job], 8)
    # The first pipeline's ops and collectives, as measured; the pipeline at cp=1 as the same
    # rows 5 s later (run_local returns the first pipeline's; torchrun streams every one).
    first = result.timeline + result.comm
    other = [r._replace(pipeline=1, start=r.start + 5.0, end=r.end + 5.0) for r in first]
    add_timings(db, run.id, first + other, worker_id="w", attempt=claimed.attempt)
    finish_run(db, run.id, "w", "succeeded", exit_code=0)

    at = open_page(start_app(), "runs")
    assert not at.exception
    keys = {s.key for s in at.selectbox}
    assert {f"runs.comm.{run.id}.dp", f"runs.comm.{run.id}.cp"} <= keys
    assert f"runs.comm.{run.id}.tp" not in keys  # tp = 1: nothing to pick
    fig = _comm_chart(at)
    assert fig["layout"]["title"]["text"] == ("Measured communication, pipeline dp=0, cp=0 of layout "
                                              "tp=1 cp=2 pp=2 dp=2 (8 ranks)")
    traces = _traces(fig)
    cp = traces["measured cp K/V exchange (inside the op)"]
    dp = traces["measured dp gradient sync (after the pipeline)"]
    assert "measured optimizer step (after the pipeline)" in traces
    gathers = [c for c in result.comm if c.kind == "cp_comm"]
    assert len(array(cp["base"])) == len(gathers)  # every gather and its backward, one strip each
    assert set(np.round(array(cp["width"]), 3)) == {COMM_STRIP}
    # Strips sit inside their stage's row: the lower edge for cp, the upper for the async dp reductions.
    assert set(np.round(array(cp["y"]) - np.round(array(cp["y"])), 2)) == {round(0.4 - COMM_STRIP / 2, 2)}
    assert set(np.round(array(dp["y"]) - np.round(array(dp["y"])), 2)) == {round(-(0.4 - COMM_STRIP / 2), 2)}
    first_base = float(min(array(cp["base"])))
    table = next(d.value for d in at.dataframe if "ms per step" in d.value.columns)
    assert set(table["kind"]) >= {"cp_comm", "dp_comm", "optimizer"}

    at.selectbox(key=f"runs.comm.{run.id}.cp").set_value(1).run()
    fig = _comm_chart(at)
    assert fig["layout"]["title"]["text"].startswith("Measured communication, pipeline dp=0, cp=1 ")
    # The same rows drawn from that pipeline's own origin: the same places.
    assert float(min(array(_traces(fig)["measured cp K/V exchange (inside the op)"]["base"]))) == \
        pytest.approx(first_base, abs=1e-6)

    at.selectbox(key=f"runs.comm.{run.id}.dp").set_value(1).run()
    assert _comm_chart(at) is None
    assert any("No timings of pipeline dp=1, cp=1" in i.value for i in at.info)
