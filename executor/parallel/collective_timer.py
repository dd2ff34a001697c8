"""Timing the tp/sp collectives DTensor issues inside an op, as `tp_comm` rows.

Tensor parallelism's collectives are not ours to call: DTensor issues them
inside the parallel styles' hooks, in its sharded ops' redistributions and in
the autograd functions that carry gradients back (an all-reduce of a
row-wise output, the all-gather and reduce-scatter around sequence-parallel
norms, a replicated weight's partial gradient).  Each is a functional
collective, issued asynchronously and waited on where its result is first
used, so timing around a hook would time only the issue.

DTensor reaches them through a handful of Python functions of
`torch.distributed._functional_collectives` (`all_reduce`,
`all_gather_single`, `reduce_scatter_single`, ...), looked up on that module
at each call.  In a tp rank's process `install` wraps those functions once:
while a `CollectiveTimer` is active (the runtime enters `timing(op)` around
every op, `RankRuntime.op_scope`), a call on the timer's group is waited on at
once and recorded as (tp_comm, the op's chunk, start, end), perf_counter
seconds; any other call (no timer active, another group: cp's K/V gathers,
which `context_parallel` times itself) passes straight through.  So a row is
the collective's own time, and the overlap DTensor might have had between the
issue and the first use is given up (on gloo the first use is the next op,
nearly always at once).  On CUDA/NPU a wait only orders the streams, so the
device is synchronised before the issue and after the wait.

Wrapping the functions, rather than a dispatch mode that sees every op (what
torch's `CommDebugMode` uses), costs only the collectives: a dispatch mode puts
every aten op through Python, which slows the op being timed
(`python -m benchmarks comm-timing` prints both costs).  A torch without one of
these functions simply has no rows for the collectives it would have carried.
"""
from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

TP_COMM = "tp_comm"

# The wrapped functions and where their `group` argument sits.
_GROUP_ARG = {"all_reduce": 2, "all_gather_single": 2, "reduce_scatter_single": 3,
              "all_gather_tensor": 2, "reduce_scatter_tensor": 3}
_WRAPPED = "_mpipe_timed"

_active: "CollectiveTimer | None" = None  # the timer of the op running now (one per process)
_chunk = -1


def _complete(out: Any) -> None:
    """Wait for a functional collective's result now (an AsyncCollectiveTensor)."""
    for t in out if isinstance(out, (list, tuple)) else (out,):
        trigger = getattr(t, "trigger_wait", None)
        if trigger is not None:
            trigger()


def _synchronizer(t: Any) -> Callable[[], None]:
    """The device synchronise of a collective's input (a no-op on CPU)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
        return lambda: None
    return getattr(getattr(torch, t.device.type, None), "synchronize", lambda: None)


def _timed(name: str, original: Callable) -> Callable:
    position = _GROUP_ARG[name]

    @functools.wraps(original)
    def call(*args, **kwargs):
        timer = _active
        if timer is None:
            return original(*args, **kwargs)
        group = kwargs.get("group", args[position] if len(args) > position else None)
        if timer.resolve(group) != timer.group_name:
            return original(*args, **kwargs)
        sync = _synchronizer(args[0] if args else kwargs.get("self"))
        sync()
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        _complete(out)
        sync()
        timer.rows.append((TP_COMM, _chunk, t0, time.perf_counter()))
        return out

    setattr(call, _WRAPPED, True)
    return call


def install() -> list[str]:
    """Wrap DTensor's functional collectives in this process (once); the names wrapped."""
    from torch.distributed import _functional_collectives as funcol

    done = []
    for name in _GROUP_ARG:
        original = getattr(funcol, name, None)
        if original is None:
            continue
        if not getattr(original, _WRAPPED, False):
            setattr(funcol, name, _timed(name, original))
        done.append(name)
    return done


class CollectiveTimer:
    """The tp group's collectives of each op, as (tp_comm, chunk, start, end) rows."""

    def __init__(self, group_name: str):
        self.group_name = group_name
        self.rows: list[tuple[str, int, float, float]] = []

    def resolve(self, group: Any) -> str | None:
        """A collective's group argument (a name, a ProcessGroup, a (mesh, dim) pair, ...) as
        its group's name; None for a form this torch does not resolve (not ours to time)."""
        if isinstance(group, str):
            return group
        from torch.distributed import _functional_collectives as funcol

        try:
            return funcol._resolve_group_name(group)
        except Exception:  # noqa: BLE001
            return None

    @contextmanager
    def timing(self, op: Any) -> Iterator[None]:
        """Time the tp collectives `op` issues (its forward, or its backward parts)."""
        global _active, _chunk
        _active, _chunk = self, getattr(op, "chunk", -1)
        try:
            yield
        finally:
            _active, _chunk = None, -1

    def take_rows(self) -> list[tuple[str, int, float, float]]:
        rows, self.rows = self.rows, []
        return rows


def tp_collective_timer(mesh: Any) -> CollectiveTimer:
    """A timer for the collectives on `mesh`'s (1-D, the tp sub-mesh) process group, DTensor's
    functional collectives wrapped in this process."""
    install()
    return CollectiveTimer(mesh.get_group().group_name)
