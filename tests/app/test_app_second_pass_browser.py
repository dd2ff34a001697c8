"""Issue 24's acceptance flows in a real browser (Playwright on Debian's chromium):
every export on a transposed term, the default comparison on Runs and its labels,
a shared link opened in a fresh browser, Tune's error in view at 64 x 512, and a
256-device Tune.  Each flow leaves a screenshot under test-output/screenshots/."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from app_helpers import served_app
from browser_helpers import GANTT, WAIT_MS, expected_bars, wait_bars
from playwright.sync_api import expect

from mpipe_core.api import evaluate
from mpipe_core.workloads.units import human, quantity
from bounds import EVENT_MS, EVENT_S

pytestmark = pytest.mark.slow

LANDING = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
WL = "vit-heavy-small"
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-output" / "screenshots"  # git-ignored


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    path = tmp_path_factory.mktemp("second-pass") / "app.db"
    with served_app(path) as (_, url, _, _):
        yield url, f"sqlite:///{path}"


def _page(browser, url: str):
    context = browser.new_context(viewport={"width": 1400, "height": 1700}, accept_downloads=True)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    return context, page


def _shot(page, name: str, at=None) -> None:
    """The viewport, scrolled to `at` (Streamlit scrolls its own container, so a
    full-page shot would show the top only)."""
    if at is not None:
        at.scroll_into_view_if_needed()
    time.sleep(1.0)  # the last frame
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name))


def _pick(page, label: str, option: str) -> None:
    page.get_by_role("combobox", name=label).click()
    page.get_by_role("option", name=option, exact=True).click()


def _number(page, label: str, value: int) -> None:
    field = page.get_by_label(label, exact=True)
    field.fill(str(value))
    field.press("Enter")


def _cli_export(fmt: str) -> tuple[int, str, str]:
    out = subprocess.run([sys.executable, "-m", "mpipe_cli.main", "export", LANDING, "-w", WL, "--format", fmt],
                         cwd=REPO, capture_output=True, text=True, timeout=EVENT_S)
    return out.returncode, out.stdout, out.stderr.strip().removeprefix("error: ")


def test_every_export_of_a_transposed_term_downloads_or_says_why_not(app, browser):
    url, _ = app
    context, page = _page(browser, url)
    page.goto(url)
    wait_bars(page, expected_bars(LANDING, WL))
    refused = 0
    for label, fmt in (("torch CSV", "torch-csv"), ("Perfetto trace", "chrome-trace"), ("JSON", "json")):
        button = page.get_by_role("button", name=f"Download {label}", exact=True)
        code, text, reason = _cli_export(fmt)  # what `mpipe export` does with it
        if code != 0:
            refused += 1
            assert code == 2 and button.is_disabled()
            page.get_by_text(f"{label}: {reason}", exact=True).wait_for(state="visible")
            continue
        with page.expect_download() as download:
            button.click()
        got = Path(download.value.path()).read_text()
        # The same document `mpipe export` writes (the app's copy of the workload has its keys sorted).
        assert json.loads(got) == json.loads(text)
    assert refused == 1  # torch's CSV cannot hold a transposed schedule: the case this flow is about
    _shot(page, "designer_exports_transposed.png", page.get_by_role("button", name="Download JSON"))
    context.close()


def test_runs_compare_with_the_runs_own_workload_by_default_and_say_so(app, browser):
    from storage import add_timings, claim_next_run, enqueue, finish_run, open_database, save_schedule

    url, db_url = app
    db = open_database(db_url)
    term = "transpose(1f1b(p=2, m=4), mode=dynamic)"
    save_schedule(db, "flow24", term, workload=WL)
    ev = evaluate(term, WL)
    for scale in ((4.0, 1.0, 1.2), (3.0, 1.5, 1.4)):  # two runs of one version: the spread shows both
        run = enqueue(db, "flow24", steps=3)
        claim_next_run(db, "w", 60)
        rows, t0 = [], 100.0
        for step, k in enumerate(scale):
            rows += [r._replace(step=step, start=t0 + r.start * k / 1000, end=t0 + r.end * k / 1000)
                     for r in ev.timeline.records()]
            t0 += ev.timeline.makespan * k / 1000 + 0.01
        add_timings(db, run.id, rows)
        finish_run(db, run.id, "w", "succeeded", exit_code=0)
    db.close()
    context, page = _page(browser, url)
    page.goto(f"{url}/runs?run={run.id}")
    error_label = page.locator('[data-testid="stMetric"]', has_text="Prediction error")
    error_label.wait_for()
    picker = page.locator('[data-testid="stSelectbox"]', has_text="Predict on the workload")
    shown = picker.inner_text() + " " + (picker.locator("input").first.input_value()
                                         if picker.locator("input").count() else "")
    assert f"the run's own: {WL} (a prediction)" in shown, shown
    predicted = page.locator('[data-testid="stMetric"]', has_text="Predicted makespan").locator(
        '[data-testid="stMetricValue"]')
    assert predicted.inner_text() == quantity(ev.timeline.makespan, "ms")
    page.get_by_text("Run-to-run spread, to weigh any prediction error against", exact=False).wait_for()
    page.get_by_text("Run-to-run spread", exact=True).wait_for()
    assert page.get_by_text("Fit on this run", exact=False).count() == 0
    _shot(page, "runs_default_prediction.png", page.locator(".js-plotly-plot").first)
    # The fit is one pick away, and says it is no prediction.
    _pick(page, "Predict on the workload", "fit on this run (not a prediction)")
    page.get_by_text("Fit on this run: these costs were measured from this very run", exact=False).wait_for()
    page.get_by_text("Fit (not a prediction) makespan", exact=True).wait_for()
    _shot(page, "runs_fit_not_a_prediction.png", page.get_by_text("Fit (not a prediction) makespan"))
    # Every step: the steps used on their own scale, step boundaries drawn, the warm-up apart.
    page.get_by_role("tab", name="Measured, all steps").click()
    warm = page.get_by_text("Warm-up step 0 (left out of every comparison)", exact=False).first
    warm.wait_for()
    _shot(page, "runs_all_steps_warmup_apart.png", warm)
    context.close()


def test_a_shared_link_shows_the_same_design_in_a_fresh_browser(app, browser):
    url, _ = app
    term = "zbv(p=4, m=8)"
    context, page = _page(browser, url)
    page.goto(url)
    wait_bars(page, expected_bars(LANDING, WL))
    editor = page.get_by_role("textbox", name="Term", exact=True)
    editor.fill(term)
    editor.press("Control+Enter")
    _pick(page, "Preset", "llava-7b")
    expected = expected_bars(term, "llava-7b")
    wait_bars(page, expected)
    page.get_by_role("button", name="Copy link", exact=True).click()
    page.get_by_text("Link copied", exact=True).wait_for()
    link = page.evaluate("navigator.clipboard.readText()")
    assert link.startswith(url) and "term=" in link and "workload=preset%3Allava-7b" in link
    context.close()
    # Another browser context: no cookies, no session, only the link.
    fresh, page = _page(browser, url)
    page.goto(link)
    # The link's term fills the editor as the page restores it (a rerun may come after the first bars).
    expect(page.get_by_role("textbox", name="Term", exact=True)).to_have_value(term, timeout=WAIT_MS)
    wait_bars(page, expected)
    # An analytic workload's cards lead with the step time and MFU; the makespan has its own card.
    makespan = page.locator('[data-testid="stMetric"]', has_text="Makespan").locator('[data-testid="stMetricValue"]')
    assert makespan.inner_text() == quantity(evaluate(term, "llava-7b").timeline.makespan, "ms")
    legend = page.locator(f"{GANTT} .legend").first.text_content()
    assert "hatched ╲: a second chunk (or encoder shard) on the same device" in legend
    _shot(page, "designer_opened_from_link.png", page.locator(GANTT).first)
    fresh.close()


def test_tunes_error_at_64_devices_and_512_microbatches_is_in_view(app, browser):
    url, _ = app
    context, page = _page(browser, url)
    page.goto(f"{url}/tune")
    page.get_by_role("button", name="Search", exact=True).wait_for()
    _pick(page, "Preset", "internvl-26b")
    page.get_by_text("Units: time in ms, memory in GB", exact=True).wait_for()
    _number(page, "Devices", 64)
    _number(page, "Microbatches", 512)
    # The click sends every widget's value with it: the search runs on those just typed.
    page.get_by_role("button", name="Search", exact=True).click()
    error = page.get_by_text("no generator fits P=64, M=512 on this workload: the LLM has 48 layers but the "
                             "schedule needs 64 chunks", exact=False).first
    error.wait_for(state="visible")  # nothing to unfold
    assert error.is_visible()
    _shot(page, "tune_error_64x512.png")
    context.close()


def test_a_256_device_tune(app, browser):
    from mpipe_core.search.tune import tune

    url, _ = app
    context, page = _page(browser, url)
    page.goto(f"{url}/tune")
    page.get_by_role("button", name="Search", exact=True).wait_for()
    _pick(page, "Preset", "uniform")
    _number(page, "Devices", 256)
    _number(page, "Microbatches", 64)
    # The click sends every widget's value with it: the search runs on those just typed.
    page.get_by_role("button", name="Search", exact=True).click()
    best = page.locator('[data-testid="stMetric"]', has_text="Best makespan").locator('[data-testid="stMetricValue"]')
    best.wait_for(timeout=EVENT_MS)
    expected = tune("uniform", 256, 64, None, 15.0)
    assert best.inner_text() == human(expected.best.makespan)
    page.get_by_text("vs fused", exact=True).first.wait_for()
    _shot(page, "tune_256_devices.png", page.locator(GANTT).first)
    context.close()


def test_tune_draws_the_device_memory_line_and_marks_a_candidate_over_it(app, browser):
    # Issue 21: llava-7b on 4 A100 (80 GB) x 8 microbatches, capped at the device's memory by default:
    # three disaggregated layouts need more than 80 GB and are drawn over the line, marked.
    from mpipe_core.search.tune import tune

    url, _ = app
    context, page = _page(browser, url)
    page.goto(f"{url}/tune")
    page.get_by_role("button", name="Search", exact=True).wait_for()
    _pick(page, "Preset", "llava-7b")
    page.get_by_text("the device's memory (80 GB)", exact=True).wait_for()
    page.get_by_role("button", name="Search", exact=True).click()
    page.locator('[data-testid="stMetric"]', has_text="Best makespan").wait_for()
    expected = tune("llava-7b", 4, 8, 80.0, 15.0, cap_is_capacity=True)
    assert expected.over_cap and all(c.peak_memory > 80 for c in expected.over_cap)
    cap_name, over_name = "memory cap 80 GB (the device's memory)", "▲ over the memory cap (left out)"
    page.wait_for_function(f"() => [...document.querySelectorAll('{GANTT}')].some("
                           f"p => (p.data || []).some(t => t.name === {json.dumps(cap_name)}))")
    drawn = page.evaluate(f"""() => {{
        const gd = [...document.querySelectorAll('{GANTT}')].find(
            p => p.data.some(t => t.name === {json.dumps(cap_name)}));
        const i = gd._fullData.findIndex(t => t.name === {json.dumps(cap_name)});
        const o = gd._fullData.findIndex(t => t.name === {json.dumps(over_name)});
        const traces = gd.querySelectorAll('.scatterlayer .trace');
        gd.scrollIntoView({{block: "center"}});  // the point must be in the viewport to be hovered
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
        const over = gd._fullData[o];
        const top = over.y.indexOf(Math.max(...over.y));
        return {{line: [...gd.data[i].y], path: traces[i].querySelector('path.js-line').getAttribute('d'),
                 points: traces[o].querySelectorAll('path.point').length, terms: [...over.text],
                 colour: over.marker.color, legend: gd.querySelector('.legend').textContent,
                 at: [box.left + xa._offset + xa.l2p(over.x[top]), box.top + ya._offset + ya.l2p(over.y[top])],
                 term: over.text[top], y: over.y[top]}};
    }}""")
    assert drawn["line"] == [80, 80] and drawn["path"].startswith("M")  # the line is drawn, not only listed
    assert drawn["terms"] == [c.term for c in expected.over_cap] and drawn["points"] == len(expected.over_cap)
    assert drawn["colour"] == "#cb181d" and cap_name in drawn["legend"] and over_name in drawn["legend"]
    page.mouse.move(*drawn["at"])
    hover = page.locator(".hoverlayer .hovertext").first
    hover.wait_for()
    text = hover.text_content()
    assert drawn["term"] in text and f"▲ over the memory cap by {quantity(drawn['y'] - 80, 'GB')}" in text
    _shot(page, "tune_capacity_line.png", page.locator(GANTT).first)
    context.close()
