"""Traces uploaded on the Runs page in a real browser (Playwright on Debian's
chromium, `mpipe app` serving): two rank files, one of them gzipped, put into
the uploader with `set_input_files`, imported, and the run shown with its
Gantt chart.  Leaves test-output/screenshots/runs_trace_upload.png."""
from __future__ import annotations

import gzip
import time
from pathlib import Path

import pytest
from app_helpers import chromium_browser, served_app
from test_app_trace_upload import TERM, rank_traces

from storage import list_runs, open_database
from bounds import EVENT_MS

pytestmark = pytest.mark.slow

WAIT_MS = EVENT_MS  # always on a condition
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"  # git-ignored


def test_uploading_trace_files_shows_the_imported_run(tmp_path):
    files = []
    for name, data, _ in rank_traces():
        path = tmp_path / (name if name.startswith("rank0") else name + ".gz")
        path.write_bytes(data if name.startswith("rank0") else gzip.compress(data))
        files.append(str(path))
    with served_app(tmp_path / "app.db") as (_, url, _, _), chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(WAIT_MS)
        page.goto(f"{url}/runs")
        page.get_by_text("Import traces (a run another stack made)", exact=True).click()
        uploader = page.locator('[data-testid="stFileUploader"]')
        # `mpipe app` gives Streamlit the import's limit: the box says it.
        uploader.get_by_text("256MB per file", exact=False).wait_for()
        uploader.locator('input[type="file"]').set_input_files(files)
        for path in files:
            uploader.get_by_text(Path(path).name, exact=True).wait_for()
        button = page.get_by_role("button", name="Import traces", exact=True)
        page.wait_for_function("b => !b.disabled", arg=button.element_handle())
        button.click()
        page.get_by_text("Imported run #1 (imported-", exact=False).wait_for()
        page.get_by_text("· imported traces", exact=False).wait_for()
        page.locator('[data-testid="stMetric"]', has_text="Prediction error").wait_for()
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .barlayer .point').length >= 32")
        time.sleep(1.0)  # the last frame
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.get_by_text("Imported run #1 (imported-", exact=False).scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "runs_trace_upload.png"))
        page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
        time.sleep(0.5)
        page.screenshot(path=str(SHOTS / "runs_trace_upload_gantt.png"))
        db = open_database(f"sqlite:///{tmp_path / 'app.db'}")
        [run] = list_runs(db)
        db.close()
        assert run.source == "imported" and run.nproc == 2 and run.steps == 3
        assert run.log_tail.startswith(f"imported 2 file(s), kineto: rank0_trace.json, rank1_trace.json.gz\n"
                                       f"term {TERM} (inferred")
