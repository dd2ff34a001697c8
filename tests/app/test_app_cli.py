"""`mpipe app`: arguments, one-line errors, and stopping the app with its worker."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from app_helpers import start_app_process

from mpipe_cli.app_commands import worker_available
from mpipe_cli.main import main
from bounds import EVENT_S

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _other_addresses() -> list[str]:
    """IPv4 addresses of this machine other than 127.0.0.1 on which a socket bound to
    0.0.0.0 is reachable: another loopback address, and the host's own, if any."""
    candidates = {"127.0.0.2"}
    try:
        candidates |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        pass
    candidates.discard("127.0.0.1")
    reachable = []
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        probe_port = listener.getsockname()[1]
        for address in sorted(candidates):
            with socket.socket() as s:
                s.settimeout(2)
                if s.connect_ex((address, probe_port)) == 0:
                    reachable.append(address)
    return reachable


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen, list[str], threading.Event]:
    return start_app_process(args)


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["app", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--db URL", "--port PORT", "--host HOST", "--no-worker"):
        assert flag in out
    assert "127.0.0.1" in out


def test_bad_port_and_bad_database_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as usage:
        main(["app", "--port", "0", "--db", str(tmp_path / "a.db")])
    assert usage.value.code == 2
    assert capsys.readouterr().err.endswith("error: argument --port: must be from 1 to 65535, got 0\n")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["app", "--no-worker", "--db", str(blocker / "sub" / "a.db")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_the_worker_command_is_detected():
    assert worker_available()


@pytest.mark.slow
def test_killing_the_app_outright_stops_its_children(tmp_path):
    port = _free_port()
    proc, lines, ready = _start(["--no-worker", "--port", str(port), "--db", str(tmp_path / "a.db")], tmp_path)
    assert ready.wait(EVENT_S), "".join(lines)
    proc.kill()  # SIGKILL: no chance to stop anything itself
    proc.wait()
    deadline = time.monotonic() + EVENT_S  # a bound on the event, not its expected time (a loaded machine)
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(0.2)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "streamlit outlived a SIGKILLed mpipe app"


@pytest.mark.slow
def test_a_busy_port_is_reported(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, lines, _ = _start(["--no-worker", "--port", str(port), "--db", str(tmp_path / "a.db")], tmp_path)
        assert proc.wait(timeout=EVENT_S) == 1
    assert lines.ended.wait(60), "".join(lines)
    assert f"is port {port} free?" in "".join(lines)


@pytest.mark.slow
def test_app_starts_a_worker_and_sigterm_stops_both(tmp_path):
    port = _free_port()
    proc, lines, ready = _start(["--port", str(port), "--db", str(tmp_path / "a.db")], tmp_path)
    try:
        assert ready.wait(EVENT_S), "".join(lines)
        banner = next(line for line in lines if line.startswith("Mpipe is running at"))
        assert f"http://localhost:{port}" in banner and "worker pid" in banner
        worker_pid = int(banner.split("worker pid ")[1].split(")")[0])
        assert _alive(worker_pid)
        # Only on 127.0.0.1 by default: reachable there, refused on every other address of
        # this machine (each shown to accept connections to a socket bound to all interfaces).
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) == 0
        others = _other_addresses()
        assert others
        for address in others:
            with socket.socket() as s:
                assert s.connect_ex((address, port)) != 0, f"the app answers on {address}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EVENT_S) == 0
        deadline = time.monotonic() + EVENT_S  # a bound on the event, not its expected time
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker_pid)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
        assert lines.ended.wait(60), "".join(lines)
        assert any("stopping the app and the worker" in line for line in lines)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=EVENT_S)
