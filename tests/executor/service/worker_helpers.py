"""Shared by the worker tests: a database with a saved schedule, the CLI and
worker as real subprocesses, and polling helpers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bounds import EVENT_S

ROOT = Path(__file__).resolve().parents[3]
TERM = "1f1b(p=2, m=4)"


def env(pythonpath: tuple[str, ...] = (), **extra: str) -> dict:
    """The CLI's environment: this tree first on PYTHONPATH (then `pythonpath`), plus `extra`."""
    out = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), *pythonpath)), MPIPE_USER="tester")
    out.pop("MPIPE_DB_URL", None)
    out.pop("MPIPE_LAUNCHER", None)
    out.pop("MPIPE_MODELS", None)
    out.update(extra)
    return out


def mpipe(*args: str, timeout: float = EVENT_S, environ: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpipe_cli.main", *args], cwd=ROOT, env=environ or env(),
                          capture_output=True, text=True, timeout=timeout)


_EACH = """
import contextlib, io, json, sys
from mpipe_cli.main import main
done = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as end:
            code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    done.append([code, out.getvalue(), err.getvalue()])
sys.__stdout__.write("\\n@@mpipe_each@@\\n" + json.dumps(done))
"""


def mpipe_each(*argvs: list[str], timeout: float = EVENT_S,
               environ: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Several `mpipe` commands one after another in one fresh process, each through the CLI's
    `main` with its own exit code, stdout and stderr: the CLI's start-up (Python, SQLAlchemy,
    the ORM; torch where a command checks a model) is paid once, not once a command (~1 s CPU
    each, 2.6 s with torch).  For commands that do not depend on each other's process."""
    proc = subprocess.run([sys.executable, "-c", _EACH], cwd=ROOT, env=environ or env(), input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"the commands' process failed:\n{proc.stderr}"
    return [subprocess.CompletedProcess(["mpipe", *argv], code, out, err)
            for argv, (code, out, err) in zip(argvs, json.loads(proc.stdout.rsplit("\n@@mpipe_each@@\n", 1)[1]))]


def tiny_workload_file(folder: Path) -> Path:
    """The executor's `tiny` model as a core workload (ViT encoder + 8-layer LLM)."""
    from executor.runtime.model import MODEL_PRESETS
    from executor.runtime.model_workload import workload_for

    path = folder / "tiny.json"
    path.write_text(json.dumps(workload_for(MODEL_PRESETS["tiny"], name="tiny")))
    return path


def new_database(folder: Path, name: str = "s", term: str = TERM, url: str | None = None):
    """The empty database at `url` (default: an SQLite file in `folder`) with one
    schedule saved in it."""
    from storage import open_database, save_schedule

    url = url or f"sqlite:///{folder / 'mpipe.db'}"
    db = open_database(url)
    save_schedule(db, name, term, workload=str(tiny_workload_file(folder)), author="tester")
    return url, db


def force_options(db, run_id: int, options: dict) -> None:
    """Write a run's options past `enqueue`'s checks (as an older mpipe, or a hand
    edit, could): the worker must refuse them by the same rules."""
    from storage.models import Run

    def write(session) -> None:
        session.get(Run, run_id).options = options

    db.write(write)


class Worker:
    """`mpipe worker` in a subprocess of its own, its output in a file."""

    def __init__(self, url: str, folder: Path, *args: str, environ: dict | None = None):
        self.log_path = folder / f"worker-{time.monotonic_ns()}.log"
        self.run_root = folder / "runs"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mpipe_cli.main", "worker", "--db", url, "--poll", "0.2",
             "--run-root", str(self.run_root), *args],
            cwd=ROOT, env=environ or env(), stdout=self._log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def signal(self, sig) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = EVENT_S) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def wait_for(condition, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def run_processes(token: str) -> list[int]:
    """Live processes whose command line mentions `token` (a run root or run dir)."""
    from executor.service.launch import live_processes

    return live_processes(token)


def guard_processes(token: str) -> list[int]:
    """The run's parent guards (`executor.service.parent_guard`): each exits only once
    nothing it started is left."""
    guards = []
    for pid in run_processes(token):
        try:
            if b"executor.service.parent_guard" in Path(f"/proc/{pid}/cmdline").read_bytes():
                guards.append(pid)
        except OSError:
            continue
    return guards


def kill_leftovers(token: str) -> list[int]:
    pids = run_processes(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids
