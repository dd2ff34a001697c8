"""`mpipe app` as a real server and Debian's chromium under Playwright: what
the browser benchmark and the browser tests both drive."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]
START_TIMEOUT_S = 600  # a bound on the start banner (the app itself waits up to 300 s for streamlit)


class AppDidNotStart(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OutputLines(list):
    """A process's output lines as a reading thread collects them; `ended` is set once the
    process closed its output, so a test reads the last line after that event, not after a
    pause that a loaded machine may outlast."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = threading.Event()


def start_app_process(args: list[str], repo: Path = REPO,
                      **env_extra: str) -> tuple[subprocess.Popen, OutputLines, threading.Event]:
    """`mpipe app ARGS` (from checkout `repo`) as a real process: its output
    lines, collected as they come, and an event set once its whole start banner
    is in them (it ends "Press Ctrl-C to stop."): a test that reads the "Access:"
    line after "Mpipe is running at" must not race the reading thread."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(repo), **env_extra)
    env.pop("MPIPE_DB_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "mpipe_cli.main", "app", *args], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    lines = OutputLines()
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C to stop."):
                ready.set()
        lines.ended.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, ready


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child, before exec: SIGINT's default disposition, as `mpipe app` has when started
    in a terminal.  A shell's background job (`make test &`, an agent's or CI's shell) inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt: the Ctrl-C these helpers send
    was lost, each served app's stop waited out its 30 s and test_app_browser's failed."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def served_app(db_path: Path, *args: str, repo: Path = REPO):
    """`mpipe app --no-worker` on a free port and `db_path`: yields (process,
    url, port, output lines); stopped as Ctrl-C would on the way out."""
    port = free_port()
    proc, lines, ready = start_app_process(
        ["--no-worker", "--port", str(port), "--db", str(db_path), *args], repo=repo, MPIPE_USER="browser-test")
    if not ready.wait(START_TIMEOUT_S):
        proc.kill()
        raise AppDidNotStart(f"mpipe app did not start within {START_TIMEOUT_S} s:\n{''.join(lines)}")
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
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"{CHROMIUM} is missing: `apt-get install -y chromium`")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
