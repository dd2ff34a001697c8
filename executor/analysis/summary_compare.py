"""An imported run's step summary (Ascend's step_trace_time.csv, msprof-analyze's
cluster_step_trace_time.csv) beside a prediction: per rank, its measured busy
time and bubble against the predicted busy and idle time of its pipeline
stage, with a verdict.  This is the table msprof-analyze's guidance asks users
to make by hand ("compare the bubble with the theoretical figure").

    cmp = compare_summary(db, run_id, against="1f1b(p=8, m=32)", workload="saved:cluster")
    print(cmp.format())

Measured, per rank, mean over the summary's steps (`step_summary`):
step = Computing + Communication(Not Overlapped) + Free; busy = Computing +
Communication(Not Overlapped and Exclude Receive); bubble = Bubble (the
receives); free = Free; idle = bubble + free.  Predicted, per pipeline stage
(the rank's PP Index; without one, rank r is device r): busy = the stage's op
time in the simulated step, idle = makespan - busy.  Times are ms (a workload
in seconds or microseconds is converted; a unitless one is read as ms and
`prediction_unit` says so).

The verdict compares shares, which do not depend on units: the rank's idle
share (idle / step) against the stage's predicted idle share (idle / makespan).
Within `tolerance` (5 points) it is "as predicted"; above, "more idle than
predicted"; below, "less idle than predicted".
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.formats.step_summary import StepRow

from .compare_run import LAUNCHED, MS_PER_UNIT, launch_workload, resolve_workload

MS = 1e3
TOLERANCE = 0.05


@dataclass
class RankVerdict:
    rank: int
    stage: int
    dp: int | None
    tp: int | None
    step_ms: float
    busy_ms: float
    bubble_ms: float
    free_ms: float
    idle_share: float
    predicted_busy_ms: float
    predicted_idle_ms: float
    predicted_idle_share: float
    verdict: str


@dataclass
class SummaryComparison:
    run_id: int
    term: str
    workload: str
    prediction_unit: str
    predicted_makespan_ms: float
    steps: list[int]
    ranks: list[RankVerdict]
    tolerance: float

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "term": self.term, "workload": self.workload,
                "prediction_unit": self.prediction_unit, "predicted_makespan_ms": self.predicted_makespan_ms,
                "steps": self.steps, "tolerance": self.tolerance, "ranks": [asdict(r) for r in self.ranks]}

    def format(self) -> str:
        unit = "" if self.prediction_unit else " (the workload declares no time unit: read as ms)"
        lines = [f"run {self.run_id}: step summary against {self.term} (workload {self.workload}){unit}",
                 f"measured: mean over steps {', '.join(map(str, self.steps))}; predicted makespan "
                 f"{self.predicted_makespan_ms:.2f} ms; verdict: the rank's idle share (bubble + free) / step "
                 f"against its stage's predicted idle / makespan, within {self.tolerance:.0%} points", ""]
        header = ["rank", "dp/pp/tp", "step", "busy", "bubble", "free", "idle %", "pred busy", "pred idle",
                  "pred idle %", "verdict"]
        rows = [[str(r.rank), f"{_i(r.dp)}/{r.stage}/{_i(r.tp)}", f"{r.step_ms:.2f}", f"{r.busy_ms:.2f}",
                 f"{r.bubble_ms:.2f}", f"{r.free_ms:.2f}", f"{r.idle_share:.1%}", f"{r.predicted_busy_ms:.2f}",
                 f"{r.predicted_idle_ms:.2f}", f"{r.predicted_idle_share:.1%}", r.verdict] for r in self.ranks]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        counts: dict[str, int] = {}
        for r in self.ranks:
            key = r.verdict.split(" (")[0]
            counts[key] = counts.get(key, 0) + 1
        lines += ["", "ranks: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))]
        return "\n".join(lines)


def _i(value: int | None) -> str:
    return "-" if value is None else str(value)


def verdict(measured_share: float, predicted_share: float, tolerance: float = TOLERANCE) -> str:
    gap = measured_share - predicted_share
    if abs(gap) <= tolerance:
        return "as predicted"
    points = f"{gap * 100:+.1f} pts"
    return f"more idle than predicted ({points})" if gap > 0 else f"less idle than predicted ({points})"


def compare_rows(rows: list[StepRow], evaluation, *, run_id: int, workload_label: str,
                 tolerance: float = TOLERANCE) -> SummaryComparison:
    """The table from summary rows in hand and an evaluation of the term."""
    if not rows:
        raise MpipeError(f"run {run_id} has no step summary (step_trace_time.csv or cluster_step_trace_time.csv)")
    tl = evaluation.timeline
    k = MS_PER_UNIT[evaluation.workload.time_unit]
    origin = min(tl.start, default=0.0)
    makespan = (tl.makespan - origin) * k
    busy = [0.0] * tl.devices
    for _, d, s, e in tl.rows():
        busy[d] += (e - s) * k
    by_rank: dict[int, list[StepRow]] = {}
    for r in rows:
        by_rank.setdefault(r.rank, []).append(r)
    out = []
    for rank in sorted(by_rank):
        mine = by_rank[rank]
        stage = mine[0].pp if mine[0].pp is not None else rank
        if stage >= tl.devices:
            raise MpipeError(f"rank {rank}" + (f" (PP Index {stage})" if mine[0].pp is not None else "")
                             + f" has no device in {evaluation.term}, which runs on {tl.devices} devices")
        mean = lambda f: statistics.fmean(f(r) for r in mine) * MS  # noqa: E731
        step, b, bubble, free = (mean(lambda r: r.step_time), mean(lambda r: r.busy), mean(lambda r: r.bubble),
                                 mean(lambda r: r.free))
        share = (bubble + free) / step if step else 0.0
        p_idle = makespan - busy[stage]
        p_share = p_idle / makespan if makespan else 0.0
        out.append(RankVerdict(rank, stage, mine[0].dp, mine[0].tp, step, b, bubble, free, share, busy[stage], p_idle,
                               p_share, verdict(share, p_share, tolerance)))
    return SummaryComparison(run_id, evaluation.term, workload_label, evaluation.workload.time_unit, makespan,
                             sorted({r.step for r in rows}), out, tolerance)


def compare_summary(db, run_id: int, against: str | None = None, *, workload: Any = None,
                    tolerance: float = TOLERANCE) -> SummaryComparison:
    """Run `run_id`'s step summary against `against` (default: the run's own term) on
    `workload` (default: the one it was imported with; `LAUNCHED` the same)."""
    from mpipe_core.api import evaluate_once as evaluate
    from storage import get_run, get_version
    from storage.step_figures import step_figures_for

    run = get_run(db, run_id)
    rows = step_figures_for(db, run_id)
    if not rows:
        raise MpipeError(f"run {run_id} has no step summary (step_trace_time.csv or cluster_step_trace_time.csv)")
    term = get_version(db, run.ref).term if against is None else against
    if workload is None or workload == LAUNCHED:
        doc, label = launch_workload(db, run_id)
    else:
        doc, label = resolve_workload(db, workload)
    return compare_rows(rows, evaluate(term, doc), run_id=run_id, workload_label=label, tolerance=tolerance)
