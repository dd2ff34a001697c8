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


def expected_bars(term: str, workload: str) -> int:
    """Op bars plus idle bars, as the Designer's Gantt chart draws them."""
    bars = from_timeline(evaluate(term, workload).timeline)
    return len(bars) + len(bars.gaps()[0])


def wait_bars(page, count: int) -> None:
    page.wait_for_function(f"() => ({BARS})() === {count}")
