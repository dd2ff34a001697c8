"""`mpipe app`: the Streamlit app, with a queue worker beside it.

Starts `streamlit run app/main.py` bound to 127.0.0.1 (use `--host 0.0.0.0` to
listen on every interface), and unless `--no-worker` an `mpipe worker` on the
same database, so runs launched from the app are executed.  Both get the
database URL through $MPIPE_DB_URL.  Ctrl-C (or SIGTERM) stops both.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from .arg_types import int_in, positive_int

APP_SCRIPT = Path(__file__).resolve().parent.parent / "app" / "main.py"
HEALTH_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def register(subparsers) -> None:
    p = subparsers.add_parser("app", help="the browser app (Streamlit) with a queue worker beside it",
                              description=__doc__.splitlines()[0])
    p.add_argument("--db", metavar="URL", default=None,
                   help="database URL or SQLite file (default: $MPIPE_DB_URL, "
                        "else ~/.local/share/mpipe/mpipe.db)")
    p.add_argument("--port", type=int_in(1, 65535), default=8501, help="port to serve on (default 8501)")
    p.add_argument("--max-ops", type=positive_int, default=None, metavar="N",
                   help="refuse terms from the browser bigger than N ops (default: $MPIPE_APP_MAX_OPS, "
                        "else 500,000; the CLI's own limit is 5,000,000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; "
                        "0.0.0.0 listens on every interface — the app has no login)")
    p.add_argument("--no-worker", action="store_true", help="do not start `mpipe worker` beside the app")
    p.add_argument("--models", metavar="FILE", default=None,
                   help="the model allow-list for the app and its worker (TOML; default $MPIPE_MODELS; "
                        "docs/registering-models.md)")
    p.set_defaults(handler=cmd_app)


def worker_available() -> bool:
    """Whether this mpipe has the `worker` command."""
    import argparse

    from mpipe_cli.main import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction) and "worker" in action.choices:
            return True
    return False


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    import urllib.request  # here, not at the top: every `mpipe` command builds this module's parser

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.read().strip() == b"ok":
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def _stop(proc: subprocess.Popen | None, name: str) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"{name} did not stop within {STOP_TIMEOUT_S:.0f} s; killing it", file=sys.stderr)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def cmd_app(args) -> int:
    from storage import open_database, resolve_db_url

    url = resolve_db_url(args.db)
    open_database(url).close()  # create or migrate it now: errors are one line here, not in the browser
    env = dict(os.environ, MPIPE_DB_URL=url)
    if args.models is not None:
        from mpipe_core.model_registry import ALLOW_LIST_ENV, load_registry

        load_registry(args.models)  # a bad file is one line here, not an error in the browser
        env[ALLOW_LIST_ENV] = os.path.abspath(args.models)
    if args.max_ops is not None:
        env["MPIPE_APP_MAX_OPS"] = str(args.max_ops)
    display_host = "localhost" if args.host in ("127.0.0.1", "localhost") else args.host
    app_url = f"http://{display_host}:{args.port}"
    health_url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host}: anyone who can reach this machine can use the app "
              f"and its database (there is no login)", file=sys.stderr)

    # Own process groups: Ctrl-C reaches this process only, which then stops
    # both children in order (the worker marks its runs before it exits).
    # The parent-death guard sends them SIGTERM should this process be killed outright.
    guard = [sys.executable, "-m", "executor.service.parent_guard", str(os.getpid())]
    streamlit = subprocess.Popen(
        [*guard, sys.executable, "-m", "streamlit", "run", str(APP_SCRIPT), "--server.headless", "true",
         "--server.address", args.host, "--server.port", str(args.port),
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
         "--client.toolbarMode", "minimal"],
        env=env, start_new_session=True)
    worker = None

    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        if not args.no_worker:
            if worker_available():
                worker = subprocess.Popen([*guard, sys.executable, "-m", "mpipe_cli.main", "worker", "--db", url],
                                          env=env, start_new_session=True)
            else:
                print("note: this mpipe has no `mpipe worker` yet; runs launched from the app stay queued "
                      "until one runs against this database", file=sys.stderr)
        if not _wait_healthy(health_url, streamlit, HEALTH_TIMEOUT_S):
            code = streamlit.poll()
            print(f"error: the app did not start (streamlit "
                  f"{'exited with ' + str(code) if code is not None else 'did not answer'}); "
                  f"is port {args.port} free?", file=sys.stderr)
            return 1
        print(f"Mpipe is running at {app_url}  (database {url}"
              + ("" if worker is None else f", worker pid {worker.pid}") + ")", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        worker_reported = False
        while True:
            code = streamlit.poll()
            if code is not None:
                print(f"the app exited with {code}", file=sys.stderr)
                return code or 1
            if worker is not None and not worker_reported and worker.poll() is not None:
                print(f"warning: the worker exited with {worker.returncode}; queued runs wait until a "
                      f"worker runs (`mpipe worker --db {url}`)", file=sys.stderr)
                worker_reported = True
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping the app" + ("" if worker is None else " and the worker"), file=sys.stderr)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop(worker, "the worker")
        _stop(streamlit, "the app")
