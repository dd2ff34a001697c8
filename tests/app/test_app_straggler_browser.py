"""The slow-card heatmap in a real browser (Playwright on Debian's chromium,
`mpipe app` serving): a 512-rank cluster_step_trace_time.csv (generated, two
slow cards) imported with the CLI, the Runs page drawing its heatmap in one
screen, and the hover naming the rank, its dp/pp/tp index and the step.
Leaves test-output/screenshots/runs_stragglers.png (and, with
$MPIPE_SHOTS_DIR, a copy there)."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from app_helpers import chromium_browser, served_app

from benchmarks.straggler_bench import cluster_csv

pytestmark = pytest.mark.slow

WAIT_MS = 120_000
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"  # git-ignored


def test_the_heatmap_of_512_ranks_reads_in_one_screen_and_hover_names_the_rank(tmp_path):
    csv = tmp_path / "cluster_step_trace_time.csv"
    csv.write_text(cluster_csv())
    db = tmp_path / "app.db"
    from storage import open_database
    from storage.imported_runs import import_step_summary

    store = open_database(f"sqlite:///{db}")
    import_step_summary(store, [csv], term="1f1b(p=4, m=8)")
    store.close()
    with served_app(db) as (_, url, _, _), chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        page.goto(f"{url}/runs")
        page.get_by_text("Step summary: the slow card", exact=True).wait_for()
        heat = page.locator(".js-plotly-plot", has=page.locator(".heatmaplayer"))
        heat.locator(".heatmaplayer image, .heatmaplayer .hm").first.wait_for(state="attached")
        time.sleep(3.0)  # Streamlit draws the chart once more after the first frame
        heat.scroll_into_view_if_needed()
        box = heat.locator(".nsewdrag").first.bounding_box()
        assert box is not None and box["height"] < 1000  # the whole rank axis in one screen
        # Rank 300's column (a slow card) on step 1's row: x by the rank axis' linear scale, y the middle row.
        x = box["x"] + box["width"] * (300 + 0.5) / 512
        y = box["y"] + box["height"] * 0.5
        page.mouse.move(x, y)
        label = page.locator(".hoverlayer .hovertext").first
        label.wait_for()
        text = label.text_content()
        assert "rank 300" in text and "dp/pp/tp 5/2/4" in text and "step 1" in text, text
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / "runs_stragglers.png"
        heat.screenshot(path=str(shot))
        if os.environ.get("MPIPE_SHOTS_DIR"):
            Path(os.environ["MPIPE_SHOTS_DIR"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(os.environ["MPIPE_SHOTS_DIR"]) / shot.name)
        print(f"\nhover at rank 300, step 1: {text}")
