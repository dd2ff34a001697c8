"""Per-rank step summaries an Ascend job leaves: `step_trace_time.csv` (one per
rank, in `ASCEND_PROFILER_OUTPUT/`) and msprof-analyze's
`cluster_step_trace_time.csv` (`cluster_time_summary`: every rank, and every
pipeline stage as its maximum, of a job).

Columns, microseconds (as the profiler and msprof-analyze write them, and as
msprof-analyze's own tests build them):

    step_trace_time.csv:          Device_id, Step, <figures>
    cluster_step_trace_time.csv:  Step, Type, Index, <figures>[, DP Index, PP Index, TP Index]
    <figures>: Computing, Communication(Not Overlapped), Overlapped, Communication, Free,
               Stage, Bubble, Communication(Not Overlapped and Exclude Receive)[, Preparing]

`Bubble` is the time spent in receives; `Stage` the step without it.  A rank's
step span is Computing + Communication(Not Overlapped) + Free; its busy time,
the work the card did itself, is Computing + Communication(Not Overlapped and
Exclude Receive).  In a cluster summary a `Type` of `stage` row is a pipeline
group's maximum: those are recomputed here from the rank rows (`stage_max`),
not read.  The header is checked before any row is used: the first unknown or
missing column is named.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

from mpipe_core.errors import MpipeError

FIGURES = ("Computing", "Communication(Not Overlapped)", "Overlapped", "Communication", "Free", "Stage", "Bubble",
           "Communication(Not Overlapped and Exclude Receive)")
OPTIONAL_FIGURES = ("Preparing",)
INDEXES = ("DP Index", "PP Index", "TP Index")
STEP_TRACE = ("Device_id", "Step", *FIGURES)
CLUSTER = ("Step", "Type", "Index", *FIGURES)
MAX_ROWS = 2_000_000
US = 1e-6


@dataclass
class StepRow:
    """One rank's figures in one step, seconds."""

    rank: int
    step: int
    computing: float
    comm_not_overlapped: float
    overlapped: float
    communication: float
    free: float
    stage: float
    bubble: float
    comm_exclude_receive: float
    preparing: float = 0.0
    dp: int | None = None
    pp: int | None = None
    tp: int | None = None

    @property
    def step_time(self) -> float:
        """The step's span on the card: computing, communication not overlapped, free."""
        return self.computing + self.comm_not_overlapped + self.free

    @property
    def busy(self) -> float:
        """The work the card did itself: computing and communication other than receives."""
        return self.computing + self.comm_exclude_receive


@dataclass
class StepSummary:
    source: str
    format: str  # "step_trace_time" or "cluster_step_trace_time"
    rows: list[StepRow]
    stage_rows: int = 0  # msprof-analyze's own stage rows (recomputed, not read)
    notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.rows})

    @property
    def steps(self) -> list[int]:
        return sorted({r.step for r in self.rows})

    def stage_max(self) -> dict[tuple[int, int], StepRow]:
        return stage_max(self.rows)


def stage_max(rows: list[StepRow]) -> dict[tuple[int, int], StepRow]:
    """(pp index, step) -> the maximum of each figure over that stage's ranks, as msprof-analyze's
    `stage` rows give it (ranks without a PP index are one stage, -1; `rank` is -1)."""
    out: dict[tuple[int, int], StepRow] = {}
    for r in rows:
        key = (r.pp if r.pp is not None else -1, r.step)
        m = out.get(key)
        if m is None:
            out[key] = StepRow(-1, r.step, *(getattr(r, f) for f in _NUMBERS), pp=key[0])
        else:
            for f in _NUMBERS:
                setattr(m, f, max(getattr(m, f), getattr(r, f)))
    return dict(sorted(out.items()))


_NUMBERS = ("computing", "comm_not_overlapped", "overlapped", "communication", "free", "stage", "bubble",
            "comm_exclude_receive", "preparing")


def looks_like_step_csv(name: str) -> bool:
    return name.replace("\\", "/").rsplit("/", 1)[-1].lower().endswith(".csv")


def _check_header(header: list[str], source: str) -> tuple[str, dict[str, int]]:
    names = [h.strip() for h in header]
    kind = "cluster_step_trace_time" if "Type" in names else "step_trace_time"
    required = CLUSTER if kind == "cluster_step_trace_time" else STEP_TRACE
    known = set(required) | set(OPTIONAL_FIGURES) | (set(INDEXES) if kind == "cluster_step_trace_time" else set())
    for name in names:
        if name not in known:
            raise MpipeError(f"{source}: unknown column '{name[:60]}' for a {kind}.csv "
                             f"(expected {', '.join(required)}[, Preparing])")
    for name in required:
        if name not in names:
            raise MpipeError(f"{source}: missing column '{name}' of a {kind}.csv")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise MpipeError(f"{source}: column '{name}' appears twice")
        seen.add(name)
    return kind, {n: i for i, n in enumerate(names)}


def _number(text: str, source: str, line: int, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MpipeError(f"{source}:{line}: {column} '{text[:30]}' is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise MpipeError(f"{source}:{line}: {column} {text[:30]} is not a finite number >= 0")
    return value


def _whole(text: str, source: str, line: int, column: str, empty: int | None) -> int | None:
    text = text.strip()
    if not text:
        return empty
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number.is_integer()):
            raise MpipeError(f"{source}:{line}: {column} '{text[:30]}' is not a whole number") from None
        value = int(number)
    if value < 0:
        raise MpipeError(f"{source}:{line}: {column} {value} is negative")
    return value


def parse_step_csv(data: bytes, source: str, rank: int | None = None) -> StepSummary:
    """A step_trace_time.csv (`rank`: the rank of the profiler folder it lay in; alone, its Device_id)
    or a cluster_step_trace_time.csv."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise MpipeError(f"{source}: not UTF-8 text (a CSV file?)") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header:
        raise MpipeError(f"{source}: empty; expected a step_trace_time.csv or cluster_step_trace_time.csv header")
    kind, at = _check_header(header, source)
    rows: list[StepRow] = []
    stage_rows = 0
    seen: dict[tuple[int, int], int] = {}
    for line, cells in enumerate(reader, start=2):
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise MpipeError(f"{source}:{line}: {len(cells)} cells, the header has {len(header)}")
        if len(rows) >= MAX_ROWS:
            raise MpipeError(f"{source}: more than {MAX_ROWS} rows")
        cell = lambda name: cells[at[name]].strip()  # noqa: E731
        step = _whole(cell("Step"), source, line, "Step", 0)
        if kind == "cluster_step_trace_time":
            row_type = cell("Type")
            if row_type == "stage":
                stage_rows += 1
                continue
            if row_type != "rank":
                raise MpipeError(f"{source}:{line}: Type '{row_type[:20]}' is neither rank nor stage")
            who = _whole(cell("Index"), source, line, "Index", None)
        else:
            who = rank if rank is not None else _whole(cell("Device_id"), source, line, "Device_id", None)
        if who is None:
            raise MpipeError(f"{source}:{line}: no rank ({'Index' if kind.startswith('cluster') else 'Device_id'} "
                             f"is empty)")
        figures = [_number(cell(c), source, line, c) for c in FIGURES]
        preparing = _number(cell("Preparing"), source, line, "Preparing") if "Preparing" in at and cell("Preparing") \
            else 0.0
        index = [_whole(cell(c), source, line, c, None) if c in at else None for c in INDEXES]
        assert step is not None
        if (who, step) in seen:
            raise MpipeError(f"{source}:{line}: rank {who} step {step} again (first on line {seen[who, step]})")
        seen[who, step] = line
        rows.append(StepRow(who, step, *(f * US for f in figures), preparing * US, *index))
    if not rows:
        raise MpipeError(f"{source}: no rank rows")
    return StepSummary(source, kind, rows, stage_rows)


def merge(summaries: list[StepSummary]) -> StepSummary:
    """Several ranks' step_trace_time.csv as one job's summary; two files for one rank are refused."""
    if len(summaries) == 1:
        return summaries[0]
    owner: dict[int, str] = {}
    rows: list[StepRow] = []
    for s in summaries:
        for rank in s.ranks:
            if rank in owner:
                raise MpipeError(f"two step summaries for rank {rank}: {owner[rank]} and {s.source}")
            owner[rank] = s.source
        rows.extend(s.rows)
    kinds = {s.format for s in summaries}
    return StepSummary(", ".join(s.source for s in summaries[:3]) + (" ..." if len(summaries) > 3 else ""),
                       kinds.pop() if len(kinds) == 1 else "mixed", sorted(rows, key=lambda r: (r.step, r.rank)),
                       sum(s.stage_rows for s in summaries))
