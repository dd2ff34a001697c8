"""Build PyTorch's own schedule objects without a process group, to time them
beside ours (mock stages that only carry their index, as torch's tests do)."""
from __future__ import annotations

import logging

logging.getLogger("torch.distributed.pipelining.schedules").setLevel(logging.WARNING)


def construct(name: str, p: int, m: int):
    from torch.distributed.pipelining import schedules as s
    from torch.distributed.pipelining.stage import _PipelineStageBase

    class MockStage(_PipelineStageBase):
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

    if name == "1f1b":
        return s.Schedule1F1B(MockStage(0, p, p), m)
    if name == "interleaved":
        return s.ScheduleInterleaved1F1B([MockStage(i * p, 2 * p, p) for i in range(2)], m)
    if name == "zbv":
        return s.ScheduleZBVZeroBubble([MockStage(0, 2 * p, p), MockStage(2 * p - 1, 2 * p, p)], m)
    raise KeyError(name)
