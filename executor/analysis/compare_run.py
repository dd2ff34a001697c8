"""A run's measured timeline against a prediction, or against another run.

    cmp = compare_run(db, run_id)                      # vs its own term, simulated
    cmp = compare_run(db, run_id, against="zbv(p=2, m=8)")   # vs another schedule
    cmp = compare_run(db, run_id, against=7)           # vs run 7, measured
    cmp = compare_run(db, run_id, workload="saved:cal-run-3")  # vs a calibration of another run
    cmp = compare_run(db, run_id, workload=LAUNCHED)   # vs the workload the run was launched with
    cmp.as_dict()    # what the app's runs page draws; cmp.format() for a terminal

The prediction is the simulator's timeline of the term on a workload: by
default the workload calibrated from this very run (`calibrate.fit`: which
schedules' structure the simulator gets right, given the measured op costs
-- a fit, not a prediction), or any workload given: the one the run was
launched with (`LAUNCHED`), or a saved calibration of another run, test
whether the simulator *predicts* this one.  Times are milliseconds (a
workload in seconds or microseconds is converted; a unitless one is read as
milliseconds, and `prediction_unit` says so); the measured figures are means
over the run's steps after the first (warm-up).

What comes back: both makespans and the error (predicted / measured - 1),
per-device busy and idle time, and the ops whose measured time differs most
from the other side (matched by module, kind, chunk and microbatch).  With
`explain=True` (a prediction of the run's own term) also the gap split by
cause along each measured step's critical path (`mpipe_core.simulation.explain`),
averaged over the steps, and the communication kind by kind, measured against
predicted (`comm_compare`).

Memory, when the run recorded it (`storage.memory_for`): per device the
predicted peak activation and static memory (the prediction's workload; for a
comparison with another run, this run's own workload) against what each rank
measured (`memory_check`).
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.ir.ops import format_op
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.workloads.units import MS_PER_TIME_UNIT

from .calibrate import MS, STATISTICS, MeasuredRun, _table, dispatch, fit, load_measured
from .comm_compare import CommKind, comm_lines, compare_comm
from .memory_check import MemoryComparison, compare_memory


@dataclass
class DeviceTimes:
    device: int
    measured_busy_ms: float
    measured_idle_ms: float
    other_busy_ms: float | None
    other_idle_ms: float | None


@dataclass
class OpDifference:
    op: str  # `llm:1F2` form (inner step suffix `#k` for repeat terms)
    device: int
    measured_ms: float
    other_ms: float
    difference_ms: float  # measured - other
    measured_end_ms: float  # when it ended, from the step's start
    other_end_ms: float


@dataclass
class RunComparison:
    run_id: int
    term: str
    against: str  # what the other side is, in words
    kind: str  # "prediction" or "run"
    workload: str  # the workload the prediction used ("" for a run)
    measured_ms: float
    other_ms: float
    steps: list[int]
    devices: list[DeviceTimes]
    top_ops: list[OpDifference]
    matched_ops: int
    unmatched_ops: int
    overhead_ms: float  # mean dispatch gap added to each measured op's duration (this run's own)
    # One step of each side, from 0: measured in ms, predicted in workload units (ms when calibrated).
    measured_timeline: list[TimelineRecord] = field(repr=False, default_factory=list)
    other_timeline: list[TimelineRecord] = field(repr=False, default_factory=list)
    explanation: list[dict[str, Any]] | None = None  # the gap by cause (`explain=True`)
    # The time unit the prediction's workload declares ("" = none, read as ms; "ms" after converting).
    prediction_unit: str = "ms"
    # The dispatch gap the prediction's workload charges per op (its host.dispatch), in ms.
    workload_dispatch_ms: float = 0.0
    fitted: bool = False  # the workload was fitted to this very run (not a prediction)
    step_makespans_ms: list[float] = field(default_factory=list)  # each used step's measured makespan
    memory: MemoryComparison | None = None  # predicted vs measured per device (None: the run recorded none)
    # The prediction's workload is another model's than the one that ran (`run_identity.same_model`):
    # the figures compare across models and are never called a prediction error.
    across_models: bool = False
    # With `explain=True`: measured vs predicted communication per kind (`comm_compare`).
    comm: list[CommKind] | None = None

    @property
    def error(self) -> float:
        """other / measured - 1 (for a prediction: how far off it is)."""
        return self.other_ms / self.measured_ms - 1.0 if self.measured_ms else float("nan")

    @property
    def spread(self) -> float | None:
        """How much the run's own steps vary, to weigh an error against: (slowest - fastest
        used step) / median step, of `step_makespans_ms`; None with fewer than two steps
        (nothing varies that was measured) or a zero median."""
        spans = sorted(self.step_makespans_ms)
        if len(spans) < 2:
            return None
        median = statistics.median(spans)
        return (spans[-1] - spans[0]) / median if median else None

    def as_dict(self, timelines: bool = True) -> dict[str, Any]:
        doc = {
            "run_id": self.run_id, "term": self.term, "against": self.against, "kind": self.kind,
            "workload": self.workload, "unit": "ms", "measured_ms": self.measured_ms,
            "other_ms": self.other_ms, "error": self.error, "steps": self.steps,
            "devices": [asdict(d) for d in self.devices], "top_ops": [asdict(o) for o in self.top_ops],
            "matched_ops": self.matched_ops, "unmatched_ops": self.unmatched_ops,
            "overhead_ms": self.overhead_ms, "prediction_unit": self.prediction_unit,
            "workload_dispatch_ms": self.workload_dispatch_ms, "fitted": self.fitted,
            "step_makespans_ms": self.step_makespans_ms, "across_models": self.across_models,
        }
        if self.explanation is not None:
            doc["explanation"] = self.explanation
        if self.comm is not None:
            doc["comm"] = [k.as_dict() for k in self.comm]
        doc["memory"] = None if self.memory is None else self.memory.as_dict()
        if timelines:
            doc["measured_timeline"] = [r.as_dict() for r in self.measured_timeline]
            doc["other_timeline"] = [r.as_dict() for r in self.other_timeline]
        return doc

    def format(self) -> str:
        side = ("another model" if self.across_models else "predicted") if self.kind == "prediction" else "other run"
        lines = [f"run {self.run_id}: {self.term}",
                 f"against {self.against}" + (f" (workload {self.workload})" if self.workload else "")
                 + (": a fit to this very run, not a prediction" if self.fitted else "")
                 + (": another model than the one that ran, so this compares across models and is no "
                    "prediction of this run" if self.across_models else ""),
                 f"times in ms; measured = mean over steps {_steps(self.steps)}; an op's measured time "
                 f"includes the mean dispatch gap ({self.overhead_ms:.3f})", "",
                 f"makespan  measured {self.measured_ms:.2f}  {side} {self.other_ms:.2f}  "
                 f"({side} / measured - 1 = {self.error:+.1%})", ""]
        rows = []
        for d in self.devices:
            rows.append([str(d.device), f"{d.measured_busy_ms:.2f}", f"{d.measured_idle_ms:.2f}",
                         "-" if d.other_busy_ms is None else f"{d.other_busy_ms:.2f}",
                         "-" if d.other_idle_ms is None else f"{d.other_idle_ms:.2f}"])
        lines += _table(rows, ["device", "busy", "idle", f"{side} busy", f"{side} idle"])
        lines += ["", f"ops differing most ({self.matched_ops} matched"
                  + (f", {self.unmatched_ops} on one side only" if self.unmatched_ops else "") + "):"]
        rows = [[o.op, str(o.device), f"{o.measured_ms:.3f}", f"{o.other_ms:.3f}", f"{o.difference_ms:+.3f}",
                 f"{o.measured_end_ms:.2f}", f"{o.other_end_ms:.2f}"] for o in self.top_ops]
        lines += _table(rows, ["op", "device", "measured", side, "difference", "ends at", f"{side} end"])
        if self.explanation is not None:
            lines += ["", "the gap by cause, along the measured critical path (mean over the steps; "
                      "the differences add up to measured - predicted):"]
            lines += _table(explanation_rows(self.explanation),
                            ["cause", "path ops", "measured", "predicted", "difference", "of which contention"])
        if self.comm is not None:
            lines += [""] + comm_lines(self.comm)
        lines += [""] + (self.memory.lines() if self.memory is not None
                         else ["memory: this run recorded none (runs record it since mpipe's migration 0005)"])
        return "\n".join(lines)


class _Side:
    """One timeline reduced to what is compared: per-op duration and end, per-device busy."""

    def __init__(self, makespan: float, devices: int):
        self.makespan = makespan
        self.busy = [0.0] * devices
        self.ops: dict[tuple, tuple[int, float, float]] = {}  # key -> (device, duration, end)
        self.rows: list[TimelineRecord] = []
        self.overhead = 0.0  # ms of dispatch gap counted into each measured op


def _measured_side(m: MeasuredRun, statistic: str = "mean") -> _Side:
    """Measured op time = duration + the run's mean dispatch gap, the way a
    calibrated workload charges it (so busy + idle = makespan on both sides).
    `statistic` (mean or median) reduces the steps' makespans, op times and gaps."""
    stat = STATISTICS[statistic]
    schedule = m.evaluation.schedule
    steps = m.used_steps
    side = _Side(stat(m.makespans_ms()), schedule.devices)
    side.overhead = dispatch(m, statistic=statistic).overhead * MS
    placement = {op: d for d, order in enumerate(schedule.orders) for op in order}
    durations: dict[Any, list[float]] = defaultdict(list)
    ends: dict[Any, list[float]] = defaultdict(list)
    for step in steps:
        origin, _ = m.span(step)
        for op, row in m.steps[step].items():
            durations[op].append((row.end - row.start) * MS + side.overhead)
            ends[op].append((row.end - origin) * MS)
    for op, values in durations.items():
        d = placement[op]
        mean = stat(values)
        side.busy[d] += mean
        side.ops[_key(op)] = (d, mean, stat(ends[op]))
    # One step to draw: the one whose makespan is closest to the mean.
    spans = dict(zip(steps, m.makespans_ms()))
    show = min(steps, key=lambda s: abs(spans[s] - side.makespan))
    origin, _ = m.span(show)
    for op, row in sorted(m.steps[show].items(), key=lambda kv: (placement[kv[0]], kv[1].start)):
        side.rows.append(TimelineRecord(placement[op], op.module, op.kind, op.chunk, op.mb, show,
                                        (row.start - origin) * MS, (row.end - origin) * MS))
    return side


# Milliseconds per unit of a workload's declared time unit ("": none declared, read as ms).
MS_PER_UNIT = {"": 1.0, **MS_PER_TIME_UNIT}


def _predicted_side(evaluation) -> _Side:
    tl = evaluation.timeline
    k = MS_PER_UNIT[evaluation.workload.time_unit]
    origin = min(tl.start, default=0.0)
    side = _Side((tl.makespan - origin) * k, tl.devices)
    for op, d, s, e in tl.rows():
        side.busy[d] += (e - s) * k
        side.ops[_key(op)] = (d, (e - s) * k, (e - origin) * k)
        side.rows.append(TimelineRecord.of(op, d, (s - origin) * k, (e - origin) * k))
    return side


def _key(op) -> tuple:
    return (op.module, op.kind, op.chunk, op.mb, op.step)


LAUNCHED = "launched"  # `workload=`: the one the run's schedule version was saved (and launched) with


def launch_workload(db, run_id: int) -> tuple[dict[str, Any], str]:
    """The workload run `run_id` was launched with (its schedule version's), and its label."""
    from mpipe_core.workloads.presets import preset_document
    from storage import get_run, get_version

    version = get_version(db, get_run(db, run_id).ref)
    body = version.workload if version.workload is not None else preset_document("uniform")
    return dict(body), f"{version.workload_label} (the run's own workload)"


def resolve_workload(db, source: Any) -> tuple[dict[str, Any], str]:
    """A workload given as "saved:NAME[@N]", a preset, a file, or a dict."""
    from storage import get_workload, saved_workload_name, saved_workload_ref

    name = saved_workload_name(source)
    if name is not None:
        info = get_workload(db, name)
        return dict(info.body), saved_workload_ref(info.ref)
    from mpipe_core.workloads.workload import load_workload

    wl = load_workload(source)
    label = source if isinstance(source, str) else wl.name
    return wl.to_dict(), str(label)


def explanation_rows(explanation: list[dict[str, Any]]) -> list[list[str]]:
    """The explanation as table cells (the CLI and the app's Runs page print the same)."""
    return [[e["cause"], f"{e['ops']:g}", f"{e['measured_ms']:.2f}", f"{e['predicted_ms']:.2f}",
             f"{e['gap_ms']:+.2f}", f"{e['contention_ms']:.2f}" if e["contention_ms"] else ""]
            for e in explanation]


def explain_steps(measured: MeasuredRun, evaluation, overhead_ms: float) -> list[dict[str, Any]]:
    """`mpipe_core.simulation.explain.explain_gap` on every used step, averaged by cause, in ms.
    The gap is explained in the prediction's own time unit (the simulated timeline and the
    workload's costs are in it: seconds for every `mpipe profile` output), so the measured
    rows and the overhead go in converted to it, and every figure comes back in ms."""
    from mpipe_core.simulation.explain import explain_gap

    k = MS_PER_UNIT[evaluation.workload.time_unit]  # ms per unit of the prediction
    totals: dict[str, dict[str, float]] = {}
    steps = measured.used_steps
    for step in steps:
        rows = {op: (row.start * MS / k, row.end * MS / k) for op, row in measured.steps[step].items()}
        ex = explain_gap(evaluation.schedule, evaluation.workload, rows, evaluation.timeline,
                         overhead=overhead_ms / k)
        for c in ex.causes:
            t = totals.setdefault(c.cause, {"ops": 0.0, "measured_ms": 0.0, "predicted_ms": 0.0,
                                            "contention_ms": 0.0})
            t["ops"] += c.ops / len(steps)
            t["measured_ms"] += c.measured * k / len(steps)
            t["predicted_ms"] += c.predicted * k / len(steps)
            t["contention_ms"] += c.contention * k / len(steps)
    out = [dict(cause=name, gap_ms=t["measured_ms"] - t["predicted_ms"], **t) for name, t in totals.items()]
    return sorted(out, key=lambda e: -abs(e["gap_ms"]))


def compare_run(db, run_id: int, against: Any = None, *, workload: Any = None,
                top: int = 10, explain: bool = False, contention: float | None = None,
                statistic: str = "mean") -> RunComparison:
    """Compare run `run_id`'s measured timeline with `against`: None (its own
    term, simulated), a term (text), or another run (its id as int, "7" or
    "run:7").  `workload` is what the simulation uses (default: calibrated
    from this run, a fit rather than a prediction; `LAUNCHED`: the workload
    the run was launched with).  Raises MpipeError (CLI exit 2) for unknown runs, runs
    without timings, bad terms.  `explain`: the gap by cause (a prediction
    of the run's own term only); `contention`: calibrate on a host whose
    ranks slow each other down by this much (`executor.runtime.contention_probe`);
    `statistic`: "mean" (default) or "median" of the measured steps and op times
    (and of the calibration's fit), robust to bursts of background load."""
    from mpipe_core.api import evaluate_once as evaluate

    if explain and against is not None:
        raise MpipeError("--explain splits the gap to the prediction of the run's own term: "
                         "leave out --against")
    if contention is not None and (contention < 0 or workload is not None):
        raise MpipeError("--contention must be >= 0 and applies to the workload calibrated from the run "
                         "(not to --workload)")
    from storage import memory_for

    measured = load_measured(db, run_id)
    if statistic not in STATISTICS:
        raise MpipeError(f"statistic must be one of {', '.join(STATISTICS)}, not {statistic!r}")
    mine = _measured_side(measured, statistic)
    memory_rows = memory_for(db, run_id)
    other_run = _as_run_id(against)
    if other_run is not None:
        if workload is not None:
            raise MpipeError("--workload applies to a prediction, not to a comparison with another run")
        other_measured = load_measured(db, other_run)
        other = _measured_side(other_measured, statistic)
        kind, label, wl_label = "run", f"run {other_run} ({other_measured.term})", ""
        fitted, unit, dispatch_ms = False, "ms", other.overhead
        memory_prediction, memory_label = measured.evaluation, f"{measured.evaluation.workload.name} (the run's own)"
        across = False
    else:
        term = measured.term if against is None else str(against)
        fitted, across = workload is None, False
        if workload is None:
            cal = fit(measured, host=None if contention is None
                      else {"devices": None, "contention": contention}, statistic=statistic,
                      fit_contention=contention is None)
            doc, wl_label = cal.workload, f"calibrated from run {run_id}"
            try:
                evaluation = evaluate(term, doc)
            except MpipeError:
                # Another shape (p, v, m): per-chunk / per-microbatch costs do not fit it.
                doc, wl_label = cal.portable_workload(), f"calibrated from run {run_id} (per layer / per image)"
                evaluation = evaluate(term, doc)
        else:
            doc, wl_label = (launch_workload(db, run_id) if workload == LAUNCHED
                             else resolve_workload(db, workload))
            across = _across_models(db, run_id, doc)
            evaluation = evaluate(term, doc)
        other = _predicted_side(evaluation)
        unit = evaluation.workload.time_unit
        dispatch_ms = evaluation.workload.host.dispatch * MS_PER_UNIT[unit]
        kind, label = "prediction", ("its own term, simulated" if against is None
                                     else f"term {evaluation.term}, simulated")
        memory_prediction, memory_label = evaluation, wl_label + (", another model: across models" if across else "")
    devices = []
    for d in range(len(mine.busy)):
        ob = other.busy[d] if d < len(other.busy) else None
        devices.append(DeviceTimes(d, mine.busy[d], mine.makespan - mine.busy[d], ob,
                                   None if ob is None else other.makespan - ob))
    diffs = []
    for key, (d, dur, end) in mine.ops.items():
        theirs = other.ops.get(key)
        if theirs is None:
            continue
        diffs.append(OpDifference(_op_text(key), d, dur, theirs[1], dur - theirs[1], end, theirs[2]))
    matched = len(diffs)
    unmatched = len(mine.ops) + len(other.ops) - 2 * matched
    diffs.sort(key=lambda o: -abs(o.difference_ms))
    explanation = explain_steps(measured, evaluation, mine.overhead) if explain else None
    comm = None
    if explain:
        from storage import timings_for

        comm = compare_comm(timings_for(db, run_id, rows="comm"), measured.used_steps, evaluation)
    memory = None
    if memory_rows:
        memory = compare_memory(memory_prediction.metrics, memory_prediction.workload.memory_unit, memory_rows,
                                memory_label)
    return RunComparison(
        run_id=run_id, term=measured.term, against=label, kind=kind, workload=wl_label,
        measured_ms=mine.makespan, other_ms=other.makespan, steps=measured.used_steps, devices=devices,
        top_ops=diffs[:top], matched_ops=matched, unmatched_ops=unmatched, overhead_ms=mine.overhead,
        measured_timeline=mine.rows, other_timeline=other.rows, explanation=explanation,
        prediction_unit=unit if kind == "prediction" else "ms", workload_dispatch_ms=dispatch_ms,
        fitted=fitted, step_makespans_ms=measured.makespans_ms(), memory=memory, comm=comm,
        across_models=kind == "prediction" and not fitted and across,
    )


def _across_models(db, run_id: int, doc: dict[str, Any]) -> bool:
    """Whether workload `doc` is another model's than the one run `run_id` ran (an imported
    run ran another stack's model: any workload given for it is taken as its own)."""
    from mpipe_core.runs.run_identity import same_model
    from storage import get_run

    run = get_run(db, run_id)
    return run.source != "imported" and not same_model(doc, (run.options or {}).get("model") or "")


@dataclass
class PreviousRun:
    """The latest earlier run of the same schedule version with a complete step."""

    run_id: int
    makespan_ms: float  # mean over its used steps, as `RunComparison.measured_ms`
    steps: list[int]


def previous_run(db, run_id: int) -> PreviousRun | None:
    """The run of the same version before `run_id` (by id) that has a complete step:
    what a repeat of the same run measured, beside any prediction error."""
    from storage import get_run, list_runs

    run = get_run(db, run_id)
    earlier = sorted((r for r in list_runs(db, schedule=run.schedule, limit=200)
                      if r.ref == run.ref and r.id < run_id), key=lambda r: -r.id)
    for other in earlier:
        try:
            measured = load_measured(db, other.id)
        except MpipeError:
            continue  # no timings, or no complete step
        return PreviousRun(other.id, measured.makespan_ms, measured.used_steps)
    return None


def is_run_reference(against: Any) -> bool:
    """Whether `against` names another run (7, "7", "run:7") rather than a term."""
    return _as_run_id(against) is not None


def _as_run_id(against: Any) -> int | None:
    if isinstance(against, bool):
        return None
    if isinstance(against, int):
        return against
    if isinstance(against, str):
        text = against.strip()
        if text.startswith("run:"):
            text = text[4:]
        if text.isdigit():
            return int(text)
    return None


def _op_text(key: tuple) -> str:
    from mpipe_core.ir.ops import Op

    return format_op(Op(*key))


def _steps(steps: list[int]) -> str:
    if len(steps) > 2 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}..{steps[-1]}"
    return ",".join(map(str, steps))
