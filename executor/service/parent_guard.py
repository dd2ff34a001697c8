"""`python -m executor.service.parent_guard PID CMD ARGS...`: become CMD, and get SIGTERM
when the process that started it (PID) dies.

The queue worker starts every run through this, so a worker that is killed
outright (SIGKILL, OOM) takes its torchrun with it; torchrun, on SIGTERM,
stops its ranks.  Linux `PR_SET_PDEATHSIG`; elsewhere it only execs CMD.
The death signal is tied to the thread that started us, which in the worker
is the run's own supervising thread: it lives until the run is over.
"""
from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write("usage: python -m executor.service.parent_guard PARENT_PID CMD [ARGS...]\n")
        return 2
    parent, command = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before the signal was armed
            return 1
    os.execvp(command[0], command)
    return 127  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
