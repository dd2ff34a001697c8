"""The data view in a real browser, on the Designer opened from a link to a
workload with a data section: the batches' cost histogram, the per-batch
step-time line, and a picked batch's Gantt chart."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from app_helpers import served_app
from browser_helpers import WAIT_MS
from test_app_data_view import DATA_WORKLOAD, TERM
from bounds import EVENT_MS

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-output" / "screenshots"  # git-ignored

pytestmark = pytest.mark.slow

PLOT = "(i) => document.querySelectorAll('.js-plotly-plot')[i]"
BATCHES = 6


def test_the_data_view_draws_costs_steps_and_a_picked_batch(tmp_path, browser):
    with served_app(tmp_path / "app.db") as (_, url, _, _):
        page = browser.new_page(viewport={"width": 1400, "height": 2600})
        page.set_default_timeout(WAIT_MS)
        link = urlencode({"term": TERM, "workload": "json:" + json.dumps(DATA_WORKLOAD, separators=(",", ":"))})
        page.goto(f"{url}/?{link}", timeout=EVENT_MS)
        page.get_by_text("Data: batch by batch").click()
        batches = page.get_by_role("spinbutton", name="Batches")
        batches.fill(str(BATCHES))
        batches.press("Enter")
        # The histogram (4th chart: after the Gantt, idle and memory charts), the line of both plans, the Gantt.
        page.wait_for_function(f"() => {{ const p = ({PLOT})(3); return p && p.querySelectorAll('.barlayer .point')"
                               ".length > 0; }")
        page.wait_for_function(f"() => {{ const p = ({PLOT})(4); return p && p.querySelectorAll('.scatterlayer "
                               f".trace')[1]?.querySelectorAll('.point').length === {BATCHES}; }}")
        box = page.locator('[data-testid="stSelectbox"]').filter(has=page.get_by_text("Batch", exact=True))
        box.locator('[role="combobox"], input').first.click()
        page.get_by_role("option", name=re.compile(r"^batch 4:")).click()
        page.wait_for_function(f"() => ({PLOT})(5)?.querySelector('.gtitle')?.textContent.startsWith('Batch 4:')")
        page.wait_for_function(f"() => ({PLOT})(5).querySelectorAll('.barlayer .point').length > 0")
        assert page.get_by_text(re.compile(r"^Batch 4: .* microbatch order")).count() == 1
        time.sleep(1.0)  # the last frame painted
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator(".js-plotly-plot").nth(3).scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "data_view.png"), full_page=True)
        assert (SCREENSHOTS / "data_view.png").stat().st_size > 20_000
