"""Helpers for the app tests: run the app in AppTest on a throwaway database,
and read back the Plotly figures it drew."""
from __future__ import annotations

import base64
import json
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[2]
MAIN = REPO / "app" / "main.py"
TIMEOUT_S = 60
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]
START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served_app(db_path: Path, *args: str):
    """`mpipe app --no-worker` on a free port and `db_path`: yields (process,
    url, port, output lines); stopped as Ctrl-C would on the way out."""
    import pytest

    port = free_port()
    proc, lines, ready = start_app_process(
        ["--no-worker", "--port", str(port), "--db", str(db_path), *args], MPIPE_USER="browser-test")
    if not ready.wait(START_TIMEOUT_S):
        proc.kill()
        pytest.fail(f"mpipe app did not start within {START_TIMEOUT_S} s:\n{''.join(lines)}")
    try:
        yield proc, f"http://127.0.0.1:{port}", port, lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def chromium_browser():
    """Playwright driving Debian's chromium (never `playwright install`)."""
    import pytest
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (scripts/test.sh does it)",
                    pytrace=False)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def start_app_process(args: list[str], **env_extra: str) -> tuple[subprocess.Popen, list[str], threading.Event]:
    """`mpipe app ARGS` as a real process: its output lines, collected as they
    come, and an event set once it says it is running."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **env_extra)
    env.pop("MPIPE_DB_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "mpipe_cli.main", "app", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Mpipe is running at"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, ready


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
        if trace.get("type") == "bar":
            counts[trace["name"]] = counts.get(trace["name"], 0) + len(array(trace["x"]))
    return counts


def op_bar_count(fig: dict) -> int:
    """Bars that are ops (every trace except the idle one)."""
    return sum(n for name, n in bars_by_trace(fig).items() if not name.startswith("idle"))


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


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
