"""What the browser tests share: the Gantt chart's selectors, the count of bars a
term draws and the wait for them, on a machine whose 2 cores are shared (generous
waits, always on a condition)."""
from __future__ import annotations

from app.bars import from_timeline
from mpipe_core.api import evaluate

from bounds import EVENT_MS

WAIT_MS = EVENT_MS
GANTT = ".js-plotly-plot"
# The number of bars the first Gantt chart on the page draws (-1: none yet).
BARS = (f"() => {{ const p = document.querySelector('{GANTT}');"
        " return p ? p.querySelectorAll('.barlayer .point').length : -1; }")
# The titles of every chart on the page, in order (SVG text: Playwright's inner_text gives None).
TITLES = f"() => [...document.querySelectorAll('{GANTT} .gtitle')].map(e => e.textContent)"


def expected_bars(term: str, workload: str) -> int:
    """Op bars plus idle bars, as the Designer's Gantt chart draws them."""
    bars = from_timeline(evaluate(term, workload).timeline)
    return len(bars) + len(bars.gaps()[0])


def wait_bars(page, count: int) -> None:
    """Wait for the first Gantt chart to draw `count` bars; if it never does, say how many it
    drew and keep a screenshot of the page (an idle run once waited out the bound here)."""
    from pathlib import Path

    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"() => ({BARS})() === {count}")
    except PlaywrightTimeout:
        shown = page.evaluate(BARS)
        titles = page.evaluate(TITLES)
        shots = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "wait_bars_timeout.png"), full_page=True)
        raise AssertionError(f"the Gantt chart drew {shown} bars, not {count}; charts: {titles}; "
                             f"screenshot: {shots / 'wait_bars_timeout.png'}") from None
