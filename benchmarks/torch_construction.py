"""PyTorch's own schedule objects built without a process group, to time them
beside ours and to compare orders in tests (mock stages that only carry their
index, the pattern of torch's own tests)."""
from __future__ import annotations

import logging

from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining.stage import _PipelineStageBase

# torch logs "Using <class>" at INFO for every schedule it builds.
logging.getLogger("torch.distributed.pipelining.schedules").setLevel(logging.WARNING)


class MockStage(_PipelineStageBase):
    """Just enough of a pipeline stage for a schedule to compute its pipeline_order."""

    def __init__(self, stage_index: int, num_stages: int, group_size: int):
        self.submod = None
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = 0
        self.group = None

    def _create_grad_recv_info(self, *args, **kwargs):
        return ()

    def _prepare_forward_infra(self, *args, **kwargs):
        return ()

    def _prepare_backward_infra(self, *args, **kwargs):
        return ()


def construct(name: str, p: int, m: int):
    """Rank 0's view of torch's schedule class for one of our generator names."""
    if name == "1f1b":
        return torch_schedules.Schedule1F1B(MockStage(0, p, p), m)
    if name == "interleaved":
        return torch_schedules.ScheduleInterleaved1F1B([MockStage(i * p, 2 * p, p) for i in range(2)], m)
    if name == "zbv":
        return torch_schedules.ScheduleZBVZeroBubble([MockStage(0, 2 * p, p), MockStage(2 * p - 1, 2 * p, p)], m)
    raise KeyError(name)
