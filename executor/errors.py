"""Every error the executor raises, in one place (torch-free: the app and the
analysis import it).

`MpipeError` subclasses are the user's to fix and become one `error: ...` line
with exit code 2 in the CLI; the `RuntimeError` ones are failures inside a
running rank, caught and reported by the rank entry point / launcher.
"""
from __future__ import annotations

from mpipe_core.errors import MpipeError


class ExecutorError(MpipeError):
    """A schedule the executor cannot run (or a run that failed)."""


class RunFailed(ExecutorError):
    """A launched run that did not finish: which rank and op, the partial results, the log tail."""

    def __init__(self, message: str, rank: int | None = None, op: str | None = None,
                 results: list | None = None, log: str = "", exit_code: int | None = None):
        super().__init__(message)
        # `results`: the `JobResult`s of the jobs that finished before the failure.
        self.rank, self.op, self.results, self.log = rank, op, results or [], log
        # The launched command's exit status (negative: the signal that ended it).
        self.exit_code = exit_code


class RunSpecError(MpipeError):
    """A run that cannot be launched as recorded (bad option, model mismatch)."""


class WorkerError(MpipeError):
    """A worker that cannot start as asked (bad launcher template, options)."""


class CalibrationError(MpipeError):
    """A run whose timings cannot be calibrated or compared (none, or no complete step)."""


class OpFailure(RuntimeError):
    """An op raised; carries where (rank, step, op) for the launcher's message."""

    def __init__(self, rank: int, step: int, op: str, phase: str, cause: BaseException):
        super().__init__(f"rank {rank} step {step} op {op} ({phase}): {type(cause).__name__}: {cause}")
        self.rank, self.step, self.op, self.phase, self.cause = rank, step, op, phase, cause


class TransportTimeout(RuntimeError):
    """No data (or no barrier partner) arrived within the stall limit."""
