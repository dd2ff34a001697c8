"""Helpers for the app tests: run the app in AppTest on a throwaway database,
and read back the Plotly figures it drew."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from benchmarks.app_server import chromium_browser, served_app, start_app_process  # noqa: F401 - for the tests
from bounds import EVENT_S

REPO = Path(__file__).resolve().parents[2]
MAIN = REPO / "app" / "main.py"
TIMEOUT_S = EVENT_S  # AppTest's bound on one script run (a loaded machine)


def start_app() -> AppTest:
    """The app's landing page, run once (MPIPE_DB_URL must point at a temp DB)."""
    return AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S).run()


def open_page(at: AppTest, page: str) -> AppTest:
    return at.switch_page(f"app_pages/{page}.py").run()


def figure(at: AppTest, index: int = 0) -> dict:
    """The index-th Plotly chart of the page, as the figure JSON sent to the browser."""
    return json.loads(at.get("plotly_chart")[index].proto.spec)


def array(value) -> np.ndarray:
    """A trace attribute: a plain list, or Plotly's typed-array encoding."""
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            dims = [int(x) for x in str(shape).split(",")]
            data = data.reshape(dims)
        return data
    return np.asarray(value)


def bars_by_trace(fig: dict) -> dict[str, int]:
    """Number of bars by trace name (summed over the panels of a stacked figure)."""
    counts: dict[str, int] = {}
    for trace in fig["data"]:
        if trace.get("type") == "bar" and trace.get("visible") != "legendonly":  # legend-only: draws nothing
            counts[trace["name"]] = counts.get(trace["name"], 0) + len(array(trace["x"]))
    return counts


def op_bar_count(fig: dict) -> int:
    """Bars that are ops (every trace except the idle one and the communication's)."""
    from app.figures import COMM_STYLES

    comm = {label for _, label in COMM_STYLES.values()}
    return sum(n for name, n in bars_by_trace(fig).items() if not name.startswith("idle") and name not in comm)


_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")


def shown(markdown: str) -> str:
    """What a Markdown element escaped with `app.formatting.plain` shows: the text as typed."""
    return _ESCAPED.sub(r"\1", markdown)


def errors(at: AppTest) -> list[str]:
    return [shown(e.value) for e in at.error]


def table_of(at: AppTest, first_column: str, has: str | None = None):
    """The value of the page's first dataframe whose first column is `first_column`
    (and that has a column `has`, if given): a read-only dataframe carries no key."""
    for frame in at.dataframe:
        columns = list(frame.value.columns)
        if columns[:1] == [first_column] and (has is None or has in columns):
            return frame.value
    raise AssertionError(f"no dataframe starting with {first_column!r}" + (f" with {has!r}" if has else "")
                         + f"; have {[list(f.value.columns) for f in at.dataframe]}")


def metric(at: AppTest, label: str) -> str:
    for m in at.metric:
        if m.label == label:
            return m.value
    raise AssertionError(f"no metric {label!r}; have {[m.label for m in at.metric]}")


def button(at: AppTest, label: str):
    for b in at.button:
        if b.label == label or b.label.startswith(label):
            return b
    raise AssertionError(f"no button {label!r}; have {[b.label for b in at.button]}")
