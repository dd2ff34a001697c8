"""PyTorch `torch.distributed.pipelining` compute-only CSV: one row per rank of
action strings `{stage}{F|I|W|B}{microbatch}` (our split B is torch's I, our
fused BW is torch's B), as `_PipelineScheduleRuntime._load_csv` reads them."""
from __future__ import annotations

import csv
import io
import re

from mpipe_core.errors import MpipeError
from mpipe_core.ir.ops import BW, LLM, B, F, Op, W
from mpipe_core.ir.schedule import Schedule, single_pipeline

TO_TORCH = {F: "F", B: "I", W: "W", BW: "B"}
FROM_TORCH = {v: k for k, v in TO_TORCH.items()}
_ACTION = re.compile(r"^(\d+)(F|I|W|B)(\d+)$")


def refusal(schedule: Schedule) -> str | None:
    """Why torch's CSV cannot hold `schedule` (the message `to_torch_csv` raises), or None.

    Encoder ops fused on the device of chunk 0 are part of stage 0's module in
    torch, so they are dropped with a note; encoder ops anywhere else (transpose,
    encoder_stage) or several pipelines cannot be expressed and are refused."""
    if len(schedule.pipelines) != 1 or schedule.pipelines[0].steps != 1:
        return "torch-csv holds one pipeline and one step (no par/overlay/repeat)"
    chunk0 = _chunk0_devices(schedule)
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op.module != LLM and not (d in chunk0 and op.kind in TO_TORCH):
                return (f"torch-csv cannot express {op} on device {d}: torch runs encoders only inside "
                        f"stage 0 (transpose and encoder_stage have no torch equivalent)")
    return None


def _chunk0_devices(schedule: Schedule) -> set[int]:
    return {d for d, order in enumerate(schedule.orders) for op in order if op.module == LLM and op.chunk == 0}


def to_torch_csv(schedule: Schedule) -> tuple[str, list[str]]:
    """The CSV text and notes about what torch cannot express; MpipeError with
    `refusal(schedule)` when it cannot hold the schedule at all."""
    reason = refusal(schedule)
    if reason is not None:
        raise MpipeError(reason)
    notes: list[str] = []
    chunk0 = _chunk0_devices(schedule)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    dropped = 0
    for d, order in enumerate(schedule.orders):
        row = []
        for op in order:
            if op.module != LLM:
                dropped += 1  # fused into stage 0 (refusal() let nothing else through)
                continue
            row.append(f"{op.chunk}{TO_TORCH[op.kind]}{op.mb}")
        writer.writerow(row)
    if dropped:
        notes.append(f"{dropped} encoder ops fused into stage 0 are part of stage 0's module in torch; not listed")
    return out.getvalue(), notes


def _numbered_from_zero(seen: set[int], what: str, source: str) -> int:
    """How many stages (or microbatches) there are; they must be 0..n-1 without gaps."""
    count = max(seen) + 1
    if len(seen) != count:
        missing = min(set(range(len(seen) + 1)) - seen)
        raise MpipeError(f"{source}: {what} {max(seen)} appears but {what} {missing} has no actions "
                         f"({'microbatches' if what == 'microbatch' else what + 's'} are numbered from 0 "
                         f"without gaps)")
    return count


def from_torch_csv(text: str, source: str = "csv") -> Schedule:
    """A schedule from torch's compute-only CSV (one row per rank)."""
    orders: list[list[Op]] = []
    stages: set[int] = set()
    mbs: set[int] = set()
    try:
        for r, row in enumerate(csv.reader(io.StringIO(text)), start=1):
            order = []
            for c, cell in enumerate(row, start=1):
                cell = cell.strip()
                if not cell:
                    continue
                match = _ACTION.match(cell)
                if not match:
                    raise MpipeError(
                        f"{source}:{r}:{c}: {cell[:40]!r} is not a compute action like 2F0, 1I3, 0W1 or 3B2 "
                        f"(only compute-only CSVs can be imported)"
                    )
                stage, kind, mb = int(match[1]), FROM_TORCH[match[2]], int(match[3])
                order.append(Op(LLM, kind, stage, mb))
                stages.add(stage)
                mbs.add(mb)
            orders.append(order)
    except csv.Error as error:  # a NUL byte, a field past csv's size limit
        raise MpipeError(f"{source}: not a CSV file ({error})") from None
    if not orders or not stages:
        raise MpipeError(f"{source}: no actions found")
    chunks = _numbered_from_zero(stages, "stage", source)
    microbatches = _numbered_from_zero(mbs, "microbatch", source)
    return single_pipeline(orders, chunks=chunks, microbatches=microbatches)
