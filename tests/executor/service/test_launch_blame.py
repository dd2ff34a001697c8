"""Which rank a failed run blames when several died: the launcher's own order, without a run."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from executor.service.launch import LaunchOptions, _alive, _killed_by, _Watcher
from bounds import EVENT_S


def watcher(gone: dict[int, float], signals: dict[int, int] | None = None) -> _Watcher:
    w = _Watcher(proc=None, run_dir=None, opts=LaunchOptions(nproc=2), run_id="x", on_result=None)
    w.gone = dict(gone)
    w.signals = dict(signals or {})
    return w


STATUSES = {0: {"phase": "waiting", "op": "llm:0BW2", "step": 0},
            1: {"phase": "computing", "op": "llm:1F2", "step": 0}}


def test_of_two_ranks_seen_gone_in_one_poll_the_one_computing_is_blamed_not_the_one_waiting():
    msg, rank, op = watcher({0: 5.0, 1: 5.0})._explain([], STATUSES, "fallback")
    assert (rank, op) == (1, "llm:1F2")
    assert msg == "rank 1 died during op llm:1F2 (step 0, computing) without reporting an error (killed or crashed)"


def test_a_rank_torchrun_stopped_with_sigterm_is_a_casualty_even_when_seen_first():
    w = watcher({0: 4.0, 1: 5.0}, {0: signal.SIGTERM, 1: signal.SIGKILL})
    assert w._explain([], STATUSES, "fallback")[1] == 1


def test_otherwise_the_first_rank_gone_is_blamed():
    assert watcher({0: 4.0, 1: 5.0})._explain([], STATUSES, "fallback")[1] == 0


def test_the_signal_that_ended_a_process_is_read_from_its_zombie():
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        proc.send_signal(sig)
        deadline = time.monotonic() + EVENT_S
        while _killed_by(proc.pid) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _killed_by(proc.pid) == sig
        proc.wait()
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    deadline = time.monotonic() + EVENT_S
    while _alive(proc.pid) and time.monotonic() < deadline:  # until it is a zombie, not reaped yet
        time.sleep(0.02)
    assert not _alive(proc.pid) and proc.returncode is None
    assert _killed_by(proc.pid) is None  # a zombie that exited by itself
    assert proc.wait() == 3
