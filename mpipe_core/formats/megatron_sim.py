"""Megatron-LM's pipeline simulator output (`megatron/training/simulation/
vpp_simulate.py`) read as a run: `task_durations.json` and `pp_task_orders.json`.

    task_durations.json  {"pp_0-mbs_0-model_chunk_0-task_type_forward":
                            {"duration_ms": 1.2, "pp_rank": 0, "microbatch_id": 0,
                             "model_chunk_id": 0, "task_type": "forward"}, ...}
    pp_task_orders.json  {"0": [task id, ...], "1": [...], ...}   (per pp rank, in order)

`model_chunk_id` is the local virtual-stage index, so the task runs LLM chunk
`model_chunk_id * P + pp_rank` (Megatron's interleaving); `forward` is F and
`backward` the whole backward (BW).  The simulator measures each task alone
and records no start times; the timeline is built the way its analyzer does:
each rank runs its tasks in order, a task starts when its rank is free and its
inputs are done (forward from the previous chunk, backward from the next), with
no transfer time.  The result is one step.
"""
from __future__ import annotations

import math
from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.formats.kineto import RankTrace, TracedOp
from mpipe_core.ir.ops import BW, LLM, F

KINDS = {"forward": F, "backward": BW}
FIELDS = ("duration_ms", "pp_rank", "microbatch_id", "model_chunk_id", "task_type")


def looks_like_durations(doc: Any) -> bool:
    return (isinstance(doc, dict) and bool(doc)
            and all(isinstance(v, dict) and "duration_ms" in v and "pp_rank" in v for v in doc.values()))


def looks_like_orders(doc: Any) -> bool:
    return (isinstance(doc, dict) and bool(doc) and all(str(k).isdigit() for k in doc)
            and all(isinstance(v, list) for v in doc.values()))


def _int(task: dict, key: str, where: str) -> int:
    value = task.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MpipeError(f"{where}: {key} must be a whole number >= 0, not {str(value)[:30]}")
    return value


def parse_megatron(durations: dict, orders: dict, durations_name: str, orders_name: str) -> list[RankTrace]:
    tasks: dict[str, tuple[int, str, int, int, float]] = {}  # id -> (rank, kind, vchunk, mb, ms)
    for task_id, task in durations.items():
        where = f"{durations_name}: task '{str(task_id)[:80]}'"
        missing = [k for k in FIELDS if k not in task]
        if missing:
            raise MpipeError(f"{where}: lacks {', '.join(missing)}")
        kind = KINDS.get(task["task_type"])
        if kind is None:
            raise MpipeError(f"{where}: task_type '{str(task['task_type'])[:20]}' is not forward or backward")
        ms = task["duration_ms"]
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms < 0:
            raise MpipeError(f"{where}: duration_ms {str(ms)[:30]} is not a finite number >= 0")
        tasks[str(task_id)] = (_int(task, "pp_rank", where), kind, _int(task, "model_chunk_id", where),
                               _int(task, "microbatch_id", where), float(ms))
    p = len(orders)
    if sorted(int(k) for k in orders) != list(range(p)):
        raise MpipeError(f"{orders_name}: ranks must be numbered 0..{p - 1}")
    vchunks = 1 + max((t[2] for t in tasks.values()), default=0)
    per_rank: list[list[tuple[str, int, int, float]]] = []
    for r in range(p):
        row = orders.get(str(r), orders.get(r))
        seq = []
        for n, task_id in enumerate(row):
            task = tasks.get(str(task_id))
            if task is None:
                raise MpipeError(f"{orders_name}: rank {r} position {n}: task '{str(task_id)[:80]}' "
                                 f"is not in {durations_name}")
            if task[0] != r:
                raise MpipeError(f"{orders_name}: rank {r} position {n}: task '{str(task_id)[:80]}' "
                                 f"belongs to pp_rank {task[0]}")
            seq.append((task[1], task[2] * p + r, task[3], task[4]))
        per_rank.append(seq)
    timeline = _list_schedule(per_rank, p * vchunks, orders_name)
    traces = []
    for r, seq in enumerate(per_rank):
        ops = [TracedOp(LLM, kind, chunk, mb, s * 1000.0, e * 1000.0, s * 1000.0, None,
                        f"pp_{r} {kind}{chunk}:{mb}")
               for (kind, chunk, mb, _), (s, e) in zip(seq, timeline[r])]
        traces.append(RankTrace(f"{orders_name} rank {r}", r, p, None, 0, ops, {}, False))
    return traces


def _list_schedule(per_rank, chunks: int, where: str) -> list[list[tuple[float, float]]]:
    """ASAP times (ms) of every rank's tasks in order, no transfer time."""
    end: dict[tuple[str, int, int], float] = {}
    times: list[list[tuple[float, float]]] = [[] for _ in per_rank]
    pointer = [0] * len(per_rank)
    free = [0.0] * len(per_rank)
    remaining = sum(len(s) for s in per_rank)
    while remaining:
        moved = False
        for r, seq in enumerate(per_rank):
            while pointer[r] < len(seq):
                kind, chunk, mb, ms = seq[pointer[r]]
                needs = ([(F, chunk - 1, mb)] if kind == F and chunk > 0 else []) if kind == F else (
                    [(F, chunk, mb)] + ([(BW, chunk + 1, mb)] if chunk + 1 < chunks else []))
                if any(n not in end for n in needs):
                    break
                start = max([free[r]] + [end[n] for n in needs])
                end[(kind, chunk, mb)] = start + ms
                times[r].append((start, start + ms))
                free[r] = start + ms
                pointer[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            stuck = ", ".join(f"rank {r} at {per_rank[r][pointer[r]][0]}{per_rank[r][pointer[r]][1]}:"
                              f"{per_rank[r][pointer[r]][2]}" for r in range(len(per_rank))
                              if pointer[r] < len(per_rank[r]))
            raise MpipeError(f"{where}: the task orders deadlock ({stuck} wait for each other)")
    return times
