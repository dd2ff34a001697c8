"""Several terms on one workload, side by side, with transpose advice."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import Evaluation, evaluate
from .dataflow import EDGE_FEATURES, EDGE_INPUT, collect_facts, predecessors
from .costs import CostModel
from .ops import ALLREDUCE, BCAST, LLM, R
from .terms import Call
from .terms.ast import Sym


@dataclass
class TransposeCosts:
    """What a transposed schedule pays and what it gains, in time units."""

    baseline_makespan: float
    moved_encoder_work: float  # encoder time taken off chunk 0's device
    broadcast: float
    recompute: float
    allreduce: float
    transfers: float  # feature/input transfers that cross devices
    saved: float  # baseline makespan - transposed makespan
    backward_note: str = ""  # what backward=auto picked, and why

    @property
    def overhead(self) -> float:
        return self.broadcast + self.recompute + self.allreduce + self.transfers

    def verdict(self) -> str:
        text = self._saving()
        return f"{text}; {self.backward_note}" if self.backward_note else text

    def _saving(self) -> str:
        parts = (f"broadcast {self.broadcast:.3g}, recompute {self.recompute:.3g}, "
                 f"all-reduce {self.allreduce:.3g}, transfers {self.transfers:.3g}")
        if self.saved > 1e-9:
            pct = 100 * self.saved / self.baseline_makespan
            return (f"transpose saves {pct:.0f}% ({self.saved:.3g} of {self.baseline_makespan:.3g}): "
                    f"{self.moved_encoder_work:.3g} of encoder work moved into idle time; overhead {parts}")
        if self.saved < -1e-9:
            biggest = max(("broadcast", self.broadcast), ("recompute", self.recompute),
                          ("all-reduce", self.allreduce), ("transfers", self.transfers), key=lambda x: x[1])
            pct = 100 * -self.saved / self.baseline_makespan
            return (f"transpose loses ({pct:.0f}% slower): {biggest[0]} costs more than the bubble it fills "
                    f"(overhead {parts}; encoder work moved {self.moved_encoder_work:.3g})")
        return f"transpose breaks even (overhead {parts})"


@dataclass
class Row:
    evaluation: Evaluation
    speedup: float
    transpose: TransposeCosts | None = None

    def as_dict(self) -> dict[str, Any]:
        s = self.evaluation.summary()
        out = {k: s[k] for k in ("term", "devices", "ops", "makespan", "bubble_ratio", "lower_bound",
                                 "efficiency", "peak_memory")}
        out["speedup"] = self.speedup
        if self.transpose is not None:
            t = self.transpose
            out["transpose"] = {
                "baseline_makespan": t.baseline_makespan, "moved_encoder_work": t.moved_encoder_work,
                "broadcast": t.broadcast, "recompute": t.recompute, "allreduce": t.allreduce,
                "transfers": t.transfers, "saved": t.saved, "verdict": t.verdict(),
            }
        return out


def transpose_costs(transposed: Evaluation, baseline: Evaluation) -> TransposeCosts:
    sched, wl, tl = transposed.schedule, transposed.workload, transposed.timeline
    d0 = next(d for d, o in enumerate(sched.orders) for op in o if op.module == LLM and op.chunk == 0)
    moved = bcast = recompute = allreduce = 0.0
    for op, d, s, e in tl.rows():
        if op.module == LLM:
            continue
        if op.kind == BCAST:
            bcast = max(bcast, e - s)
        elif op.kind == ALLREDUCE:
            allreduce = max(allreduce, e - s)
        elif op.kind == R:
            recompute += e - s
        elif d != d0:
            moved += e - s
    facts = collect_facts(sched)
    costs = CostModel(sched, wl, facts)
    index = sched.placement()
    transfers = 0.0
    for op, d, _, _ in tl.rows():
        for producer, edge in predecessors(op, d, facts, index):
            if edge in (EDGE_FEATURES, EDGE_INPUT) and index.get(producer, d) != d:
                transfers += costs.transfer(producer, op, edge)
    return TransposeCosts(baseline.timeline.makespan, moved, bcast, recompute, allreduce, transfers,
                          baseline.timeline.makespan - tl.makespan)


def compare(terms: list[str], workload=None) -> list[Row]:
    evaluations = [evaluate(t, workload) for t in terms]
    first = evaluations[0].timeline.makespan
    rows = []
    for ev in evaluations:
        row = Row(ev, first / ev.timeline.makespan if ev.timeline.makespan else 1.0)
        if ev.ast.name == "transpose" and ev.workload.encoders:
            inner: Call = ev.ast.kw("term")
            row.transpose = transpose_costs(ev, evaluate(inner, ev.workload))
            row.transpose.backward_note = auto_backward_note(ev)
        rows.append(row)
    return rows


def auto_backward_note(ev: Evaluation) -> str:
    """For a dynamic transpose left at backward=auto with a trainable encoder:
    which backward it kept, with both makespans."""
    ast = ev.ast
    if ast.kw("backward") is not None or ast.kw("mode") != Sym("dynamic"):
        return ""
    if not any(e.trainable for e in ev.workload.encoders):
        return ""
    times = {}
    for mode in ("recompute", "owner"):
        explicit = Call(ast.name, (), ast.kwargs + (("backward", Sym(mode)),), pos=ast.pos)
        times[mode] = evaluate(explicit, ev.workload).timeline.makespan
    picked = "recompute" if times["recompute"] <= times["owner"] else "owner"
    other = "owner" if picked == "recompute" else "recompute"
    why = ("recomputing on stage 0 costs less than the gradient all-reduce" if picked == "recompute"
           else "the owner's backward plus all-reduce costs less than recomputing on stage 0")
    return (f"backward=auto picked {picked} (makespan {times[picked]:.4g} vs {times[other]:.4g} "
            f"with {other}): {why}")
