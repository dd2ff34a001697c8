"""per_batch(t): t re-planned for each drawn batch of the workload's data.

Evaluated on one workload (`mpipe eval TERM` without `--batches`) it is `t`
itself: the static plan for the workload's mean microbatch.  Over a stream
of batches (`mpipe eval --batches N`, `search/per_batch.py`) each batch gets
its own plan from its own costs, never slower than `t`'s on that batch."""
from __future__ import annotations

from mpipe_core.ir.schedule import Schedule
from mpipe_core.workloads.workload import Workload


def per_batch(schedule: Schedule, workload: Workload) -> Schedule:
    return schedule
