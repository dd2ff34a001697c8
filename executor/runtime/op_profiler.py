"""`mpipe run --profile DIR`: each rank's steps under the device's profiler, every
op labelled by Mpipe's convention, written where `mpipe import-trace DIR` reads
it back (docs/trace-import.md, "Our own runs on NPU").

* Labels: every compute op runs inside `record_function("mpipe:<module>:<kind>:
  <microbatch>:<chunk>")` (`mpipe_core.formats.label_pattern`'s convention), each
  step inside `record_function("ProfilerStep#<step>")`.  Collectives (BCAST, AR,
  GATHER, SCATTER) and replica modules (`llm@1`) have no label in that
  convention and are not labelled.
* NPU (`hccl`): `torch_npu.profiler.profile` with activities CPU and NPU,
  `experimental_config=_ExperimentalConfig(export_type=Text, profiler_level=
  Level1, aic_metrics=AiCoreNone, data_simplification=False)`, `record_shapes`,
  `profile_memory` and `with_stack` off, `on_trace_ready=
  tensorboard_trace_handler(DIR)`: one `<host>_<pid>_<stamp>_ascend_pt/`
  folder per rank with `trace_view.json` and `step_trace_time.csv` (Level1:
  the HCCL lanes too).  torch_npu is imported only on this path.
* CUDA (`nccl`) and CPU (`gloo`): `torch.profiler.profile` with CPU (and CUDA)
  activity, exported as `DIR/rank<R>_trace.json` (Kineto; on CUDA the labels'
  device-side copies are `gpu_user_annotation` ranges).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch

from mpipe_core.ir.ops import BW, B, F, R, W, Op

LABELLED_KINDS = (F, B, W, BW, R)


def op_label(op: Op) -> str | None:
    """The op's range name in the `mpipe:` convention, or None (no label for it there)."""
    if op.kind not in LABELLED_KINDS or op.mb < 0 or "@" in op.module:
        return None
    return f"mpipe:{op.module}:{op.kind}:{op.mb}:{op.chunk}"


def npu_profiler(folder: Path):
    """torch_npu's profiler with the settings docs/trace-import.md states."""
    import torch_npu  # noqa: F401  (only on the hccl path)

    profiler = torch_npu.profiler
    config = profiler._ExperimentalConfig(export_type=profiler.ExportType.Text,
                                          profiler_level=profiler.ProfilerLevel.Level1,
                                          aic_metrics=profiler.AiCMetrics.AiCoreNone, data_simplification=False)
    return profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU],
                            record_shapes=False, profile_memory=False, with_stack=False,
                            experimental_config=config, on_trace_ready=profiler.tensorboard_trace_handler(str(folder)))


@contextlib.contextmanager
def profiling(folder: str | None, device: torch.device, rank: int) -> Iterator[bool]:
    """Profile what runs inside (yields whether it does); writes the rank's trace on the way out."""
    if not folder:
        yield False
        return
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    if device.type == "npu":
        with npu_profiler(out):
            yield True
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=False, profile_memory=False, with_stack=False) as prof:
        yield True
    prof.export_chrome_trace(str(out / f"rank{rank}_trace.json"))


def step_range(step: int, on: bool):
    """The step's `ProfilerStep#N` range (a no-op when not profiling)."""
    return torch.profiler.record_function(f"ProfilerStep#{step}") if on else contextlib.nullcontext()


def op_range(op: Op, on: bool):
    label = op_label(op) if on else None
    return torch.profiler.record_function(label) if label else contextlib.nullcontext()
