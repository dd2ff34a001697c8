"""What timing DTensor's collectives costs a tp op (printed by `python -m benchmarks comm-timing`).

One process, torch's fake process group (two "ranks" whose collectives return
at once), so only the Python cost of timing is left: the built-in tiny MLLM's
first layer sharded tp=2 with sequence parallelism, forward and backward,
timed three ways in interleaved rounds (median of each):

* untimed: the op as it runs without tp_comm rows;
* wrapped: `executor/parallel/collective_timer.py` (what tp runs use): DTensor's
  functional collectives wrapped, each waited on and recorded;
* dispatch mode: a bare pass-through `TorchDispatchMode` (the mechanism of torch's
  `CommDebugMode`), which sees every aten op, not only the collectives.

Run as `python -m benchmarks.tp_timer_cost` (its own process: it creates a
process group).
"""
from __future__ import annotations

import contextlib
import statistics
import time

ROUNDS, WARMUP = 30, 5


def _dispatch_mode():
    import torch
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types) and not isinstance(func, torch._ops.HigherOrderOperator):
                return NotImplemented  # DTensor lowers it first, as in CommDebugMode
            return func(*args, **(kwargs or {}))

    return PassThrough()


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from executor.parallel.collective_timer import tp_collective_timer
    from executor.parallel.tensor_parallel import builtin_plan
    from executor.runtime.models.loader import load_model
    from mpipe_core.runs.model_spec import ModelSpec

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = load_model(ModelSpec("tiny"))
    plan = builtin_plan(sequence_parallel=True)
    for style in plan["layers"].values():
        style.src_data_rank = None
    layer = model.layers[0]
    parallelize_module(layer, mesh, plan["layers"])
    batch = model.make_batch(0, 0, 1)
    ctx = model.context(batch)
    shape = model.hidden_shape(batch)
    x = torch.randn(shape[0], shape[1] // 2, *shape[2:], requires_grad=True)  # this rank's sequence block
    timer = tp_collective_timer(mesh)
    ways = {"untimed": contextlib.nullcontext, "wrapped (collective_timer)": lambda: timer.timing(None),
            "dispatch mode (every op)": _dispatch_mode}

    def once(scope) -> float:
        t0 = time.perf_counter()
        with scope():
            layer(x, ctx).sum().backward()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(WARMUP + ROUNDS):
        for name, scope in ways.items():
            t = once(scope)
            if r >= WARMUP:
                times[name].append(t)
    rows = len(timer.take_rows()) / (WARMUP + ROUNDS)
    base = statistics.median(times["untimed"])
    print(f"cost of timing tp collectives: tiny MLLM layer, tp2 with sp, forward + backward, one thread, fake "
          f"process group (collectives return at once), median of {ROUNDS} interleaved rounds; "
          f"{rows:g} collectives a pass")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<28} {med * 1e3:8.3f} ms  {med / base:5.2f}x untimed")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
