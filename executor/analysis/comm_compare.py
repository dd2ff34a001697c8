"""Measured against predicted communication, kind by kind (`compare-run --explain`).

Measured: the run's timed collectives and optimizer steps
(`timeline_record.COMM_KINDS`) of its first pipeline, summed over its stages,
the mean per used step (the steps after the warm-up, as every other figure of
the comparison).  Predicted: the simulator's communication slices of the
prediction's evaluation (`simulation.comm_timeline`), summed over the devices,
per step.  The kinds pair as the Designer's groups: `tp_comm` with tp,
`cp_comm` with cp, `dp_comm` and `dp_gather` (the gradient reduction and the
ZeRO gather) with dp, `optimizer` with the optimizer step.  A workload
without a cluster (an explicit-cost one, such as the fit to the run itself)
prices none: its side is None, and the caller says how to get one.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from mpipe_core.ir.timeline_record import COMM_KINDS

GROUP_OF_KIND = {"tp_comm": "tp", "cp_comm": "cp", "dp_comm": "dp", "dp_gather": "dp", "optimizer": "optimizer"}


@dataclass
class CommKind:
    kind: str  # the measured kinds of the group ("dp_comm + dp_gather" for dp under ZeRO-1)
    group: str  # the simulator's group they pair with: tp, cp, dp, optimizer
    measured_ms: float  # per step, summed over the pipeline's stages
    measured_count: float  # collectives (or optimizer steps) per step
    predicted_ms: float | None  # per step, summed over the devices; None: the workload prices none
    predicted_count: float | None

    @property
    def ratio(self) -> float | None:
        """measured / predicted."""
        return self.measured_ms / self.predicted_ms if self.predicted_ms else None

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def _predicted(evaluation) -> dict[str, tuple[float, float]] | None:
    """group -> (ms per step, collectives per step) of the prediction, or None if it prices none."""
    slices = list(evaluation.comm) if evaluation is not None else []
    if not slices:
        return None
    steps = max(1, len({op.step for order in evaluation.schedule.orders for op in order}))
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for c in slices:
        # The step's tail (dp, optimizer) is drawn once, for the last step: it is per step already.
        per = 1 if c.group in ("dp", "optimizer") else steps
        out[c.group][0] += c.seconds * 1e3 / per
        out[c.group][1] += (c.count if c.group != "optimizer" else 1) / per
    return {g: (ms, n) for g, (ms, n) in out.items()}


GROUPS = ("tp", "cp", "dp", "optimizer")


def compare_comm(rows, used_steps: list[int], evaluation) -> list[CommKind]:
    """Per group the run timed or the prediction prices, measured against predicted per
    step.  `rows`: the run's comm `TimelineRecord`s (seconds)."""
    steps = set(used_steps)
    measured: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    kinds: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        if r.step in steps and r.kind in GROUP_OF_KIND:
            group = GROUP_OF_KIND[r.kind]
            kinds[group].add(r.kind)
            measured[group][0] += (r.end - r.start) * 1e3 / len(steps)
            measured[group][1] += 1 / len(steps)
    predicted = _predicted(evaluation)
    out = []
    for group in GROUPS:
        if group not in measured and (predicted is None or group not in predicted):
            continue
        ms, n = measured.get(group, (0.0, 0.0))
        p_ms, p_n = (None, None) if predicted is None else predicted.get(group, (0.0, 0.0))
        names = sorted(kinds[group], key=COMM_KINDS.index) or [k for k, g in GROUP_OF_KIND.items()
                                                                if g == group][:1]
        out.append(CommKind(" + ".join(names), group, ms, n, p_ms, p_n))
    return out


def comm_lines(kinds: list[CommKind]) -> list[str]:
    """The terminal table `compare-run --explain` prints (ms per step)."""
    from .calibrate import _table

    head = ["communication by kind (ms per step; measured: the first pipeline's stages summed, "
            "mean over the used steps):"]
    if not kinds:
        return head + ["  none timed and none predicted"]
    rows = [[k.kind, k.group, f"{k.measured_ms:.3f}", f"{k.measured_count:g}",
             "-" if k.predicted_ms is None else f"{k.predicted_ms:.3f}",
             "-" if k.predicted_count is None else f"{k.predicted_count:g}",
             "-" if k.ratio is None else f"{k.ratio:.2f}"] for k in kinds]
    lines = head + _table(rows, ["kind", "group", "measured", "count", "predicted", "count",
                                 "measured / predicted"])
    if all(k.predicted_ms is None for k in kinds):
        lines.append("  (the prediction's workload prices no communication: it has no cluster; "
                     "--workload launched, or a saved analytic workload, does)")
    return lines
