"""A terminal Gantt chart for small schedules: one line per device."""
from __future__ import annotations

from mpipe_core.ir.ops import LLM, base_module
from mpipe_core.simulation.simulator import Timeline

SYMBOL = {"F": "F", "B": "B", "W": "W", "BW": "b", "R": "r", "BCAST": "^", "AR": "v", "GATHER": ">", "SCATTER": "<"}


def render(timeline: Timeline, width: int = 100) -> str:
    T = timeline.makespan
    if T <= 0:
        return ""
    scale = width / T
    lines = [["."] * width for _ in range(timeline.devices)]
    for op, d, s, e in timeline.rows():
        a, b = int(round(s * scale)), max(int(round(e * scale)), int(round(s * scale)) + 1)
        ch = SYMBOL.get(op.kind, "?")
        if base_module(op.module) != LLM:
            ch = ch.lower() if ch.isalpha() else ch
            ch = {"f": "e", "b": "d", "w": "w"}.get(ch, ch)
        for x in range(a, min(b, width)):
            lines[d][x] = ch
    out = [f"dev{d:<3}|{''.join(row)}|" for d, row in enumerate(lines)]
    out.append("      F forward  B input-grad  W weight-grad  b fused backward  "
               "e encoder fwd  d encoder bwd  r recompute  ^ broadcast  v all-reduce  > gather  < scatter  . idle")
    return "\n".join(out)
