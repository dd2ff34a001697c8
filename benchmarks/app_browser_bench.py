"""The app as a user meets it, timed in Chromium (Playwright): how soon a new
session shows its first chart on a warm server, and how soon a term change
is redrawn.

    .venv/bin/python -m benchmarks.app_browser_bench [--against OTHER_CHECKOUT]

With `--against`, the same sessions alternate between this checkout's app and
another's (e.g. the main branch), so a loaded machine slows both alike and the
ratio is what to read.

Targets: first chart within 3 s of opening a new session (the server already
warm: started, and the landing page evaluated once by an earlier session), a
term change redrawn within 1 s.  "Drawn" means every bar of the chart is in
the page (op bars and idle bars), not merely that a placeholder appeared.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .app_server import REPO, chromium_browser, served_app

SESSIONS = 5
TERMS = ["zbv(p=4, m=8)", "1f1b(p=4, m=8)", "interleaved(p=4, m=8, v=2)", "zbv(p=4, m=8)",
         "transpose(1f1b(p=4, m=8), mode=dynamic, shards=4)"]
LANDING = ("transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)", "vit-heavy-small")
TIMEOUT_MS = 120_000
SETTLE_MS = 1500
BARS = ("() => { const p = document.querySelector('.js-plotly-plot');"
        " return p ? p.querySelectorAll('.barlayer .point').length : -1; }")


def _expected_bars(term: str, workload: str = "vit-heavy-small") -> int:
    from app.bars import from_timeline
    from mpipe_core.api import evaluate

    bars = from_timeline(evaluate(term, workload).timeline)
    return len(bars) + len(bars.gaps()[0])


def _wait_bars(page, count: int) -> None:
    page.wait_for_function(f"() => ({BARS})() === {count}", timeout=TIMEOUT_MS, polling=20)


def _sessions(browser, url: str, landing: int, i: int, tabs, times: dict[str, list[float]]) -> None:
    """One new tab (with a term change) and one fresh browser profile, timed."""
    fresh = browser.new_context(viewport={"width": 1400, "height": 1400})
    for what, context in ((FIRST_TAB, tabs), (FIRST_FRESH, fresh)):
        page = context.new_page()
        # A new tab makes Chromium load its new-tab page's own scripts in the
        # background (a second renderer: ~0.3 s of CPU, measured in a trace).
        # A user types the address after that; the clock starts when the
        # address is asked for, not while the browser is still opening the tab.
        page.wait_for_timeout(SETTLE_MS)
        t0 = time.perf_counter()
        page.goto(url, timeout=TIMEOUT_MS)
        _wait_bars(page, landing)
        times[what].append(time.perf_counter() - t0)
        if context is tabs:
            editor = page.get_by_role("textbox", name="Term", exact=True)
            term = TERMS[i % len(TERMS)]
            expected = _expected_bars(term)
            editor.fill(term)
            t0 = time.perf_counter()
            editor.press("Control+Enter")
            _wait_bars(page, expected)
            times[CHANGE].append(time.perf_counter() - t0)
        page.close()
    fresh.close()


def run(progress=print, against: Path | None = None) -> dict[str, dict[str, list[float]]]:
    """New sessions two ways: a new tab of a browser that has shown the app
    before (its scripts cached), and a fresh browser profile (nothing cached).
    Returns {checkout: {what: seconds}}."""
    landing = _expected_bars(*LANDING)
    checkouts = {"this checkout": REPO} | ({f"{against}": against} if against else {})
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, chromium_browser() as browser, contextlib.ExitStack() as stack:
        servers = {}
        for label, repo in checkouts.items():
            progress(f"  starting the app from {repo} ...")
            _, url, _, _ = stack.enter_context(served_app(Path(tmp) / f"{len(servers)}.db", repo=repo))
            tabs = browser.new_context(viewport={"width": 1400, "height": 1400})
            warm = tabs.new_page()  # the server's first session evaluates the landing term
            warm.goto(url, timeout=TIMEOUT_MS)
            _wait_bars(warm, landing)
            warm.close()
            servers[label] = (url, tabs)
            results[label] = {k: [] for k in TARGETS}
        for i in range(SESSIONS):
            for label, (url, tabs) in servers.items():
                progress(f"  session {i + 1} of {SESSIONS}, {label} ...")
                _sessions(browser, url, landing, i, tabs, results[label])
    return results


FIRST_TAB = "first chart, new tab"
FIRST_FRESH = "first chart, fresh browser"
CHANGE = "term change redrawn"
TARGETS = {FIRST_TAB: 3.0, FIRST_FRESH: 3.0, CHANGE: 1.0}


def main(argv: list[str] | None = None) -> None:
    argv = list(argv or [])
    against = Path(argv[argv.index("--against") + 1]).resolve() if "--against" in argv else None
    print(f"App in Chromium (Playwright), warm server, {SESSIONS} new sessions each; seconds")
    results = run(progress=lambda msg: print(msg, file=sys.stderr), against=against)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    header = f"{'app':16} {'what':28} {'median':>7} {'max':>7} {'target':>7}  verdict"
    print(header)
    print("-" * len(header))
    for label, rows in results.items():
        for what, times in rows.items():
            median, worst = statistics.median(times), max(times)
            verdict = "meets" if median <= TARGETS[what] else "MISSES"
            print(f"{label[-16:]:16} {what:28} {median:>7.2f} {worst:>7.2f} {TARGETS[what]:>7.1f}  {verdict}")
    print(f"(load average at the end: {load} on {os.cpu_count()} cores; medians of sessions run alternately)")


if __name__ == "__main__":
    main(sys.argv[1:])
