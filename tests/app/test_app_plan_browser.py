"""The Plan page in a real browser: a 512-device plan (InternVL-26B on its
device's cluster, cloudmatrix384) runs under a short time limit, the scatter
and the device map draw, and "Open in Designer" shows the same step time."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from app_helpers import served_app
from browser_helpers import WAIT_MS
from bounds import EVENT_MS

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-output" / "screenshots"  # git-ignored

pytestmark = pytest.mark.slow

POINTS = ("(i) => { const p = document.querySelectorAll('.js-plotly-plot')[i];"
          " return p ? p.querySelectorAll('.scatterlayer .trace:first-child .point').length : -1; }")


def _metric(page, label: str) -> str:
    card = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    return card.locator('[data-testid="stMetricValue"]').inner_text()


def test_a_512_device_plan_draws_and_opens_in_the_designer(tmp_path, browser):
    with served_app(tmp_path / "app.db") as (_, url, _, _):
        page = browser.new_page(viewport={"width": 1400, "height": 2200})
        page.set_default_timeout(WAIT_MS)
        page.goto(url + "/plan", timeout=EVENT_MS)
        budget = page.get_by_role("spinbutton", name="Search budget (terms)")
        budget.fill("20")
        budget.press("Enter")
        page.get_by_role("button", name="Plan", exact=True).click()
        page.wait_for_selector('[data-testid="stMetric"]:has-text("Best step time")')
        best = _metric(page, "Best step time")
        assert best.endswith(" s")
        assert page.get_by_text("512 devices (256 NPUs, 2 dies each) on cloudmatrix384, global batch 512").count() == 1
        # The scatter (the first chart) has its candidates; the device map (the third) all 512 ranks.
        page.wait_for_function(f"() => ({POINTS})(0) > 0")
        page.wait_for_function(f"() => ({POINTS})(2) === 512")
        assert "supernode 0" in page.locator(".js-plotly-plot").nth(2).text_content()
        time.sleep(1.0)  # the last frame painted
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "plan_page.png"), full_page=True)
        assert (SCREENSHOTS / "plan_page.png").stat().st_size > 20_000
        # The best candidate (picked by default) in the Designer: the same step time.
        page.get_by_role("button", name="Open in Designer").click()
        page.wait_for_selector('[data-testid="stMetric"]:has-text("Step time")', timeout=EVENT_MS)
        assert _metric(page, "Step time") == best
