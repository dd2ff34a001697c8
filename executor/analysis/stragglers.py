"""The slow card: which ranks of a job's step summary are off the others.

    report = find_stragglers(step_figures_for(db, run_id), threshold=0.05)
    report.flagged        # the ranks more than 5% from their stage's median

What is compared is each rank's busy time per step (Computing +
Communication(Not Overlapped and Exclude Receive), `step_summary.StepRow.busy`):
the work the card did itself.  A step's span is the same on every rank of a
synchronous job (a fast card waits for the slow one, in its bubble or free
time), so a slow card shows in its busy time, not in its step span.

Each rank's mean busy time over the steps is set against the median of its
pipeline stage (the ranks of its PP Index; stages do different work, the first
one an encoder, so a stage is only compared with itself) and the median of
the job.  A rank more than `threshold` (5%, msprof-analyze's guidance for a
slow card) from its stage's median is flagged: slow above, fast below.
Without PP indexes the whole job is one stage.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from mpipe_core.errors import MpipeError
from mpipe_core.formats.step_summary import StepRow

THRESHOLD = 0.05
MS = 1e3


@dataclass
class RankSpeed:
    rank: int
    dp: int | None
    pp: int | None
    tp: int | None
    busy_ms: float  # mean over the steps
    stage_median_ms: float
    job_median_ms: float
    vs_stage: float  # busy / stage median - 1
    vs_job: float
    flag: str  # "slow", "fast" or ""


@dataclass
class StragglerReport:
    threshold: float
    steps: list[int]
    ranks: list[RankSpeed]
    busy_ms: np.ndarray  # [rank index, step index] busy time (nan: the rank has no row for that step)
    step_vs_stage: np.ndarray  # [rank index, step index] busy / that step's stage median - 1

    @property
    def flagged(self) -> list[RankSpeed]:
        return [r for r in self.ranks if r.flag]

    def as_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "steps": self.steps, "flagged": [r.rank for r in self.flagged],
                "ranks": [asdict(r) for r in self.ranks]}

    def format(self, run_id: int) -> str:
        stages = sorted({r.pp for r in self.ranks if r.pp is not None})
        lines = [f"run {run_id}: {len(self.ranks)} ranks over steps {_steps(self.steps)}; each rank's mean busy "
                 f"time (computing + communication other than receives) against the median of its "
                 + ("pipeline stage" if stages else "job (no PP Index: one stage)")
                 + f"; flagged beyond {self.threshold:.1%}"]
        if stages:
            medians = {}
            for r in self.ranks:
                medians.setdefault(r.pp, r.stage_median_ms)
            lines.append("stage medians (ms): " + ", ".join(f"pp{s} {medians[s]:.3f}" for s in stages)
                         + f"; job median {self.ranks[0].job_median_ms:.3f}")
        else:
            lines.append(f"job median (ms): {self.ranks[0].job_median_ms:.3f}")
        if not self.flagged:
            lines.append(f"no rank is more than {self.threshold:.1%} from its stage's median")
            return "\n".join(lines)
        lines.append(f"{len(self.flagged)} rank(s) flagged:")
        header = ["rank", "dp/pp/tp", "busy ms", "stage median", "vs stage", "vs job", ""]
        rows = [[str(r.rank), f"{_i(r.dp)}/{_i(r.pp)}/{_i(r.tp)}", f"{r.busy_ms:.3f}", f"{r.stage_median_ms:.3f}",
                 f"{r.vs_stage:+.1%}", f"{r.vs_job:+.1%}", r.flag] for r in self.flagged]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        return "\n".join(lines)


def _i(value: int | None) -> str:
    return "-" if value is None else str(value)


def _steps(steps: list[int]) -> str:
    if len(steps) > 2 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}..{steps[-1]}"
    return ", ".join(map(str, steps))


def find_stragglers(rows: Sequence[StepRow], threshold: float = THRESHOLD) -> StragglerReport:
    """Each rank's busy time against its stage's and the job's median; ranks beyond `threshold` flagged."""
    if not rows:
        raise MpipeError("no step summary to look for slow ranks in (import a step_trace_time.csv or "
                         "cluster_step_trace_time.csv)")
    if not 0 < threshold < 10:
        raise MpipeError(f"--threshold must be in (0, 10), not {threshold:g}")
    ranks = sorted({r.rank for r in rows})
    steps = sorted({r.step for r in rows})
    at_rank = {r: i for i, r in enumerate(ranks)}
    at_step = {s: j for j, s in enumerate(steps)}
    busy = np.full((len(ranks), len(steps)), np.nan)
    index: dict[int, tuple[int | None, int | None, int | None]] = {}
    for r in rows:
        busy[at_rank[r.rank], at_step[r.step]] = r.busy * MS
        index.setdefault(r.rank, (r.dp, r.pp, r.tp))
    stage = np.array([index[r][1] if index[r][1] is not None else -1 for r in ranks])
    mean = np.nanmean(busy, axis=1)
    job_median = float(np.median(mean))
    step_vs_stage = np.full_like(busy, np.nan)
    out = []
    stage_median: dict[int, float] = {}
    for s in np.unique(stage):
        members = stage == s
        stage_median[int(s)] = float(np.median(mean[members]))
        per_step = np.nanmedian(busy[members], axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            step_vs_stage[members] = busy[members] / per_step - 1.0
    for i, rank in enumerate(ranks):
        median = stage_median[int(stage[i])]
        vs_stage = mean[i] / median - 1.0 if median else 0.0
        vs_job = mean[i] / job_median - 1.0 if job_median else 0.0
        flag = "slow" if vs_stage > threshold else "fast" if vs_stage < -threshold else ""
        dp, pp, tp = index[rank]
        out.append(RankSpeed(rank, dp, pp, tp, float(mean[i]), median, job_median, float(vs_stage), float(vs_job),
                             flag))
    return StragglerReport(threshold, steps, out, busy, step_vs_stage)
