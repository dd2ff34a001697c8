"""The options a queued run may carry (`mpipe runs enqueue -o KEY=VALUE`, the app's
launch form) and the one set of rules for them: the queue checks them when a run
is enqueued, the worker again when it prepares the run, so a bad option is
refused at once instead of minutes later (or never: NaN switches a limit off).

=============  ===============================================================
model          executor model preset (tiny, tiny-text, small, vit-heavy, ...), a
               registered model, hf:llava, hf:qwen2_5_vl, or hf:/path under the
               checkpoint root (`mpipe_core.runs.model_registry`; never an import path)
model_config   passed to an own model (hf: tiny, tiny-frozen, small, frozen)
microbatch_size, seq_len, images   an own model's batches (as `mpipe run`)
optimizer      sgd (default) or adamw;  `lr` in (0, 10], `momentum` in [0, 1)
check_grads    true: compare loss and gradients with a single-process
               reference run; a mismatch fails the run
precision      fp32 (default) or bf16: bf16 compute, fp32 master weights and
               gradient reductions (`executor.runtime.precision`)
timeout_s      wall-clock limit of the whole run (default 3600, at most a week)
stall_s        no op progress for this long = hung (default 120)
startup_s      every rank must be up within this (default 300)
nnodes         nodes to spread the ranks over (default 1; must divide the ranks)
data           a data file (a data section or a .jsonl of samples, absolute path)
               under the operator's data root: each step planned from its drawn
               batch, as `mpipe run --data` (`mpipe_core.runs.model_registry`)
=============  ===============================================================
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from mpipe_core.errors import MpipeError
from mpipe_core.runs.model_registry import MODEL_PRESET_NAMES, ModelNotAllowed, ModelRegistry, load_registry

# The torch.distributed backends a schedule can run on.  Names only: the
# executor implements them, storage records a run's, the CLI and the app offer
# them; all take the list from here.
BACKENDS = ("gloo", "nccl", "hccl")

OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("fp32", "bf16")
DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_STALL_S = 120.0
DEFAULT_STARTUP_S = 300.0
WEEK_S = 7 * 24 * 3600.0
# What one run may ask for: within 32-bit columns, and far more than any worker serves.
MAX_STEPS = 1_000_000
MAX_PROCS = 100_000
MAX_ATTEMPTS = 100


MAX_TEXT = 500


class RunOptionError(MpipeError):
    """Run options with an unknown name, the wrong type or a value out of range;
    `problems` has one line per bad option (the message joins them)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems) if problems is not None else [message]


@dataclass(frozen=True)
class _Rule:
    kind: type
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is str:
            return f"text of 1 to {MAX_TEXT} characters"
        if self.kind is bool:
            return "true or false"
        left = "(" if self.lo_open else "["
        right = ")" if self.hi_open else "]"
        what = "an integer" if self.kind is int else "a finite number"
        return f"{what} in {left}{self.lo:g}, {self.hi:g}{right}"

    def check(self, value: Any) -> Any:
        if self.choices:
            if isinstance(value, str) and value in self.choices:
                return value
            return None
        if self.kind is str:
            return value if isinstance(value, str) and 0 < len(value) <= MAX_TEXT and "\x00" not in value else None
        if self.kind is bool:
            return value if isinstance(value, bool) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if self.kind is int and not isinstance(value, int):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if value < self.lo or (self.lo_open and value == self.lo):
            return None
        if value > self.hi or (self.hi_open and value == self.hi):
            return None
        return self.kind(value)


RUN_OPTIONS: dict[str, _Rule] = {
    "model": _Rule(str),  # checked against the model registry (`check_run_options`)
    "model_config": _Rule(str),
    "microbatch_size": _Rule(int, 1, 4096),
    "seq_len": _Rule(int, 1, 1_000_000),
    "images": _Rule(int, 1, 100_000),
    "optimizer": _Rule(str, choices=OPTIMIZERS),
    "lr": _Rule(float, 0.0, 10.0, lo_open=True),
    "momentum": _Rule(float, 0.0, 1.0, hi_open=True),
    "check_grads": _Rule(bool),
    "precision": _Rule(str, choices=PRECISIONS),
    "timeout_s": _Rule(float, 0.0, WEEK_S, lo_open=True),
    "stall_s": _Rule(float, 0.0, WEEK_S, lo_open=True),
    "startup_s": _Rule(float, 0.0, WEEK_S, lo_open=True),
    "nnodes": _Rule(int, 1, 4096),
    "data": _Rule(str),  # checked against the operator's data root (`check_run_options`)
}


def parse_option_pairs(pairs, problems: list[str] | None = None) -> dict[str, Any]:
    """`KEY=VALUE` texts (the CLI's `-o`, the app's options field) -> options; VALUE is
    read as JSON when it can be (`true`, `0.5`), else kept as text.  Not yet checked.

    Every malformed pair is named in one RunOptionError, or, with a `problems`
    list, appended to it (and left out) so a caller can report them together
    with the values' problems (`option_problems`)."""
    options: dict[str, Any] = {}
    found: list[str] = []
    for pair in pairs:
        key, eq, raw = pair.strip().partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not key:
            found.append(f"option {pair[:40]!r}: expected KEY=VALUE")
            continue
        if key in options:
            found.append(f"option {key[:40]} given twice")
            continue
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    if problems is not None:
        problems.extend(found)
    elif found:
        raise RunOptionError("; ".join(found), found)
    return options


def _checked(options: Mapping[str, Any], ranks: int | None,
             registry: ModelRegistry | None = None) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in options.items():
        rule = RUN_OPTIONS.get(key)
        if rule is None:
            problems.append(f"unknown run option {str(key)[:40]!r} (known: {', '.join(RUN_OPTIONS)})")
            continue
        if key == "model":
            if value not in MODEL_PRESET_NAMES and registry is None:
                registry = load_registry()
            try:
                out[key] = value if value in MODEL_PRESET_NAMES else registry.admit(value)
            except ModelNotAllowed as error:
                problems.append(error.message)
            continue
        if key == "data":
            registry = registry or load_registry()
            try:
                out[key] = registry.data_file(value)
            except ModelNotAllowed as error:
                problems.append(error.message)
            continue
        checked = rule.check(value)
        if checked is None:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            problems.append(f"run option {key}: expected {rule.describe()}, got {shown}")
            continue
        out[key] = checked
    nnodes = out.get("nnodes", 1)
    if ranks is not None and ranks % nnodes:
        problems.append(f"run option nnodes: {ranks} ranks do not split evenly over {nnodes} nodes")
    return out, problems


def option_problems(options: Mapping[str, Any], ranks: int | None = None,
                    registry: ModelRegistry | None = None) -> list[str]:
    """What is wrong with each bad option (empty: all good), in the order given."""
    return _checked(options, ranks, registry)[1]


def check_run_options(options: Mapping[str, Any], ranks: int | None = None,
                      registry: ModelRegistry | None = None) -> dict[str, Any]:
    """The options with numbers normalised, or one RunOptionError naming every bad one
    (`; ` between them).  With `ranks`, `nnodes` must divide it.  `model` must be one
    `registry` admits (default: the registry of this process's environment, read only
    when the model is not a preset); nothing it names is imported here."""
    out, problems = _checked(options, ranks, registry)
    if problems:
        raise RunOptionError("; ".join(problems), problems)
    return out


def devices_text(devices: int, encoder_devices: int = 0) -> str:
    """A schedule's device count for a rank-count error: with encoder devices of
    their own (`disaggregate`) the p + k it is made of."""
    if not encoder_devices:
        return f"{devices} devices"
    return (f"{devices} devices (p + k = {devices - encoder_devices} LLM + {encoder_devices} encoder "
            f"device{'s' if encoder_devices != 1 else ''} of disaggregate)")


def encoder_devices_of(term: str) -> int:
    """The encoder devices of a term's outermost `disaggregate` (0: none, or a term
    that does not parse: its own error is reported elsewhere)."""
    from mpipe_core.algebra.terms import Call, parse
    from mpipe_core.errors import TermError

    try:
        todo = [parse(term)]
    except TermError:
        return 0
    while todo:
        call = todo.pop(0)
        if call.name == "disaggregate":
            return int(call.kw("encoder_devices") or 0)
        todo += [v for _, v in call.kwargs if isinstance(v, Call)]
    return 0
