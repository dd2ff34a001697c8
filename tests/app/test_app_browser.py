"""End to end in a real browser: `mpipe app --no-worker` on a free port and a
temporary database, driven by Playwright on Debian's chromium."""
from __future__ import annotations

import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
from app_helpers import served_app
from browser_helpers import GANTT, WAIT_MS, expected_bars, wait_bars

from mpipe_core.api import evaluate
from mpipe_core.workloads.units import human
from bounds import EVENT_MS, EVENT_S

LANDING = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-output"  # git-ignored

pytestmark = pytest.mark.slow


@pytest.fixture
def running_app(tmp_path):
    with served_app(tmp_path / "app.db") as served:
        yield served


def test_designer_in_a_real_browser(running_app, browser, tmp_path):
    proc, url, port, lines = running_app
    assert any(f"http://localhost:{port}" in line for line in lines)
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    page.set_default_timeout(WAIT_MS)
    page.goto(url, timeout=EVENT_MS)
    # The landing page: the multimodal example's Gantt chart.
    page.wait_for_selector(f"{GANTT} .barlayer", timeout=EVENT_MS)
    landing = expected_bars(LANDING, "vit-heavy-small")
    wait_bars(page, landing)
    metric = page.locator('[data-testid="stMetricValue"]').first
    assert metric.inner_text() == human(evaluate(LANDING, "vit-heavy-small").timeline.makespan)
    # Type a term; the chart redraws with its bars.
    term = "zbv(p=4, m=8)"
    editor = page.get_by_role("textbox", name="Term", exact=True)
    editor.fill(term)
    editor.press("Control+Enter")
    expected = expected_bars(term, "vit-heavy-small")
    wait_bars(page, expected)
    makespan = human(evaluate(term, 'vit-heavy-small').timeline.makespan)
    page.wait_for_function(
        "m => document.querySelector('[data-testid=\"stMetricValue\"]').innerText === m",
        arg=makespan, timeout=EVENT_MS)
    legend = page.locator(f"{GANTT} .legend").first.text_content()
    for name in ("idle (bubble)", "llm F", "llm B", "llm W", "vision F"):
        assert name in legend
    time.sleep(1.0)  # let the last frame paint
    shot = tmp_path / "designer.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 20_000
    SCREENSHOTS.mkdir(exist_ok=True)
    shutil.copy(shot, SCREENSHOTS / "app_designer_e2e.png")

    # Ctrl-C stops the app (and would stop the worker).
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=EVENT_S) == 0
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "streamlit still listening after Ctrl-C"
