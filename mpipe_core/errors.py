"""Errors a user can cause.  Each says what went wrong and where, and a
misspelled name gets a 'did you mean ...?' (`closest`)."""
from __future__ import annotations

import difflib
from typing import Iterable


class MpipeError(Exception):
    """Base of every error caused by user input (CLI exits 2 on these)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class TermError(MpipeError):
    """A term that does not parse, type-check or evaluate; `line`/`column` are 1-based."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        where = f"{line}:{column}: " if line is not None else ""
        super().__init__(f"{where}{message}")
        self.detail = message


class WorkloadError(MpipeError):
    """A workload file or preset that is missing, malformed or inconsistent."""


class ScheduleError(MpipeError):
    """A schedule that is not valid for its workload (missing op, duplicate, deadlock)."""

    def __init__(self, message: str, cycle: list | None = None):
        super().__init__(message)
        self.cycle = cycle or []


class SizeLimitError(MpipeError):
    """A term whose evaluation would exceed the configured op limit."""


class ArgumentError(MpipeError):
    """A generator or combinator argument that breaks a rule (`p=0`, `zbv` with v != 2).

    `argument` names the offending keyword so the term evaluator can point at it.
    """

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate `word` was most likely meant to be, for 'did you mean ...?'."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None
