"""'Did you mean ...?' for misspelled names."""
from __future__ import annotations

import difflib
from typing import Iterable


def closest(word: str, candidates: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None
