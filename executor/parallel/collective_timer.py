"""Timing the tp/sp collectives DTensor issues inside an op, as `tp_comm` rows.

Tensor parallelism's collectives are not ours to call: DTensor issues them
inside the parallel styles' hooks, in its sharded ops' redistributions and in
the autograd functions that carry gradients back (an all-reduce of a
row-wise output, the all-gather and reduce-scatter around sequence-parallel
norms, a replicated weight's partial gradient).  Each is a functional
collective (`torch.ops._c10d_functional.*`), issued asynchronously and waited
on where its result is first used, so timing around the hook would time only
the issue.

`CollectiveTimer` is a `TorchDispatchMode` the runtime enters around every op
of a tp rank (`RankRuntime.op_scope`).  As torch's `CommDebugMode` does, it
lets DTensor's own dispatch run first (returning NotImplemented for DTensor
arguments), so it sees the plain functional collectives DTensor lowers to.
For each one on the tp group it issues the collective, waits on it at once
(`wait_tensor`; the later wait DTensor's tensor makes finds the work done and
returns) and records (tp_comm, the op's chunk, start, end), perf_counter
seconds.  So a row is the collective's own time, and the overlap DTensor
might have had between issue and first use is given up: on gloo the first
use is the next op, which is nearly always at once.  Collectives on other
groups (cp's K/V gathers, timed as `cp_comm` by `context_parallel`) pass
through untimed.

On CUDA/NPU a wait only orders the streams, so the timer synchronises the
device before the issue and after the wait: the row is then the collective's
own time on the host clock the other comm rows use, and the rank's compute
queue is drained at each tp collective (a cost tp runs pay for their rows).
"""
from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

TP_COMM = "tp_comm"


def _functional_collectives() -> set:
    """The functional collectives' overload packets (the ops DTensor lowers to)."""
    ops = []
    for namespace in ("_c10d_functional", "_c10d_functional_autograd"):
        ns = getattr(torch.ops, namespace)
        for name in ("all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
                     "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
                     "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast"):
            try:
                ops.append(getattr(ns, name))
            except (AttributeError, RuntimeError):  # not in this torch
                continue
    return set(ops)


def _group_name(args: tuple, kwargs: dict) -> str | None:
    """A functional collective's group (its last string argument: `group_name`)."""
    if isinstance(kwargs.get("group_name"), str):
        return kwargs["group_name"]
    for a in reversed(args):
        if isinstance(a, str):
            return a
    return None


def _synchronizer(args: tuple):
    """The device synchronise of a collective's input (a no-op on CPU)."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None and args and isinstance(args[0], (list, tuple)):
        first = next((a for a in args[0] if isinstance(a, torch.Tensor)), None)
    if first is None or first.device.type == "cpu":
        return lambda: None
    backend = getattr(torch, first.device.type, None)
    return getattr(backend, "synchronize", lambda: None)


@functools.cache
def _mode_class():
    """Made on first use: tp runs only import DTensor's machinery."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    collectives = _functional_collectives()
    wait = torch.ops._c10d_functional.wait_tensor

    class _Mode(TorchDispatchMode):
        def __init__(self, timer: "CollectiveTimer", chunk: int):
            super().__init__()
            self.timer, self.chunk = timer, chunk

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if isinstance(func, torch._ops.HigherOrderOperator):
                return func(*args, **kwargs)
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # DTensor lowers it first; its collectives come back here
            if func._overloadpacket not in collectives or _group_name(args, kwargs) != self.timer.group_name:
                return func(*args, **kwargs)
            sync = _synchronizer(args)
            sync()
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    wait(t)
            sync()
            self.timer.rows.append((TP_COMM, self.chunk, t0, time.perf_counter()))
            return out

    return _Mode


class CollectiveTimer:
    """The tp group's collectives of each op, as (tp_comm, chunk, start, end) rows."""

    def __init__(self, group_name: str):
        self.group_name = group_name
        self.rows: list[tuple[str, int, float, float]] = []

    @contextmanager
    def timing(self, op: Any) -> Iterator[None]:
        """Time the tp collectives `op` issues (forward, or its backward parts)."""
        with _mode_class()(self, getattr(op, "chunk", -1)):
            yield

    def take_rows(self) -> list[tuple[str, int, float, float]]:
        rows, self.rows = self.rows, []
        return rows


def tp_collective_timer(mesh: Any) -> CollectiveTimer:
    """A timer for the collectives on `mesh`'s (1-D, the tp sub-mesh) process group."""
    return CollectiveTimer(mesh.get_group().group_name)
