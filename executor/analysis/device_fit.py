"""A device's achieved fractions fitted from a run: `mpipe calibrate RUN --device`.

An analytic workload on a cluster prices each op with a roofline
(`workloads/transformer_cost.py`): every GEMM at `gemm_efficiency` of the
device's peak (times its tile and wave quantization) or its bytes at
`hbm_efficiency` of the HBM bandwidth, whichever is longer, the memory-bound
kernels (norms, softmax, dropout, the activation) at `memory_efficiency` of
it, the attention core at `flash_efficiency`, plus the
communication that is not hidden.  Given a run of the same term (a stored
run or an imported trace, its ops matched by `calibrate.match_rows`), the fit
finds the fractions whose predicted op times are closest to the measured ones
in least squares (milliseconds; each op's mean over the run's steps, the
warm-up step left out as `calibrate` does):

* `gemm_efficiency` always: a golden-section search over its logarithm
  (predicted times are monotone in it);
* `memory_efficiency` only where the run identifies it: some op's predicted time
  must move with it by more than `IDENTIFIED` of what `gemm_efficiency` moves,
  in a direction of its own (the two sensitivities less than `COLLINEAR`
  aligned); then both are fitted by alternating searches.  Otherwise the
  workload's value stays and the report says why.

A fitted value outside (0, 1] (the search's best at either end of
[0.001, 1]) means the run is not this device (or not this workload): it is
refused, not clipped.  The result is the workload document
with `"device": {"preset": NAME, "gemm_efficiency": x, ...}`, which
`mpipe eval -w` reads like any other, and a report: the fitted values, the
residual per op kind before and after, the mean error before and after.

The predicted time of an op is the simulator's own (`CostModel.duration`):
what the op costs on the workload, before any waiting.
"""
from __future__ import annotations

import datetime
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

from mpipe_core.ir.ops import COLLECTIVE_KINDS, base_module
from mpipe_core.workloads.presets import DEVICES

from ..errors import CalibrationError

FITTED = ("gemm_efficiency", "memory_efficiency")
DEFAULTS = {"hbm_efficiency": 0.9, "flash_efficiency": 0.5}  # analytic._device_model's
SEARCH = (1e-3, 1.0)  # a minimum at either end means the best value lies outside: refused
IDENTIFIED = 0.02
COLLINEAR = 0.999
ROUNDS = 8


@dataclass
class KindResidual:
    """One op kind (`llm F`, `vision B`, ...): how many ops, and the mean signed
    relative error of the prediction (predicted / measured - 1) before and after."""

    kind: str
    ops: int
    measured_ms: float
    before: float
    after: float


@dataclass
class DeviceFit:
    run_id: int | None
    term: str
    device: str  # the preset (or "custom")
    before: dict[str, float]  # the workload's fractions
    fitted: dict[str, float]  # the fitted ones (only those identified)
    not_fitted: dict[str, str]  # fraction -> why it was kept
    residuals: list[KindResidual]
    error_before: float  # mean |predicted / measured - 1| over the ops
    error_after: float
    ops: int
    steps: list[int]
    workload: dict = field(repr=False)

    def as_dict(self) -> dict:
        return {"run": self.run_id, "term": self.term, "device": self.device, "before": self.before,
                "fitted": self.fitted, "not_fitted": self.not_fitted, "ops": self.ops, "steps": self.steps,
                "error_before": self.error_before, "error_after": self.error_after,
                "residuals": [vars(r) for r in self.residuals], "workload": self.workload}

    def format(self) -> str:
        lines = [f"device {self.device} fitted from {'run ' + str(self.run_id) if self.run_id else 'timings'}: "
                 f"{self.ops} ops of {self.term}, steps {', '.join(map(str, self.steps))}"]
        for key, value in self.fitted.items():
            lines.append(f"  {key:<17} {self.before[key]:.4g} -> {value:.4g}")
        for key, why in self.not_fitted.items():
            lines.append(f"  {key:<17} {self.before[key]:.4g} kept: {why}")
        lines.append(f"mean error per op {self.error_before:.1%} -> {self.error_after:.1%}")
        lines.append("")
        lines.append(f"{'op kind':<12} {'ops':>5} {'measured ms':>12} {'before':>8} {'after':>8}")
        for r in self.residuals:
            lines.append(f"{r.kind:<12} {r.ops:>5} {r.measured_ms:>12.4g} {r.before:>+8.1%} {r.after:>+8.1%}")
        return "\n".join(lines)


def device_fractions(doc: Mapping[str, Any]) -> tuple[str, dict[str, Any], dict[str, float]]:
    """(preset name or "custom", the device section as written, its fractions as priced)."""
    device = doc.get("device")
    name = device if isinstance(device, str) else device.get("preset", "custom") if isinstance(device, dict) \
        else "custom"
    resolved = dict(DEVICES.get(name, {})) if isinstance(name, str) else {}
    if isinstance(device, dict):
        resolved.update({k: v for k, v in device.items() if k != "preset"})
    fractions = {"gemm_efficiency": resolved.get("gemm_efficiency", resolved.get("efficiency", 0.5)),
                 "memory_efficiency": resolved.get("memory_efficiency",
                                                   resolved.get("hbm_efficiency", DEFAULTS["hbm_efficiency"]))}
    return name, (device if isinstance(device, dict) else {"preset": device}), fractions


def with_device(doc: Mapping[str, Any], fractions: Mapping[str, float]) -> dict:
    """The document with the device's fractions overridden (`{"preset": NAME, ...}`)."""
    _, section, _ = device_fractions(doc)
    out = dict(doc)
    out["device"] = {**{k: v for k, v in section.items() if k != "calibration"},
                     **{k: float(v) for k, v in fractions.items()}}
    return out


def check_device_workload(doc: Any) -> None:
    if not isinstance(doc, Mapping) or "model" not in doc:
        raise CalibrationError("calibrate --device needs an analytic workload (a model, a device and a cluster); "
                               "this one states its op costs explicitly")
    if "cluster" not in doc:
        raise CalibrationError("calibrate --device needs a workload with a cluster: without one an op's time is "
                               "the device's single efficiency, not its roofline")


def predicted_ms(schedule, doc: Mapping[str, Any], ops) -> list[float]:
    """Each op's cost (ms) on the workload `doc`, as the simulator prices it."""
    from mpipe_core.simulation.costs import CostModel
    from mpipe_core.simulation.dataflow import collect_facts
    from mpipe_core.workloads.workload import parse_workload

    model = CostModel(schedule, parse_workload(dict(doc)), collect_facts(schedule))
    return [model.duration(op) for op in ops]


def measured_ops(measured) -> tuple[list, list[float]]:
    """The compute ops of a `calibrate.MeasuredRun` and each one's mean measured time (ms)
    over the steps the fit uses (collectives and barriers left out)."""
    steps = measured.used_steps
    ops = [op for op in measured.steps[steps[0]] if op.kind not in COLLECTIVE_KINDS]
    times = [statistics.fmean((measured.steps[s][op].end - measured.steps[s][op].start) * 1e3 for s in steps)
             for op in ops]
    return ops, times


def _sse(pred, meas) -> float:
    return sum((p - m) ** 2 for p, m in zip(pred, meas))


def _golden_log(f, lo: float, hi: float, iters: int = 80) -> float:
    """The minimum of f over [lo, hi], searched on log(x)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = math.log(lo), math.log(hi)
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = f(math.exp(x1)), f(math.exp(x2))
    for _ in range(iters):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = f(math.exp(x1))
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = f(math.exp(x2))
    return math.exp((a + b) / 2)


def fit_device(measured, doc: Mapping[str, Any], *, run_id: int | None = None) -> DeviceFit:
    """The device fractions of analytic workload `doc` fitted to a measured run."""
    check_device_workload(doc)
    schedule = measured.evaluation.schedule
    ops, meas = measured_ops(measured)
    if not ops:
        raise CalibrationError(f"run {run_id}: no compute op of {measured.term} was timed")
    if any(m <= 0 for m in meas):
        raise CalibrationError("an op's measured time is not positive: the timings cannot be fitted")
    name, _, before = device_fractions(doc)

    def predict(fractions: Mapping[str, float]) -> list[float]:
        return predicted_ms(schedule, with_device(doc, fractions), ops)

    def cost(**fractions) -> float:
        return _sse(predict({**current, **fractions}), meas)

    current = dict(before)
    current["gemm_efficiency"] = _golden_log(lambda x: cost(gemm_efficiency=x), *SEARCH)
    not_fitted = {}
    why = _hbm_unidentified(predict, current)
    if why is None:
        for _ in range(ROUNDS):
            current["memory_efficiency"] = _golden_log(lambda x: cost(memory_efficiency=x), *SEARCH)
            current["gemm_efficiency"] = _golden_log(lambda x: cost(gemm_efficiency=x), *SEARCH)
    else:
        not_fitted["memory_efficiency"] = why
    fitted = {k: current[k] for k in FITTED if k not in not_fitted}
    for key, value in fitted.items():
        if value >= SEARCH[1] * (1 - 1e-6) or value <= SEARCH[0] * (1 + 1e-6):
            side = "above 1 (the run is faster than the device's peak)" if value > 0.5 else f"below {SEARCH[0]:g}"
            raise CalibrationError(f"the fitted {key} would be {side}, outside (0, 1]: the run is not this device "
                                   f"({name}) running this workload")
    pred_before, pred_after = predict(before), predict(current)
    residuals = _residuals(ops, meas, pred_before, pred_after)
    mean_error = lambda pred: statistics.fmean(abs(p / m - 1) for p, m in zip(pred, meas))  # noqa: E731
    workload = with_device(doc, fitted)
    # where the figures came from, which every step time computed on them names (device_source)
    workload["device"]["calibration"] = {"from": "run", "run": run_id, "term": measured.term,
                                         "steps": list(measured.used_steps),
                                         "date": datetime.date.today().isoformat()}
    return DeviceFit(run_id, measured.term, name, {k: float(before[k]) for k in FITTED}, fitted, not_fitted,
                     residuals, mean_error(pred_before), mean_error(pred_after), len(ops), measured.used_steps,
                     workload)


def _hbm_unidentified(predict, at: Mapping[str, float]) -> str | None:
    """Why the run cannot tell memory_efficiency (None: it can)."""
    base = predict(at)
    step = 0.99  # (down: a fraction may sit at 1)
    sens = {}
    for key in FITTED:
        moved = predict({**at, key: at[key] * step})
        sens[key] = [(m - b) / b for m, b in zip(moved, base)]
    g, h = sens["gemm_efficiency"], sens["memory_efficiency"]
    ng, nh = math.sqrt(sum(x * x for x in g)), math.sqrt(sum(x * x for x in h))
    if nh <= IDENTIFIED * ng:
        return (f"the ops are compute-bound: 1% less of it moves the prediction {nh:.2%} where 1% less "
                f"gemm_efficiency moves it {ng:.2%}")
    if abs(sum(a * b for a, b in zip(g, h))) / (ng * nh) > COLLINEAR:
        return "it moves every op's time in the same proportion as gemm_efficiency: the two cannot be told apart"
    return None


def _residuals(ops, meas, before, after) -> list[KindResidual]:
    groups: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        groups.setdefault(f"{base_module(op.module)} {op.kind}", []).append(i)
    return [KindResidual(kind, len(idx), statistics.fmean(meas[i] for i in idx),
                         statistics.fmean(before[i] / meas[i] - 1 for i in idx),
                         statistics.fmean(after[i] / meas[i] - 1 for i in idx))
            for kind, idx in groups.items()]


def load_for_device(db, run_id: int, doc: Mapping[str, Any] | None):
    """(the run's timings matched to its term on the analytic workload `doc`, or on the
    workload the run was saved with, that document)."""
    from mpipe_core.api import evaluate_once as evaluate
    from storage import get_run, get_version, timings_for

    from .calibrate import MeasuredRun, match_rows

    run = get_run(db, run_id)
    version = get_version(db, run.ref)
    if doc is None:
        doc = version.workload
    check_device_workload(doc)
    rows = timings_for(db, run_id)
    if not rows:
        raise CalibrationError(f"run {run_id} ({run.status}) has no timings")
    evaluation = evaluate(version.term, doc)
    steps, partial = match_rows(evaluation.schedule, rows)
    if not steps:
        raise CalibrationError(f"run {run_id}: none of its {len(rows)} timings make a complete step of "
                               f"{evaluation.term} on this workload")
    return MeasuredRun(run_id, evaluation.term, evaluation, steps, partial, len(rows)), doc
