"""Several terms on one workload, side by side, with transpose advice."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from mpipe_core.algebra.terms import Call
from mpipe_core.algebra.terms.ast import Sym
from mpipe_core.api import Evaluation, evaluate
from mpipe_core.ir.ops import ALLREDUCE, BCAST, LLM, R
from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import EDGE_FEATURES, EDGE_INPUT, collect_facts, predecessors
from mpipe_core.simulation.layout_costs import LayoutCosts, layout_costs
from mpipe_core.workloads.units import human, percent, quantity


@dataclass
class TransposeCosts:
    """What a transposed schedule pays and what it gains, in the workload's time unit.

    The verdict's arithmetic is an identity of device time: on P devices,
    P x makespan = busy + idle, so (baseline - transposed makespan) =
    (idle time the move filled) / P - (work it added) / P.  `idle_filled` and
    `work_added` are those per-device averages; `saved` is their difference."""

    baseline_makespan: float
    moved_encoder_work: float  # encoder time taken off chunk 0's device
    broadcast: float  # longest parameter broadcast
    recompute: float
    allreduce: float  # longest gradient all-reduce
    transfers: float  # feature/input transfers that cross devices
    saved: float  # baseline makespan - transposed makespan
    backward_note: str = ""  # what backward=auto picked, and why
    idle_filled: float = 0.0  # (baseline idle - transposed idle) / devices
    work_added: dict[str, float] = field(default_factory=dict)  # kind -> added busy time / devices
    unit: str = ""

    @property
    def overhead(self) -> float:
        return self.broadcast + self.recompute + self.allreduce + self.transfers

    @property
    def work_added_total(self) -> float:
        return sum(self.work_added.values())

    def _q(self, value: float) -> str:
        return quantity(value, self.unit)

    def arithmetic(self) -> str:
        """saved = idle filled - work added, each term named, in figures that add up."""
        parts = ", ".join(f"{name} {self._q(v)}" for name, v in self.work_added.items() if abs(v) > 1e-12)
        added = self._q(self.work_added_total) + (f" ({parts})" if parts else "")
        idle = (f"filled {self._q(self.idle_filled)} of idle time" if self.idle_filled >= 0
                else f"left {self._q(-self.idle_filled)} more idle time")
        return (f"per device it {idle} and added {added} of work: "
                f"{human(self.idle_filled)} − {human(self.work_added_total)} = {human(self.saved)} saved")

    def verdict(self) -> str:
        text = self._saving()
        return f"{text}; {self.backward_note}" if self.backward_note else text

    def _saving(self) -> str:
        context = (f"{self._q(self.moved_encoder_work)} of encoder work moved off the first stage's device; "
                   f"cross-device transfers {self._q(self.transfers)} (waiting on them counts as idle time)")
        of = f"{self._q(abs(self.saved))} of {self._q(self.baseline_makespan)}"
        if self.saved > 1e-9:
            pct = percent(self.saved / self.baseline_makespan)
            return f"transpose saves {pct} ({of}): {self.arithmetic()}. {context}"
        if self.saved < -1e-9:
            biggest = max(("broadcast", self.broadcast), ("recompute", self.recompute),
                          ("all-reduce", self.allreduce), ("transfers", self.transfers), key=lambda x: x[1])
            pct = percent(-self.saved / self.baseline_makespan)
            return (f"transpose loses ({pct} slower, {of}): {biggest[0]} costs more than the bubble it fills; "
                    f"{self.arithmetic()}. {context}")
        return f"transpose breaks even: {self.arithmetic()}. {context}"


@dataclass
class Row:
    evaluation: Evaluation
    speedup: float
    transpose: TransposeCosts | None = None
    layout: LayoutCosts | None = None  # a colocated or disaggregated term's explanation
    # The comparison's one lower bound (`shared_bound`): the lowest of the rows' own bounds.
    shared_lower_bound: float = 0.0

    @property
    def shared_efficiency(self) -> float:
        """The shared lower bound over this row's makespan: rows compare like with like
        (the row's own `efficiency` divides by its own bound, as `mpipe eval` does)."""
        span = self.evaluation.timeline.makespan
        return self.shared_lower_bound / span if span else 1.0

    def as_dict(self) -> dict[str, Any]:
        s = self.evaluation.summary()
        out = {k: s[k] for k in ("term", "devices", "ops", "makespan", "bubble_ratio", "lower_bound",
                                 "efficiency", "peak_memory", "static_memory", "capacity", "fits")}
        out["speedup"] = self.speedup
        out["shared_lower_bound"] = self.shared_lower_bound
        out["shared_efficiency"] = self.shared_efficiency
        if self.evaluation.step is not None:  # an analytic workload: the step in seconds and its MFU
            out.update(self.evaluation.step.as_dict())
        if self.transpose is not None:
            t = self.transpose
            out["transpose"] = {
                "baseline_makespan": t.baseline_makespan, "moved_encoder_work": t.moved_encoder_work,
                "broadcast": t.broadcast, "recompute": t.recompute, "allreduce": t.allreduce,
                "transfers": t.transfers, "saved": t.saved, "idle_filled": t.idle_filled,
                "work_added": dict(t.work_added), "verdict": t.verdict(),
            }
        if self.layout is not None:
            out["layout"] = self.layout.as_dict()
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
    idle_filled, work_added = _device_time_change(baseline, transposed)
    return TransposeCosts(baseline.timeline.makespan, moved, bcast, recompute, allreduce, transfers,
                          baseline.timeline.makespan - tl.makespan, idle_filled=idle_filled,
                          work_added=work_added, unit=wl.time_unit)


_ADDED_KINDS = {R: "recompute", BCAST: "broadcast", ALLREDUCE: "all-reduce"}


def _device_time_change(baseline: Evaluation, transposed: Evaluation) -> tuple[float, dict[str, float]]:
    """(idle filled, work added by kind), both per device: busy time of each
    kind the transposed schedule runs beyond the baseline, and the fall in idle
    time, divided by the device count (the same on both sides: transpose
    moves work between the baseline's devices)."""
    devices = transposed.timeline.devices
    busy: list[dict[str, float]] = []
    for ev in (baseline, transposed):
        by_kind: dict[str, float] = {}
        for op, _, s, e in ev.timeline.rows():
            name = _ADDED_KINDS.get(op.kind, "other")
            by_kind[name] = by_kind.get(name, 0.0) + (e - s)
        busy.append(by_kind)
    added = {name: (busy[1].get(name, 0.0) - busy[0].get(name, 0.0)) / devices
             for name in (*_ADDED_KINDS.values(), "other")}
    if abs(added["other"]) <= 1e-9 * max(1.0, baseline.timeline.makespan):
        del added["other"]  # encoder work only moved: none added or removed
    total_added = sum(added.values())
    # P*T = busy + idle on each side, so the idle change follows from the makespans.
    saved = baseline.timeline.makespan - transposed.timeline.makespan
    return saved + total_added, added


def compare(terms: list[str], workload=None,
            evaluator: Callable[[Any, Any], Evaluation] | None = None,
            max_ops: int | None = None) -> list[Row]:
    """Rows of `terms` on one workload; `evaluator(term, workload)` evaluates
    (the app passes its cached one, which applies its own op limit); without
    one, each schedule is refused above `max_ops` ops."""
    if evaluator is None:
        def evaluator(term: Any, wl: Any) -> Evaluation:
            return evaluate(term, wl, max_ops=max_ops)
    evaluations = [evaluator(t, workload) for t in terms]
    first = evaluations[0].timeline.makespan
    rows = []
    for ev in evaluations:
        row = Row(ev, first / ev.timeline.makespan if ev.timeline.makespan else 1.0)
        if ev.ast.name == "transpose" and ev.workload.encoders:
            inner: Call = ev.ast.kw("term")
            row.transpose = transpose_costs(ev, evaluator(str(inner), workload))
            row.transpose.backward_note = auto_backward_note(ev)
        placed = _layout_of(ev.ast)
        if placed is not None:
            row.layout = layout_costs(ev, evaluator(str(placed.kw("term")), workload), placed.name)
        rows.append(row)
    bound, _ = shared_bound(rows)
    for row in rows:
        row.shared_lower_bound = bound
    return rows


def shared_bound(rows: list[Row]) -> tuple[float, str]:
    """(the lowest of the rows' own lower bounds, the term it is of): no row's
    schedule can beat it, so dividing it by each makespan ranks the rows as their
    speeds do (as tune divides every candidate by the search's one bound)."""
    lowest = min(rows, key=lambda r: r.evaluation.metrics.lower_bound)
    return lowest.evaluation.metrics.lower_bound, lowest.evaluation.term


def _layout_of(term: Call) -> Call | None:
    """The colocated(...) or disaggregate(...) a term is (under any encoder_batch), if it is one."""
    while term.name == "encoder_batch":
        term = term.kw("term")
    return term if term.name in ("colocated", "disaggregate") else None


def auto_backward_note(ev: Evaluation) -> str:
    """For a dynamic transpose left at backward=auto with a trainable encoder:
    which backward it kept, with both makespans, and why; a variant that moved
    no encoder work off the first stage's device is named as such (its makespan
    is the input's, so "it costs more" would be the wrong reason)."""
    ast = ev.ast
    if ast.kw("backward") is not None or ast.kw("mode") != Sym("dynamic"):
        return ""
    if not any(e.trainable for e in ev.workload.encoders):
        return ""
    times, moved = {}, {}
    for mode in ("recompute", "owner"):
        explicit = Call(ast.name, (), ast.kwargs + (("backward", Sym(mode)),), pos=ast.pos)
        variant = evaluate(explicit, ev.workload)
        times[mode] = variant.timeline.makespan
        moved[mode] = moved_encoder_work(variant)
    picked = "recompute" if times["recompute"] <= times["owner"] else "owner"
    other = "owner" if picked == "recompute" else "recompute"
    unit = ev.workload.time_unit
    idle = [mode for mode in ("recompute", "owner") if moved[mode] <= 1e-12]
    if len(idle) == 2:
        why = ("neither moved any encoder work off the first stage's device (both keep the input's "
               "placement), so the two are the same schedule")
    elif other in idle:
        why = (f"{other} moved no encoder work off the first stage's device (its best placement was the "
               f"input's own), while {picked} moved {quantity(moved[picked], unit)}")
    elif picked == "recompute":
        why = "recomputing on stage 0 costs less than the gradient all-reduce"
    else:
        why = "the owner's backward plus all-reduce costs less than recomputing on stage 0"
    return (f"backward=auto picked {picked} (makespan {quantity(times[picked], unit)} vs "
            f"{quantity(times[other], unit)} with {other}): {why}")


def moved_encoder_work(ev: Evaluation) -> float:
    """Encoder compute (no recompute, broadcast or all-reduce) run off the device of LLM chunk 0."""
    sched, tl = ev.schedule, ev.timeline
    d0 = next(d for d, o in enumerate(sched.orders) for op in o if op.module == LLM and op.chunk == 0)
    return sum(e - s for op, d, s, e in tl.rows()
               if op.module != LLM and op.kind not in (BCAST, ALLREDUCE, R) and d != d0)
