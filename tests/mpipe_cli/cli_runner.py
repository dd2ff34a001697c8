"""Run `mpipe` in this process and say how it ended: the exit code, stdout,
stderr, whether an exception escaped (a traceback for the user), the time it
took and how much the process's peak memory grew."""
from __future__ import annotations

import contextlib
import io
import resource
import time
from dataclasses import dataclass


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    traceback: str | None  # the escaped exception, if any
    seconds: float
    peak_growth_mb: float

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_cli(argv: list[str]) -> Outcome:
    """`mpipe ARGV` in-process (an escaped exception is what the user would see
    as a traceback).  Every database the command opened is closed afterwards."""
    import traceback as tb

    from mpipe_cli.main import main
    from storage import db as storage_db

    opened: list = []
    original_init = storage_db.Database.__post_init__

    def _track(self) -> None:
        original_init(self)
        opened.append(self)

    out, err = io.StringIO(), io.StringIO()
    escaped = None
    before = _peak_mb()
    start = time.perf_counter()
    storage_db.Database.__post_init__ = _track
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            except BaseException:  # noqa: BLE001 - exactly what the test looks for
                escaped = tb.format_exc()
                code = 1
    finally:
        storage_db.Database.__post_init__ = original_init
        for database in opened:
            database.close()
    return Outcome(code, out.getvalue(), err.getvalue(), escaped,
                   time.perf_counter() - start, _peak_mb() - before)
