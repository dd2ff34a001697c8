"""`python -m executor.service.parent_guard [--grace S] PID CMD ARGS...`: run CMD,
and when the process that started us (PID) dies, end CMD and everything it started.

The queue worker starts every run through this, so a worker that is killed
outright (SIGKILL, OOM) takes its torchrun and torchrun's ranks with it; `mpipe
app` starts its Streamlit server and its worker through it too.

How, on Linux, without depending on anyone's timing:

* the guard asks for `PR_SET_PDEATHSIG` (SIGUSR1 to itself when the thread that
  started it ends; in the worker that is the run's own supervising thread,
  which lives until the run is over), then checks that PID is still its
  parent (it may have died before the signal was armed);
* it makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every
  process CMD starts stays one of its descendants, even those in sessions of
  their own (torchrun starts each rank in one) whose parent has died;
* when the parent dies, or the guard gets SIGTERM/SIGINT/SIGHUP, it sends CMD
  SIGTERM, waits up to `--grace` seconds (default 60) for it to exit, then
  SIGKILLs every descendant left and repeats until there is none.  When CMD
  exits on its own, any descendant it left behind is killed the same way.

The guard exits with CMD's status (128 + N when signal N ended it) only once
no descendant is left: "the guard has exited" means "everything it started is
gone".  Elsewhere it only execs CMD.
"""
from __future__ import annotations

import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_DIED = signal.SIGUSR1  # what the kernel sends the guard when its parent's thread ends
DEFAULT_GRACE_S = 60.0
POLL_S = 0.05
SWEEP_LIMIT_S = 120.0  # stop sweeping after this (a process that survives SIGKILL is stuck in the kernel)


def main(argv: list[str]) -> int:
    grace = DEFAULT_GRACE_S
    if argv[:1] == ["--grace"] and len(argv) > 1:
        try:
            grace = float(argv[1])
        except ValueError:
            return _usage()
        argv = argv[2:]
    if len(argv) < 2 or not argv[0].isdigit():
        return _usage()
    parent, command = int(argv[0]), argv[1:]
    if not sys.platform.startswith("linux"):
        os.execvp(command[0], command)
        return 127  # pragma: no cover - execvp does not return
    import ctypes

    stop: list[int] = []  # the signals that asked the guard to stop

    def on_signal(signum, _frame) -> None:
        stop.append(signum)

    # Handlers first: from here on, no signal can kill the guard before it has cleaned up.
    for sig in (PARENT_DIED, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, PARENT_DIED, 0, 0, 0)
    if os.getppid() != parent:  # it died before the signal was armed
        return 1
    # Python's handlers are not inherited across exec: CMD starts with the default dispositions.
    # Spawned without a Popen object: a discarded Popen polls its child when collected, and on a
    # loaded machine CMD could exit before that, be reaped there, and leave the guard waiting
    # for a status it never sees (seen once, a test guard waiting its whole 120 s).
    try:
        child = os.posix_spawnp(command[0], command, os.environ)
    except OSError as error:  # a launcher that is not installed, say: one line, as a shell says it
        sys.stderr.write(f"error: cannot start {command[0]}: {error.strerror}\n")
        return 127
    reaper = _Reaper(child)
    while reaper.status is None and not stop:
        reaper.reap()
        time.sleep(POLL_S)  # a signal runs its handler, then the sleep resumes (PEP 475): seen within POLL_S
    if reaper.status is None:
        _signal(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while reaper.status is None and time.monotonic() < deadline:
            reaper.reap()
            time.sleep(POLL_S)
    kill_descendants(reaper)
    return reaper.status if reaper.status is not None else 128 + signal.SIGKILL


def _usage() -> int:
    sys.stderr.write("usage: python -m executor.service.parent_guard [--grace SECONDS] PARENT_PID CMD [ARGS...]\n")
    return 2


class _Reaper:
    """Reaps every exited child (the guard is a subreaper: orphans become its
    children) and keeps CMD's exit status when CMD is among them."""

    def __init__(self, child: int):
        self.child = child
        self.status: int | None = None

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                code = os.waitstatus_to_exitcode(status)
                self.status = code if code >= 0 else 128 - code


def descendants() -> list[int]:
    """Live (not zombie) processes below this one, from /proc."""
    root = os.getpid()
    children: dict[int, list[int]] = {}
    zombie: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid, state, ppid = int(entry), fields[0], int(fields[1])
        children.setdefault(ppid, []).append(pid)
        if state in (b"Z", b"X"):
            zombie.add(pid)
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            if pid not in zombie:
                found.append(pid)
    return found


def kill_descendants(reaper: _Reaper) -> None:
    """SIGKILL every descendant until none is left (reaping as they go)."""
    deadline = time.monotonic() + SWEEP_LIMIT_S
    while time.monotonic() < deadline:
        reaper.reap()
        left = descendants()
        if not left:
            break
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(POLL_S)
    reaper.reap()


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
