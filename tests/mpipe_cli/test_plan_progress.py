"""`mpipe plan`'s progress line on stderr: while the layouts are enumerated (no term
counted yet) it says how far that got, not an empty "0/0 terms" bar; away from a
terminal it writes a line every few seconds, in both phases."""
from __future__ import annotations

import io

from mpipe_cli.plan_commands import _Bar


def _bar(clock: list[float]) -> tuple[_Bar, io.StringIO]:
    bar = _Bar()
    bar.tty = False
    bar.time = lambda: clock[0]
    return bar, io.StringIO()


def test_the_layout_phase_says_its_count_and_the_term_phase_draws_the_bar(monkeypatch):
    clock = [100.0]
    bar, err = _bar(clock)
    monkeypatch.setattr("sys.stderr", err)
    bar(0, 0, "layouts 1/637")
    bar(0, 0, "layouts 17/637")  # 0 s later: not written
    clock[0] += 6.0
    bar(0, 0, "layouts 33/637")
    clock[0] += 6.0
    bar(300, 1200, "best 2.63 s")
    bar(1200, 1200, "done")  # the end is always written
    assert err.getvalue().splitlines() == [
        "plan: layouts 1/637",
        "plan: layouts 33/637",
        "plan: [#######.......................] 300/1200 terms  best 2.63 s",
        "plan: [##############################] 1200/1200 terms  done",
    ]
