"""Iteration lines of a training log: what `mpipe calibrate --log` fits a device to.

Three stacks print one line per logged iteration (docs/cluster.md quotes them):

* Megatron-LM and MindSpeed (`training.py: training_log`)::

      [2026-12-07 10:00:00] iteration       20/     100 | consumed samples: 640 |
      elapsed time per iteration (ms): 1420.3 | throughput per GPU (TFLOP/s/GPU): 137.1 |
      learning rate: ... | global batch size: 32 | lm loss: ... | loss scale: 1.0 | ...

  (all on one line; the throughput only with `--log-throughput`).  The time is the
  mean over the `--log-interval` iterations since the last line.  The world size is
  on the start-up line `using world size: 8, data-parallel size: 2, ...`.
* the MindSpeed-MM FSDP trainer (`mindspeed_mm/fsdp/train/train_engine.py:
  training_log`): the same `iteration N/T | consumed samples | elapsed time per
  iteration (ms): X |` fields, then `learning rate`, `global batch size`, each loss
  as `NAME: X |` and `grad norm`, never `loss scale` nor a throughput (it prints no
  world size either).
* torchtitan (`components/metrics.py: MetricsProcessor.log`), in ANSI colours::

      step: 10  loss:  7.9000  grad_norm: 1.2  memory: 30.12GiB(38.0%)  tps: 5,120
      tflops: 210.33  mfu: 21.27%

  `tps` is tokens per second per device (tokens since the last line over the time
  times tp x cp x pp), so a step takes global tokens / (tps x devices); step 1 is
  always logged.  The world size is the product of `Building N-D device mesh with
  [names], [sizes]`.

A line counts only when its fields are complete (a value followed by its
terminator: ` |` after Megatron's time, `%` after torchtitan's MFU), so a log
cut off mid-line (a job killed while writing) never contributes a truncated
number: that line is counted in `incomplete`.  Pure text parsing.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MEGATRON, MINDSPEED_MM, TORCHTITAN = "megatron", "mindspeed-mm-fsdp", "torchtitan"
FORMATS = {MEGATRON: "Megatron-LM / MindSpeed", MINDSPEED_MM: "MindSpeed-MM FSDP trainer", TORCHTITAN: "torchtitan"}
KNOWN_LINES = ("Megatron-LM/MindSpeed 'elapsed time per iteration (ms): X |', torchtitan "
               "'step: N ... tps: X ... mfu: X%', MindSpeed-MM FSDP 'iteration N/T | ... elapsed time per "
               "iteration (ms): X |'")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUMBER + r"\s*\|")
_ELAPSED_ANY = re.compile(r"elapsed time per iteration \(ms\)")
_ITERATION = re.compile(r"\biteration\s+([0-9]+)\s*/\s*([0-9]+)\s*\|")
_THROUGHPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUMBER + r"\s*\|")
_MEGATRON_ONLY = re.compile(r"\|\s*(?:lm loss|loss scale|number of skipped iterations|"
                            r"throughput per GPU)\b")
_TITAN = re.compile(r"(?<![A-Za-z_])step:\s*([0-9]+)\s.*?\btps:\s*" + _NUMBER
                    + r"(?:\s+tflops:\s*" + _NUMBER + r")?\s+mfu:\s*" + _NUMBER + r"%")
_TITAN_ANY = re.compile(r"(?<![A-Za-z_])step:\s*[0-9]+\s.*\btps:")
_WORLD_MEGATRON = re.compile(r"using world size:\s*([0-9]+)")
_WORLD_TITAN = re.compile(r"Building [0-9]+-D device mesh with \[[^\]]*\],\s*\[([0-9,\s]*)\]")


@dataclass(frozen=True)
class IterationLine:
    """One logged iteration: where it is, and what it says (None: not printed)."""

    line: int  # 1-based line number in the file
    iteration: int | None
    step_ms: float | None = None  # Megatron / MindSpeed: the mean iteration time
    tokens_per_s: float | None = None  # torchtitan: tokens per second per device
    tflops: float | None = None  # the log's own TFLOP/s per device
    mfu: float | None = None  # the log's own MFU (a fraction)


@dataclass(frozen=True)
class TrainingLog:
    format: str  # MEGATRON, MINDSPEED_MM or TORCHTITAN
    lines: tuple[IterationLine, ...]
    world_size: int | None  # as the log states it (None: it does not)
    incomplete: tuple[int, ...] = field(default=())  # line numbers of iteration lines cut short

    @property
    def label(self) -> str:
        return FORMATS[self.format]


class LogFormatError(ValueError):
    """Text with no iteration line of a known format."""


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_training_log(text: str) -> TrainingLog:
    """The iteration lines of one training log (one rank's output, or several ranks'
    interleaved: only the rank that logs prints them).  Raises `LogFormatError` when
    no line is an iteration line of a known format."""
    megatron: list[IterationLine] = []
    titan: list[IterationLine] = []
    incomplete: dict[str, list[int]] = {MEGATRON: [], TORCHTITAN: []}
    world: dict[str, int] = {}
    megatron_only = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = strip_ansi(raw)
        if (m := _WORLD_MEGATRON.search(line)) is not None:
            world[MEGATRON] = int(m.group(1))
        if (m := _WORLD_TITAN.search(line)) is not None:
            sizes = [int(x) for x in m.group(1).replace(" ", "").split(",") if x]
            world[TORCHTITAN] = math.prod(sizes)
        if _ELAPSED_ANY.search(line):
            m = _ELAPSED.search(line)
            if m is None:
                incomplete[MEGATRON].append(number)
                continue
            it = _ITERATION.search(line)
            thr = _THROUGHPUT.search(line)
            megatron_only |= _MEGATRON_ONLY.search(line) is not None
            megatron.append(IterationLine(number, int(it.group(1)) if it else None, step_ms=_number(m.group(1)),
                                          tflops=_number(thr.group(1)) if thr else None))
        elif _TITAN_ANY.search(line) and "validate step" not in line:  # (validation lines have a tps too)
            m = _TITAN.search(line)
            if m is None:
                incomplete[TORCHTITAN].append(number)
                continue
            titan.append(IterationLine(number, int(m.group(1)), tokens_per_s=_number(m.group(2)),
                                       tflops=_number(m.group(3)) if m.group(3) else None,
                                       mfu=_number(m.group(4)) / 100))
    if not megatron and not titan:
        cut = incomplete[MEGATRON] + incomplete[TORCHTITAN]
        if cut:
            raise LogFormatError(f"no complete iteration line (line {cut[0]} is cut short)")
        raise LogFormatError(f"no iteration line of a known format ({KNOWN_LINES})")
    if titan and len(titan) > len(megatron):
        return TrainingLog(TORCHTITAN, tuple(titan), world.get(TORCHTITAN), tuple(incomplete[TORCHTITAN]))
    fmt = MEGATRON if megatron_only or MEGATRON in world else MINDSPEED_MM
    return TrainingLog(fmt, tuple(megatron), world.get(MEGATRON), tuple(incomplete[MEGATRON]))
