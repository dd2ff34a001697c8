"""Issue 32's browser flows (Playwright on Debian's chromium, the fixtures and
helpers of the second pass's flows): every suggestion the app offers, clicked
on the README's examples and on a balanced(...) term, evaluates; Compare's
tables fit the page at 1,500 px.  Screenshots go to test-output/issue32/."""
from __future__ import annotations

from pathlib import Path

import pytest
from app_helpers import served_app
from browser_helpers import TITLES, WAIT_MS, expected_bars, wait_bars
from test_app_second_pass_browser import _pick

from mpipe_core.workloads.workload import load_workload, with_parallel

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-output" / "issue32"  # git-ignored
INTERNVL_TP8_SP = with_parallel(load_workload("internvl-26b"), {"tp": 8, "sp": True})
INTERNVL_TP8_SP_LABEL = "internvl-26b tp=8,sp"
# The buttons that put a suggested term in the Designer's editor, by the start of their label.
SUGGESTIONS = ("Show the fused baseline: ", "Transpose it: ", "Transpose its body instead: ")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    path = tmp_path_factory.mktemp("third-pass") / "app.db"
    with served_app(path) as (_, url, _, _):
        yield url, f"sqlite:///{path}"


def _page(browser, url: str, width: int = 1400):
    context = browser.new_context(viewport={"width": width, "height": 1500})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    return context, page


def _shot(page, name: str, at=None) -> None:
    """The viewport, scrolled to `at` (Streamlit scrolls its own container)."""
    if at is not None:
        at.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)  # the last frame
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name))


def _write_term(page, term: str) -> None:
    editor = page.get_by_role("textbox", name="Term", exact=True)
    editor.fill(term)
    editor.press("Control+Enter")


def _designer_shows(page, term: str, workload) -> None:
    """The Designer's chart is `term`'s on `workload` (its title names both) with every bar drawn."""
    page.wait_for_function(f"t => ({TITLES})().some(s => s.startsWith(t + ' on '))", arg=term)
    titles = page.evaluate(TITLES)
    # Said at once: on another workload the bars would never add up (a lost setting once waited out the bound).
    assert f"{term} on {_label(workload)}" in titles, titles
    wait_bars(page, expected_bars(term, workload))


def _label(workload) -> str:
    """The workload's name in the Designer's chart title."""
    return workload if isinstance(workload, str) else INTERNVL_TP8_SP_LABEL


def _internvl_tp8_sp(page, charted: bool) -> None:
    """The picker set to InternVL-26B with tp=8 and sp, each change waited for (in
    the Designer's chart title too when `charted`; else the page is Tune's)."""
    from playwright.sync_api import expect

    def shown(label: str, tune_caption: str | None = None) -> None:
        """Each change applied by the server before the next (Tune has no chart: its devices caption)."""
        if charted:
            page.wait_for_function(f"t => ({TITLES})().some(s => s.endsWith(t))", arg=label)
        elif tune_caption:
            page.get_by_text(f"Devices in all: {tune_caption}", exact=False).wait_for()

    _pick(page, "Preset", "internvl-26b")
    shown(" on internvl-26b", "4 (2 NPUs, 2 dies each)")
    if charted:  # the Designer's settings are folded; Tune's open
        page.get_by_text("Parallel settings (tp, cp, dp, encoder sharding, sp, flash attention, distributed "
                         "optimizer)").click()
    tp = page.get_by_label("Tensor parallel (tp)", exact=True)
    tp.fill("8")
    tp.press("Enter")
    shown(" on internvl-26b tp=8", "32 (tp 8 × pp 4; 16 NPUs, 2 dies each)")
    page.get_by_text("Sequence parallel", exact=True).click()
    expect(page.get_by_role("checkbox", name="Sequence parallel")).to_be_checked(timeout=WAIT_MS)
    shown(" on internvl-26b tp=8,sp")


def _suggestions(page) -> dict[str, str]:
    """The suggested terms the Designer offers now, by their buttons' labels."""
    labels = page.locator('[data-testid="stButton"] button').all_inner_texts()
    return {label.split(": ", 1)[1]: label for label in labels if label.startswith(SUGGESTIONS)}


def _click_each_suggestion(page, term: str, workload, seen: set[str]) -> None:
    """Every suggestion offered for `term`, clicked: it lands in the editor and
    evaluates (its Gantt chart drawn, bar for bar, no error); then those it offers."""
    _write_term(page, term)
    _designer_shows(page, term, workload)
    for suggested, label in _suggestions(page).items():
        if suggested in seen:
            continue
        seen.add(suggested)
        _write_term(page, term)
        _designer_shows(page, term, workload)
        page.get_by_role("button", name=label, exact=True).click()
        _designer_shows(page, suggested, workload)
        assert page.get_by_role("textbox", name="Term", exact=True).input_value() == suggested
        assert not [e for e in page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
                    if not e.startswith("Does not fit in ")], suggested
        _click_each_suggestion(page, suggested, workload, seen)


def test_every_suggestion_on_the_readmes_examples_and_on_balanced_evaluates_when_clicked(app, browser):
    url, _ = app
    context, page = _page(browser, url)
    page.goto(url)
    # The README's eval and compare terms, on vit-heavy-small (the landing page's workload).
    landing = "transpose(1f1b(p=4, m=4), mode=dynamic, shards=4)"
    _designer_shows(page, landing, "vit-heavy-small")
    seen: set[str] = set()
    for term in (landing, "1f1b(p=4, m=4)", "colocated(1f1b(p=4, m=4))",
                 "disaggregate(1f1b(p=3, m=4), encoder_devices=1)"):
        _click_each_suggestion(page, term, "vit-heavy-small", seen)
    assert {"1f1b(p=4, m=4)", "transpose(1f1b(p=4, m=4), mode=dynamic)"} <= seen
    # Before / after from the Designer's term: the pair it offers evaluates, both panels drawn.
    _write_term(page, landing)
    _designer_shows(page, landing, "vit-heavy-small")
    page.get_by_role("link", name="Before / after transpose side by side").click()
    page.get_by_role("button", name="Take both from the Designer's term").click()
    wait_bars(page, expected_bars("1f1b(p=4, m=4)", "vit-heavy-small") + expected_bars(landing, "vit-heavy-small"))
    page.get_by_text("transpose saves", exact=False).first.wait_for()
    # The README's tune: InternVL-26B, tp=8 and sequence parallelism; its best is balanced(zbv(p=8, m=16)).
    page.goto(url)
    _designer_shows(page, landing, "vit-heavy-small")
    _internvl_tp8_sp(page, charted=True)
    balanced = "balanced(zbv(p=8, m=16))"
    _write_term(page, balanced)
    _designer_shows(page, balanced, INTERNVL_TP8_SP)
    assert not page.get_by_role("button", name="Transpose it:", exact=False).count()  # it would fail
    page.get_by_text("transpose(balanced(zbv(p=8, m=16)), mode=dynamic) is not offered: transpose: "
                     "balanced(...) already folded the encoders", exact=False).wait_for()
    _shot(page, "designer_balanced_offers_its_body_transposed.png",
          page.get_by_role("button", name="Transpose its body instead:", exact=False))
    _click_each_suggestion(page, balanced, INTERNVL_TP8_SP, seen)
    assert "transpose(zbv(p=8, m=16), mode=dynamic)" in seen
    context.close()


def test_tunes_suggestions_on_the_readmes_search_open_and_evaluate(app, browser):
    url, _ = app
    context, page = _page(browser, url)
    page.goto(f"{url}/tune")
    page.get_by_role("button", name="Search", exact=True).wait_for()
    _internvl_tp8_sp(page, charted=False)
    page.get_by_text("Units: time in ms, memory in GB", exact=True).wait_for()
    for label, value in (("Devices", 8), ("Microbatches", 16)):
        field = page.get_by_label(label, exact=True)
        field.fill(str(value))
        field.press("Tab")
    page.get_by_text("Devices in all: 64 (tp 8 × pp 8; 32 NPUs, 2 dies each)", exact=False).wait_for()
    page.get_by_role("button", name="Search", exact=True).click()
    page.get_by_text("candidates evaluated", exact=False).first.wait_for()
    _shot(page, "tune_every_baseline_one_count_both_bounds.png", page.get_by_text("Baselines", exact=True))
    # The picked candidate (the best) in the Designer, on the workload searched: it evaluates.
    page.get_by_role("button", name="Open in the Designer").click()
    editor = page.get_by_role("textbox", name="Term", exact=True)
    editor.wait_for()
    best = editor.input_value()
    _designer_shows(page, best, INTERNVL_TP8_SP)
    # Back to Tune (the results stay in the session): Before / after against the fused baseline evaluates too.
    page.get_by_role("link", name="Tune", exact=True).click()
    page.get_by_role("button", name="Before / after against the fused baseline").click()
    after = page.get_by_role("textbox", name="After", exact=True)
    after.wait_for()
    assert after.input_value() == best
    before = page.get_by_role("textbox", name="Before", exact=True).input_value()
    wait_bars(page, expected_bars(before, INTERNVL_TP8_SP) + expected_bars(best, INTERNVL_TP8_SP))
    page.get_by_text("Fits after", exact=True).wait_for()
    _shot(page, "before_after_from_tune_with_the_fit.png", page.get_by_text("Fits after", exact=True))
    context.close()


def test_compares_tables_fit_the_page_at_1500_px(app, browser):
    url, _ = app
    context, page = _page(browser, url, width=1500)
    page.goto(f"{url}/compare")
    tables = page.locator('[data-testid="stDataFrame"]')
    tables.first.wait_for()
    page.wait_for_timeout(1500)  # the grids size their columns after the first frame
    widths = tables.evaluate_all(
        "els => els.map(el => { const s = el.querySelector('.dvn-scroller') || el;"
        " return [s.scrollWidth, s.clientWidth]; })")
    assert widths and all(scroll <= client + 1 for scroll, client in widths), widths
    _shot(page, "compare_tables_fit_1500px.png", tables.first)
    context.close()
