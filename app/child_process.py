"""Child processes for the pages' long work (a big evaluation, a plan search), spawned
without re-running the page.

`multiprocessing`'s spawn start method re-imports the parent's `__main__` in the child
(from its `__file__`).  Under Streamlit `__main__` is the app script itself (Streamlit
installs it there so pickling works in user code), so every child re-ran app/main.py
outside any session: a dozen "missing ScriptRunContext" warnings on the terminal per
search, and the app's imports paid again before the work began.  `start_child` hides
that module from the spawn machinery while the child starts: the child imports only
the target's own module.
"""
from __future__ import annotations

import multiprocessing
import sys
import threading
import types
from typing import Any, Callable

_SWAP = threading.Lock()  # sessions are threads of one server: one swap of __main__ at a time


def start_child(target: Callable[..., None], args: tuple[Any, ...]):
    """`target(*args)` in a spawned daemon process (never forked: the server is threaded),
    started and returned."""
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=target, args=args, daemon=True)
    with _SWAP:
        page = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__: nothing for the child to re-run
        try:
            child.start()
        finally:
            if page is not None:
                sys.modules["__main__"] = page
    return child
