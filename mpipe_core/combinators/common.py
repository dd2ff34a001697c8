"""Helpers shared by combinators."""
from __future__ import annotations

from ..errors import MpipeError


class CombineError(MpipeError):
    """A combinator applied to schedules it cannot combine; the evaluator adds
    the term position."""
