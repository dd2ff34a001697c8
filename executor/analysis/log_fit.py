"""A device's GEMM efficiency fitted from a training log: `mpipe calibrate --log`.

Every Megatron-LM, MindSpeed, MindSpeed-MM or torchtitan job prints one line per
logged iteration (`mpipe_core.formats.training_log`).  Given the analytic
workload the job ran (a model, a device, a cluster, its `parallel` section) and
the term of its pipeline schedule, the fit:

* converts each line to a step time in seconds: Megatron's `elapsed time per
  iteration (ms)` as it is; torchtitan's tokens per second per device as the
  step's global tokens (global batch x sequence length, as the workload and the
  term state them) over tps x the job's devices;
* leaves out the warm-up: the first `skip` lines (1 by default: the first line
  includes start-up, compilation and allocation; MindSpeed's examples drop the
  first 100);
* takes the median of the rest (robust to a checkpoint save, a slow data batch);
* solves for the device's `gemm_efficiency` so that the simulated step time
  (`Evaluation.step.step_time_s`, the same figure `mpipe eval` prints) equals that
  median, by bisection on its logarithm in [0.001, 1]: the step time never grows
  with the efficiency.  One number identifies one fraction: the others
  (`attention_efficiency`, `hbm_efficiency`, `memory_efficiency`,
  `flash_efficiency`) stay as the workload states them (the report says so); an
  `attention_efficiency` the workload leaves out is the GEMM's by the model's
  rule, so it moves with it (the report says that too).

A median the model cannot reach at any efficiency in (0, 1] is refused: the log
is not this workload on this device.  So is a log whose world size (when it
prints one) differs from the layout's devices (tp x cp x dp x the term's
pipeline devices).  The written workload's device section records where its
figures came from (`calibration`: the log's file, format, lines used, date),
which every step time then names (`mpipe_core.workloads.device_source`).
"""
from __future__ import annotations

import datetime
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mpipe_core.formats.training_log import TORCHTITAN, LogFormatError, TrainingLog, parse_training_log
from mpipe_core.workloads.device_source import device_source

from ..errors import CalibrationError
from .device_fit import check_device_workload, device_fractions, with_device

SEARCH = (1e-3, 1.0)
FITTED = "gemm_efficiency"
TOLERANCE = 1e-9  # relative, on the step time


@dataclass
class LogFit:
    log: str  # the file as named
    format: str
    term: str
    device: str
    before: float  # the workload's gemm_efficiency
    fitted: float
    kept: dict[str, float]  # the fractions the fit leaves as they are
    median_s: float  # the steady lines' median step time
    predicted_before_s: float
    predicted_s: float  # at the fitted efficiency
    used: int  # steady lines
    skipped: int
    incomplete: int  # iteration lines cut short (left out)
    spread: tuple[float, float]  # the steady lines' min and max relative to the median
    world_size: int | None
    devices: int
    log_tflops: float | None  # the log's own median TFLOP/s per device (None: it prints none)
    model_tflops: float  # the model's TFLOP/s per device at the fitted step time
    workload: dict = field(repr=False)
    follows: dict[str, str] = field(default_factory=dict)  # fraction -> the one it equals, unstated

    @property
    def residual(self) -> float:
        """predicted / median - 1 at the fitted efficiency."""
        return self.predicted_s / self.median_s - 1

    def as_dict(self) -> dict[str, Any]:
        return {"log": self.log, "format": self.format, "term": self.term, "device": self.device,
                "before": {FITTED: self.before}, "fitted": {FITTED: self.fitted}, "kept": self.kept,
                "follows": self.follows, "median_step_s": self.median_s, "predicted_before_s": self.predicted_before_s,
                "predicted_step_s": self.predicted_s, "residual": self.residual, "lines_used": self.used,
                "lines_skipped": self.skipped, "lines_incomplete": self.incomplete,
                "spread": list(self.spread), "world_size": self.world_size, "devices": self.devices,
                "log_tflops_per_device": self.log_tflops, "model_tflops_per_device": self.model_tflops,
                "workload": self.workload}

    def format_report(self) -> str:
        lo, hi = self.spread
        lines = [f"device {self.device} fitted from log {self.log} ({self.format}): {self.used} steady "
                 f"iteration line{'s' if self.used != 1 else ''} used, {self.skipped} skipped as warm-up"
                 + (f", {self.incomplete} cut short left out" if self.incomplete else ""),
                 f"  {FITTED:<17} {self.before:.4g} -> {self.fitted:.4g}",
                 "  kept             " + ", ".join(f"{k} {v:.4g}" for k, v in self.kept.items())
                 + " (one step time identifies one fraction; as the workload states them)"]
        lines += [f"  {k} = {other} (the workload states none), so it moved with it" for k, other in
                  self.follows.items() if other == FITTED]
        lines += [f"step time    median {self.median_s:.6g} s (steady lines {lo:+.1%} .. {hi:+.1%} of it); "
                  f"predicted {self.predicted_before_s:.6g} s before, {self.predicted_s:.6g} s after "
                  f"(residual {self.residual:+.2e})",
                  f"devices      {self.devices} in the layout of {self.term}"
                  + (f"; the log's world size {self.world_size}" if self.world_size is not None
                     else "; the log states no world size")]
        if self.log_tflops is not None:
            lines.append(f"throughput   the log's median {self.log_tflops:.4g} TFLOP/s per device; the model's "
                         f"{self.model_tflops:.4g} (model FLOPs at the median step; the two stacks may count "
                         "FLOPs differently)")
        return "\n".join(lines)


def read_log(path: str) -> TrainingLog:
    """The iteration lines of the log at `path` (a user's file: errors are one line)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise CalibrationError(f"{path}: cannot read ({error.strerror or error})") from None
    try:
        return parse_training_log(text)
    except LogFormatError as error:
        raise CalibrationError(f"{path}: {error}") from None


def _step_seconds(log: TrainingLog, evaluation) -> list[float]:
    """Each iteration line's step time in seconds."""
    if log.format != TORCHTITAN:
        return [line.step_ms / 1e3 for line in log.lines]
    step = evaluation.step
    tokens_per_step = step.tokens_per_s * step.step_time_s  # global batch x sequence length
    return [tokens_per_step / (line.tokens_per_s * step.devices_total) if line.tokens_per_s > 0 else math.inf
            for line in log.lines]


def fit_log(log: TrainingLog, doc: Mapping[str, Any], term: str, *, skip: int = 1, name: str = "log",
            today: datetime.date | None = None) -> LogFit:
    """The device's gemm_efficiency fitted so that `term` on `doc` takes the log's steady median step."""
    from mpipe_core.api import evaluate

    check_device_workload(doc)
    device, _, fractions = device_fractions(doc)
    first = evaluate(term, dict(doc))
    devices = first.step.devices_total
    if log.world_size is not None and log.world_size != devices:
        par = doc.get("parallel") or {}
        raise CalibrationError(
            f"{name}: the log's world size is {log.world_size}, the layout has {devices} devices "
            f"(tp {par.get('tp', 1)} x cp {par.get('cp', 1)} x dp {par.get('dp', 1)} x {first.schedule.devices} "
            f"pipeline devices of {first.term}): give the job's --parallel and term")
    if len(log.lines) <= skip:
        raise CalibrationError(f"{name}: {len(log.lines)} iteration line{'s' if len(log.lines) != 1 else ''} "
                               f"({log.label}); --skip {skip} leaves none to fit")
    steady = _step_seconds(log, first)[skip:]
    median = statistics.median(steady)
    if not 0 < median < math.inf:
        raise CalibrationError(f"{name}: the steady lines' median step time is {median:g} s: nothing to fit")

    def predict(g: float) -> float:
        return evaluate(term, with_device(doc, {FITTED: g})).step.step_time_s

    lo, hi = SEARCH
    at_hi = predict(hi)
    if at_hi > median * (1 + TOLERANCE):
        raise CalibrationError(f"{name}: the median step {median:.6g} s is faster than {first.term} can run on "
                               f"{device} even at {FITTED} 1 ({at_hi:.6g} s): the log is not this workload on this "
                               "device")
    at_lo = predict(lo)
    if at_lo < median:
        raise CalibrationError(f"{name}: the median step {median:.6g} s is slower than {first.term} runs on "
                               f"{device} at {FITTED} {lo:g} ({at_lo:.6g} s): the log is not this workload on this "
                               "device")
    a, b = math.log(lo), math.log(hi)
    for _ in range(200):  # predict(exp(a)) >= median >= predict(exp(b))
        mid = (a + b) / 2
        if predict(math.exp(mid)) >= median:
            a = mid
        else:
            b = mid
        if b - a < 1e-12:
            break
    fitted = math.exp((a + b) / 2)
    fitted_doc = with_device(doc, {FITTED: fitted})
    final = evaluate(term, fitted_doc)
    date = (today or datetime.date.today()).isoformat()
    fitted_doc["device"]["calibration"] = {
        "from": "log", "log": Path(name).name, "format": log.format, "term": final.term, "lines": len(steady),
        "skipped": skip, "median_step_s": median, "date": date}
    tflops = [line.tflops for line in log.lines[skip:] if line.tflops is not None]
    source = device_source(doc)
    follows = {k: other for k, other in source.follows.items() if other == FITTED}
    return LogFit(
        log=name, format=log.label, term=final.term, device=device, before=float(fractions[FITTED]), fitted=fitted,
        kept={k: v for k, v in source.fractions.items() if k != FITTED and k not in follows},
        median_s=median, predicted_before_s=first.step.step_time_s, predicted_s=final.step.step_time_s,
        used=len(steady), skipped=skip, incomplete=len(log.incomplete),
        spread=(min(steady) / median - 1, max(steady) / median - 1), world_size=log.world_size, devices=devices,
        log_tflops=statistics.median(tflops) if tflops else None,
        model_tflops=final.step.model_tflops_per_device * final.step.step_time_s / median,
        workload=fitted_doc, follows=follows)
