"""Per-op timings streamed out of a running process group, step by step.

Each rank appends one JSON line per finished step to `timings.<rank>.jsonl`
in the run directory (`StepWriter`, called by `executor.runtime.rank`): its ops with
start/end already moved onto rank 0's clock (the offset every rank measured
at start-up), flushed at once.  Whoever watches the run (the queue worker)
tails those files (`StepReader`) and gets `TimelineRecord`s, the rows of the
finished run's timeline: seconds since the first step began, one per op, the
rank as the device index and the host label in `host`.  A rank
that crashes leaves every step it finished in its file.

In a world of several pipelines (dp, tp, cp > 1) a line also names the rank's
stage (`device`, the rows' device index) and its pipeline (`pipeline`: the
grid's pipelines in rank order of their first stage), and every pipeline's
ranks list their ops, so the Runs page can show any one of them.  A line's
`comm` rows time the step's collectives and optimizer step as records of
their own kind (`timeline_record.COMM_KINDS`: cp K/V gathers and their
backward `cp_comm`, dp reductions `dp_comm`, ZeRO gathers `dp_gather`,
`optimizer`); the reader passes them on with the ops.

The rows' time origin is the earliest step start of any rank in the first
step, the same origin `executor.runtime.rank` gives the timeline it returns at the
end; the reader holds rows back until every rank has reported that first
step (or the run is over), then passes each step on as soon as it is read.

On a cluster the run directory must be on a file system every node sees.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from mpipe_core.ir.timeline_record import TimelineRecord

TIMINGS_FILE = "timings.{rank}.jsonl"


class StepWriter:
    """One rank's side: a line per step, written and flushed when the step ends."""

    def __init__(self, run_dir: Path, rank: int, host: str):
        self.path = Path(run_dir) / TIMINGS_FILE.format(rank=rank)
        self.file = open(self.path, "a", encoding="utf-8")
        self.rank, self.host = rank, host
        self.job = 0
        # In a world of several pipelines (`executor.parallel.grid`): this rank's stage (its
        # device in the schedule) and its pipeline's index.
        self.device: int | None = None
        self.pipeline: int | None = None

    def write(self, record, ops, offset: float, comm=()) -> None:
        """`record` is a `runtime.StepRecord`, `ops` the rank's plan ops in order,
        `comm` the step's (kind, chunk, start, end) besides its ops (dp reductions and
        gathers, the optimizer step).

        Each op is its `TimelineRecord`'s fields less those the line holds once
        (device, step, host), plus the op's input wait; `comm` rows have the same form
        (module llm, microbatch -1, wait 0)."""
        rows = [[op.module, op.kind, op.chunk, op.mb, a - offset, b - offset, w]
                for op, a, b, w in zip((p.op for p in ops), record.start, record.end, record.wait)]
        comm_rows = [["llm", kind, chunk, -1, a - offset, b - offset, 0.0] for kind, chunk, a, b in comm]
        line = {"rank": self.rank, "job": self.job, "step": record.step, "wall": time.time(),
                "step_start": record.step_start - offset, "step_end": record.step_end - offset,
                "host": self.host, "ops": rows, "comm": comm_rows}
        if self.device is not None:
            line["device"] = self.device
        if self.pipeline:
            line["pipeline"] = self.pipeline
        self.file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


@dataclass
class StreamStats:
    rows: int = 0
    steps: int = 0  # (rank, step) records read
    max_lag_s: float = 0.0  # wall time from a step's end on its rank to the reader passing it on
    lags: list[float] = field(default_factory=list)

    def summary(self) -> str:
        if not self.lags:
            return f"streamed {self.rows} timing rows"
        lags = sorted(self.lags)
        median = lags[len(lags) // 2]
        return (f"streamed {self.rows} timing rows from {self.steps} rank-steps; lag from step end "
                f"to database: median {median:.2f} s, max {self.max_lag_s:.2f} s")


class StepReader:
    """The watcher's side: incremental reads of every rank's file (job 0 only)."""

    def __init__(self, run_dir: Path, world: int, job: int = 0):
        self.run_dir = Path(run_dir)
        self.world, self.job = world, job
        self._offsets = [0] * world
        self._partial = [""] * world
        self._held: list[dict] = []  # records waiting for the time origin
        self._first_step: dict[int, float] = {}  # rank -> its first step's start
        self.origin: float | None = None
        self._walls: list[float] = []  # step-end wall times of rows handed out, not yet committed
        self.stats = StreamStats()

    def _read_new(self) -> list[dict]:
        records = []
        for rank in range(self.world):
            path = self.run_dir / TIMINGS_FILE.format(rank=rank)
            try:
                with open(path, "rb") as fh:
                    fh.seek(self._offsets[rank])
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            if not chunk:
                continue
            self._offsets[rank] += len(chunk)
            text = self._partial[rank] + chunk.decode("utf-8", errors="replace")
            lines = text.split("\n")
            self._partial[rank] = lines.pop()  # an unfinished line waits for the rest
            for line in lines:
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if doc.get("job", 0) == self.job:
                    records.append(doc)
        return records

    def poll(self, final: bool = False) -> list[TimelineRecord]:
        """New rows since the last call.  `final`: the run is over, release everything.

        Call `committed()` once the rows are in the database (lag statistics)."""
        for doc in self._read_new():
            # A rank writes its steps in order: its first line is its first step.
            self._first_step.setdefault(doc["rank"], doc["step_start"])
            self._held.append(doc)
        if self.origin is None:
            if len(self._first_step) == self.world or (final and self._first_step):
                self.origin = min(self._first_step.values())
            else:
                return []
        rows = []
        for doc in self._held:
            self._walls.append(doc["wall"])
            for module, kind, chunk, mb, start, end, _wait in doc["ops"] + doc.get("comm", []):
                rows.append(TimelineRecord(doc.get("device", doc["rank"]), module, kind, chunk, mb, doc["step"],
                                           start - self.origin, end - self.origin, doc.get("host", ""),
                                           doc.get("pipeline", 0)))
        self._held = []
        self.stats.rows += len(rows)
        return rows

    def committed(self) -> None:
        """The rows of the last `poll` reached the database now."""
        now = time.time()
        for wall in self._walls:
            lag = max(0.0, now - wall)
            self.stats.steps += 1
            self.stats.lags.append(lag)
            self.stats.max_lag_s = max(self.stats.max_lag_s, lag)
        self._walls = []


def host_label(device) -> str:
    """A timing record's `host`: host name and torch device."""
    host = os.uname().nodename if hasattr(os, "uname") else ""
    return f"{host}/{device}"[:64] if host else str(device)[:64]
