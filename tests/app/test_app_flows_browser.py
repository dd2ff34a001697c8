"""The main flows in a real browser (Playwright on Debian's chromium), each
asserting what a user sees: texts, bar counts, tooltip values.

The worker's part of a run (claiming it, recording op timings, finishing)
is played by the test through the storage API with the simulator's timings,
so the flow needs no torch and its numbers are known; the worker itself is
tested under tests/worker."""
from __future__ import annotations

import re

import pytest
from app_helpers import served_app
from browser_helpers import GANTT, WAIT_MS, expected_bars, wait_bars

from mpipe_core.api import evaluate
from mpipe_core.workloads.units import human, quantity

pytestmark = pytest.mark.slow

WL = "vit-heavy-small"


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("flows") / "app.db"
    with served_app(path) as (_, url, _, _):
        yield url, f"sqlite:///{path}"


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1600})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    yield page
    context.close()


@pytest.fixture
def db(app_url):
    from storage import open_database

    database = open_database(app_url[1])
    yield database
    database.close()


def _text(page, text: str):
    page.get_by_text(text, exact=False).first.wait_for()


def _hover_first_op(page) -> str:
    """Move the mouse to the centre of an op bar and read its tooltip."""
    bar = page.locator(f"{GANTT} .barlayer .trace:nth-child(3) .point path").nth(2)
    box = bar.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    label = page.locator(".hoverlayer .hovertext")
    label.first.wait_for()
    return label.first.text_content()


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_design_save_launch_watch_live_then_measured_vs_predicted(app_url, page, db):
    from storage import add_timings, claim_next_run, finish_run, list_runs

    url, _ = app_url
    term = "transpose(1f1b(p=2, m=4), mode=dynamic)"
    page.goto(url)
    editor = page.get_by_role("textbox", name="Term", exact=True)
    editor.wait_for()
    editor.fill(term)
    editor.press("Control+Enter")
    wait_bars(page, expected_bars(term, WL))
    ev = evaluate(term, WL)
    page.wait_for_function("m => document.querySelector('[data-testid=\"stMetricValue\"]').innerText === m",
                           arg=human(ev.timeline.makespan))
    # A tooltip's duration is its end minus its start.
    tip = _hover_first_op(page)
    start, end, duration = (_number(x) for x in re.search(
        r"start ([\d.,]+) · end ([\d.,]+) · duration ([\d.,]+) units", tip).groups())
    assert duration == pytest.approx(end - start, abs=2e-3 * max(1.0, end))
    assert re.search(r"on dev \d<br>|on dev \d", tip) and "dev dev" not in tip

    # Save it.
    page.get_by_label("Name", exact=True).fill("flow")
    page.get_by_role("button", name="Save", exact=True).click()
    _text(page, "Saved flow@1")

    # Launch it: Enter in a field queues nothing; the button does.
    page.goto(f"{url}/runs")
    steps = page.get_by_label("Training steps")
    steps.wait_for()
    steps.fill("3")
    steps.press("Enter")
    page.get_by_role("button", name="Launch", exact=True).wait_for()
    page.wait_for_timeout(2_000)  # nothing to wait for: the absence of a run is the point
    assert list_runs(db) == []
    page.get_by_role("button", name="Launch", exact=True).click()
    _text(page, "Queued run #1 of flow@1")
    [run] = list_runs(db)
    assert run.steps == 3

    # The worker claims it and records timings step by step: the page follows without a reload.
    claim_next_run(db, "flow-worker", 60)
    per_step = len(ev.timeline)
    rows = []
    for step, ms_per_unit in enumerate((2.0, 0.5, 1.0)):
        t0 = 100.0 + step * (ev.timeline.makespan * 2 / 1000 + 0.01)
        rows.append([r._replace(step=step, start=t0 + r.start * ms_per_unit / 1000,
                                end=t0 + r.end * ms_per_unit / 1000) for r in ev.timeline.records()])
    add_timings(db, run.id, rows[0])
    _text(page, f"{per_step} of {3 * per_step} op timings recorded")
    page.locator('[data-testid="stMetricValue"]', has_text="running").first.wait_for()
    add_timings(db, run.id, rows[1] + rows[2])
    _text(page, f"{3 * per_step} of {3 * per_step} op timings recorded")
    finish_run(db, run.id, "flow-worker", "succeeded", exit_code=0)

    # Measured vs predicted: the mean of the used steps, then one step, chart and title agree.
    _text(page, "Measured makespan (mean of steps 1, 2)")
    page.locator('[data-testid="stMetricValue"]', has_text="succeeded").first.wait_for()
    page.get_by_text("one step", exact=True).click()  # the step slider, with first/median/last a click away
    page.get_by_role("button", name="first (1)").click()
    _text(page, "Measured makespan (step 1)")
    page.get_by_text("Measured step 1 (lower half of each row)", exact=False).first.wait_for()
    value = page.locator('[data-testid="stMetric"]', has_text="Measured makespan (step 1)").locator(
        '[data-testid="stMetricValue"]')
    assert value.inner_text() == quantity(ev.timeline.makespan * 0.5, "ms")


def test_before_after_shows_both_panels_and_a_verdict_that_adds_up(app_url, page):
    url, _ = app_url
    page.goto(f"{url}/before_after")
    before, after = "1f1b(p=4, m=4)", "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
    total = sum(expected_bars(t, WL) for t in (before, after))
    wait_bars(page, total)
    verdict = page.get_by_text("transpose saves", exact=False).first
    verdict.wait_for()
    a, b, c = (_number(x) for x in re.search(r": ([\d.,]+) − ([\d.,]+) = ([\d.,]+) saved",
                                             verdict.inner_text()).groups())
    assert a - b == pytest.approx(c, abs=1e-3)
    assert page.get_by_text("before: 1f1b(p=4, m=4)").first.is_visible()


def test_library_fork_appears_at_once_and_diff_shows_the_change(app_url, page, db):
    from storage import save_schedule

    url, _ = app_url
    save_schedule(db, "lib-a", "1f1b(p=4, m=4)", workload=WL)
    save_schedule(db, "lib-a", "zbv(p=4, m=8)", workload=WL, update=True, message="try zbv")
    page.goto(f"{url}/library")
    search = page.get_by_role("textbox", name="Search")
    search.fill("zbv")
    search.press("Enter")
    _text(page, "Diff")
    page.get_by_role("tab", name="Diff").click()
    _text(page, "+zbv(p=4, m=8)")
    page.get_by_role("tab", name="Fork").click()
    page.get_by_label("New schedule name").fill("lib-a-fork")
    page.get_by_role("button", name="Fork", exact=True).click()
    _text(page, "Forked lib-a@2 into lib-a-fork@1")
    # Without a reload, the fork is listed and selected: its heading is drawn.
    page.get_by_role("heading", name="lib-a-fork").wait_for()
    search.fill("")
    search.press("Enter")
    page.get_by_role("heading", name="lib-a-fork").wait_for()


def test_compare_draws_each_term_in_a_panel_of_one_axis(app_url, page):
    url, _ = app_url
    page.goto(f"{url}/compare")
    terms = ["1f1b(p=4, m=4)", "transpose(1f1b(p=4, m=4))", "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"]
    wait_bars(page, sum(expected_bars(t, WL) for t in terms))
    _text(page, "Schedules (3)")
    tip = _hover_first_op(page)
    start, end, duration = (_number(x) for x in re.search(
        r"start ([\d.,]+) · end ([\d.,]+) · duration ([\d.,]+)", tip).groups())
    assert duration == pytest.approx(end - start, abs=2e-3 * max(1.0, end))


def test_a_slow_evaluation_can_be_stopped_from_the_page(app_url, page):
    url, _ = app_url
    page.goto(url)
    editor = page.get_by_role("textbox", name="Term", exact=True)
    editor.wait_for()
    wait_bars(page, expected_bars("transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)", WL))
    editor.fill("zbv(p=32, m=1024)")  # about 200k ops: evaluated in a child process
    editor.press("Control+Enter")
    _text(page, "s so far (a big schedule)")
    page.get_by_role("button", name="Stop this evaluation").click()
    _text(page, "You stopped evaluating zbv(p=32, m=1024)")
    # Streamlit draws the button a moment after the notice: wait for it (fails on timeout).
    page.get_by_role("button", name="Evaluate it anyway").wait_for(state="visible")


def test_tune_searches_then_opens_a_candidate_in_the_designer(app_url, page):
    from mpipe_core.search.tune import tune

    url, _ = app_url
    page.goto(f"{url}/tune")
    page.get_by_label("Devices", exact=True).fill("2")
    page.get_by_label("Microbatches", exact=True).fill("4")
    page.get_by_label("Microbatches", exact=True).press("Tab")
    page.get_by_role("button", name="Search", exact=True).click()
    _text(page, "candidates evaluated")
    expected = tune("vit-heavy-small", 2, 4, None, 15.0)
    # The scatter: one marker per candidate, and both baselines.
    page.wait_for_function(
        f"() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace:first-child .point').length"
        f" === {len(expected.candidates)}")
    legend = page.locator(".js-plotly-plot .legend").first.text_content()
    assert "fused baseline" in legend and "balanced baseline" in legend and "Pareto front" in legend
    page.get_by_role("button", name="Open in the Designer").click()
    editor = page.get_by_role("textbox", name="Term", exact=True)
    editor.wait_for()
    assert editor.input_value() == expected.best.term
    page.wait_for_function("m => document.querySelector('[data-testid=\"stMetricValue\"]').innerText === m",
                           arg=human(expected.best.makespan))
