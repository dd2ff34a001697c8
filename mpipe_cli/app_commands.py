"""`mpipe app`: the Streamlit app, with a queue worker beside it.

Starts `streamlit run app/main.py` bound to 127.0.0.1 (use `--host 0.0.0.0` to
listen on every interface), and unless `--no-worker` an `mpipe worker` on the
same database, so runs launched from the app are executed.  Both get the
database URL through $MPIPE_DB_URL.  Ctrl-C (or SIGTERM) stops both.

Sign-in: with an `[auth]` table (Streamlit's OpenID Connect settings) in
`.streamlit/secrets.toml` or in the file `--auth FILE` names, everyone signs in
and gets a role (`--roles FILE`, see `app.access_config`).  Without sign-in the
app serves this machine only: any other `--host` is refused unless `--no-auth`
says so on purpose (then every page says that anyone may do everything).
"""
from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpipe_core.errors import MpipeError

from .arg_types import add_db_argument, int_in, positive_int
from .storage_commands import add_models_argument

APP_SCRIPT = Path(__file__).resolve().parent.parent / "app" / "main.py"
# How long streamlit may take to answer before the app gives up: it starts in ~2 s idle, but
# on a loaded machine importing it can take a minute or more (it exits at once on a busy port).
HEALTH_TIMEOUT_S = 300.0
STARTING_NOTE_S = 15.0  # "still starting" every this many seconds while it does not answer
STOP_TIMEOUT_S = 10.0


def register(subparsers) -> None:
    p = subparsers.add_parser("app", help="the browser app (Streamlit) with a queue worker beside it",
                              description=__doc__.splitlines()[0])
    add_db_argument(p)
    p.add_argument("--port", type=int_in(1, 65535), default=8501, help="port to serve on (default 8501)")
    p.add_argument("--max-ops", type=positive_int, default=None, metavar="N",
                   help="refuse terms from the browser bigger than N ops (default: $MPIPE_APP_MAX_OPS, "
                        "else 500,000; the CLI's own limit is 5,000,000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; any other address, "
                        "e.g. 0.0.0.0 for every interface, needs sign-in or --no-auth)")
    signin = p.add_mutually_exclusive_group()
    signin.add_argument("--auth", metavar="FILE", default=None,
                        help="sign people in (OpenID Connect): a TOML file with Streamlit's [auth] table "
                             "(default: [auth] in .streamlit/secrets.toml, if there is one)")
    signin.add_argument("--no-auth", action="store_true",
                        help="serve without sign-in, even beyond this machine: anyone who reaches the app may "
                             "do everything (every page says so)")
    p.add_argument("--roles", metavar="FILE", default=None,
                   help="who gets which role (viewer, designer, operator) once signed in: a TOML file "
                        "(see docs/team-server.md; default: the ID token's mpipe_roles claim, else no role)")
    p.add_argument("--no-worker", action="store_true", help="do not start `mpipe worker` beside the app")
    add_models_argument(p)  # for the app and its worker
    p.set_defaults(handler=cmd_app)


class AppAccessError(MpipeError):
    """`mpipe app` asked to serve in a way that would expose it, or with a bad sign-in setup."""


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def access_settings(args) -> tuple[str, dict[str, str], list[str], str]:
    """How the app lets people in: (mode, environment for the app, extra Streamlit
    arguments, a sentence for the operator).  Refuses what would expose the app."""
    from app.access_config import (
        AUTH_ENV,
        LOCAL,
        OPEN,
        ROLES_ENV,
        SIGN_IN,
        configured_auth,
        load_roles,
        providers,
        read_auth_file,
    )

    env: dict[str, str] = {}
    extra: list[str] = []
    if args.no_auth:
        if args.roles:
            raise AppAccessError("--roles needs sign-in, which --no-auth turns off")
        mode, note = OPEN, "sign-in off (--no-auth): anyone who reaches the app may do everything"
    else:
        if args.auth:
            path = Path(args.auth).expanduser().resolve()
            auth = read_auth_file(path)
            extra = ["--secrets.files", str(path)]
            found = (path, auth)
        else:
            found = configured_auth()
        if found is None:
            mode, note = LOCAL, "no sign-in: this machine's user only, with every right"
            if args.roles:
                raise AppAccessError("--roles needs sign-in: give --auth FILE, or an [auth] table in "
                                     ".streamlit/secrets.toml")
        else:
            mode = SIGN_IN
            names = ", ".join(name or "default" for name in providers(found[1]))
            note = f"sign-in required (provider {names}, from {found[0]})"
    if mode == LOCAL and not is_loopback(args.host):
        raise AppAccessError(
            f"--host {args.host} listens beyond this machine and sign-in is not configured, so anyone who "
            f"reaches it could change the library and launch runs; configure sign-in (--auth FILE, or [auth] "
            f"in .streamlit/secrets.toml), or pass --no-auth to allow it on purpose")
    if args.roles:
        roles = Path(args.roles).expanduser().resolve()
        load_roles(roles)  # a bad file is refused now, in one line
        env[ROLES_ENV] = str(roles)
        note += f"; roles from {roles}"
    env[AUTH_ENV] = mode
    return mode, env, extra, note


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

    start = time.monotonic()
    deadline, next_note = start + timeout, start + STARTING_NOTE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if time.monotonic() >= next_note:  # a loaded machine: say so rather than sit silent
            print(f"still starting the app ({time.monotonic() - start:.0f} s)...", file=sys.stderr, flush=True)
            next_note += STARTING_NOTE_S
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


def trace_upload_mb() -> int:
    """Streamlit's per-file upload limit: the trace import's (`trace_files.trace_limit`,
    $MPIPE_TRACE_LIMIT_MB), in whole MB, so the Runs page can take every trace the import
    accepts (the Library's uploader keeps its own, smaller limit)."""
    import math

    from mpipe_core.formats.trace_files import trace_limit
    from mpipe_core.workloads.inputs import MIB

    return max(1, math.ceil(trace_limit() / MIB))


def database_note(display_url: str, given: str | None) -> str:
    """Where the app keeps its library and runs, said first: which database, and
    whether it is the per-user default every clone and every mpipe command share."""
    from storage.db import DB_URL_ENV

    if given:
        return f"database {display_url} (from --db)"
    if os.environ.get(DB_URL_ENV):
        return f"database {display_url} (from ${DB_URL_ENV})"
    return (f"database {display_url} (the default: every mpipe command and every clone run by this user share it; "
            f"--db URL or ${DB_URL_ENV} picks another)")


def cmd_app(args) -> int:
    from storage import open_database, resolve_db_url

    mode, access_env, streamlit_extra, access_note = access_settings(args)  # before anything starts
    upload_mb = trace_upload_mb()  # a bad $MPIPE_TRACE_LIMIT_MB is one line here, not in the browser
    models_env: dict[str, str] = {}
    if args.models is not None:
        from mpipe_core.runs.model_registry import ALLOW_LIST_ENV, load_registry

        # A bad file is one line here, not an error in the browser, and refused before the
        # database is created or migrated.
        load_registry(args.models)
        models_env[ALLOW_LIST_ENV] = os.path.abspath(args.models)
    url = resolve_db_url(args.db)
    db = open_database(url)  # create or migrate it now: errors are one line here, not in the browser
    shown_url = db.display_url  # without a password
    print(database_note(shown_url, args.db), flush=True)
    db.close()
    env = dict(os.environ, MPIPE_DB_URL=url, **access_env, **models_env)
    if args.max_ops is not None:
        env["MPIPE_APP_MAX_OPS"] = str(args.max_ops)
    display_host = "localhost" if args.host in ("127.0.0.1", "localhost") else args.host
    app_url = f"http://{display_host}:{args.port}"
    health_url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    if mode == "open" and not is_loopback(args.host):
        print(f"warning: --no-auth: listening on {args.host} without sign-in: anyone who can reach this "
              f"machine may change the library and launch runs", file=sys.stderr)

    # Own process groups: Ctrl-C reaches this process only, which then stops
    # both children in order (the worker marks its runs before it exits).
    # The parent-death guard sends them SIGTERM should this process be killed outright.
    guard = [sys.executable, "-m", "executor.service.parent_guard", str(os.getpid())]
    streamlit = subprocess.Popen(
        [*guard, sys.executable, "-m", "streamlit", "run", str(APP_SCRIPT), "--server.headless", "true",
         "--server.address", args.host, "--server.port", str(args.port),
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
         "--client.toolbarMode", "minimal", "--server.maxUploadSize", str(upload_mb), *streamlit_extra],
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
        print(f"Mpipe is running at {app_url}  (database {shown_url}"
              + ("" if worker is None else f", worker pid {worker.pid}") + ")", flush=True)
        print(f"Access: {access_note}.", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        worker_reported = False
        while True:
            code = streamlit.poll()
            if code is not None:
                print(f"the app exited with {code}", file=sys.stderr)
                return code or 1
            if worker is not None and not worker_reported and worker.poll() is not None:
                print(f"warning: the worker exited with {worker.returncode}; queued runs wait until a "
                      f"worker runs (`mpipe worker --db {shown_url}`)", file=sys.stderr)
                worker_reported = True
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping the app" + ("" if worker is None else " and the worker"), file=sys.stderr)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop(worker, "the worker")
        _stop(streamlit, "the app")
