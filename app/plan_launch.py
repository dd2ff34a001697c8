"""The Plan page's Launch: a candidate as a run spec (`mpipe plan --emit mpipe`'s
object), the schedule name it is saved under, and in words what of its layout
the queue runs (`layout.runnable_workload_layout`, the rule `enqueue` applies)."""
from __future__ import annotations

import re
from typing import Any

from mpipe_core.runs.layout import runnable_workload_layout
from mpipe_core.runs.run_spec import RunSpec, run_spec_from_plan_row, spec_workload

NAME_LENGTH = 100  # storage's schedule name bound


def row_spec(result: Any, picked: int) -> RunSpec:
    """Candidate `picked` of a plan as the run spec `plan --emit mpipe` would write for it."""
    return run_spec_from_plan_row(result.candidates[picked].as_dict(),
                                  source=f"the Plan page: {result.devices} devices, global batch "
                                         f"{result.global_batch}, #{picked + 1} of {len(result.candidates)}")


def default_name(label: str, spec: RunSpec) -> str:
    """A schedule name for the row: the workload's label and the layout, in the library's alphabet."""
    layout = spec.layout
    parts = [f"tp{layout.tp}"] * (layout.tp > 1) + [f"cp{layout.cp}"] * (layout.cp > 1) + [f"pp{layout.pp}",
                                                                                           f"dp{layout.dp}"]
    base = re.sub(r"[^A-Za-z0-9._+-]+", "-", label).strip("-._+") or "workload"
    return f"plan-{base}-{'-'.join(parts)}"[:NAME_LENGTH]


def what_runs(spec: RunSpec) -> str:
    """The ranks the queued run takes and what of the spec's layout it runs."""
    runs = runnable_workload_layout(spec_workload(spec), spec.layout.pp)
    text = f"Queues {runs.describe()}"
    if runs != spec.layout:
        text += (f"; the row asks for {spec.layout.describe()}: the queue cannot yet tell whether the model it "
                 f"runs has a tensor-parallel plan, so the run executes one pipeline and says what it dropped "
                 f"(mpipe run --spec runs the whole layout)")
    return text + "."
