"""Measured memory of a rank: the activations autograd saves, and static memory.

**Activation memory** is counted as the bytes of the storages autograd saves
for backward, live over time (`MemoryMeter`):

* every tensor autograd saves goes through `torch.autograd.graph.saved_tensors_hooks`;
  the pack hook counts its storage and hands autograd a small handle holding
  the tensor (detached: a saved output holding its own graph node would be a
  reference cycle autograd never frees);
* the handle lives exactly as long as autograd keeps the saved tensor: a
  backward without `retain_graph` releases it as the node runs, otherwise it
  goes when its graph is dropped (the op's last backward part).  Its `__del__`
  uncounts it, so no guess about op lifetimes is made;
* a storage several saved tensors share (a view, the same input saved by two
  ops, a chunk's output saved by the next chunk on this rank) counts once,
  while any of them lives;
* what a rank keeps for a recompute outside autograd (the inputs of fully
  recomputed layers) is counted the same way, through `hold`;
* never counted: storages of parameters and buffers (static memory) and of
  the layers' context (positions, masks, rotary tables: built once per
  microbatch, kept by the rank for the whole step and shared by every layer,
  so not what a layer saves).

The peak is the most live at once, and the op running when it was reached.

**Static memory** (`static_memory`): the bytes of the parameters of the parts
a rank holds, of their gradients at the end of a step, and of the optimizer's
state after its step (each storage once).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator

import torch


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(key, bytes) of a tensor's storage, None for one without (or empty); a DTensor's
    is its local shard's (tensor parallelism)."""
    t = getattr(t, "_local_tensor", t)
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, meta, ...
        return None
    nbytes = storage.nbytes()
    if nbytes == 0:
        return None
    return storage.data_ptr(), nbytes


def tensors_in(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor inside a value: itself, or nested in lists, tuples, dicts
    and plain objects' attributes (a model's context)."""
    if depth > 8 or value is None:
        return
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
        for item in vars(value).values():
            yield from tensors_in(item, depth + 1)


class Saved:
    """What autograd (or a `hold`) keeps of one tensor; uncounted when it goes."""

    __slots__ = ("tensor", "_meter", "_key")

    def __init__(self, meter: "MemoryMeter | None", key: int | None, tensor: torch.Tensor):
        self.tensor, self._meter, self._key = tensor, meter, key

    def __del__(self) -> None:
        if self._meter is not None and self._key is not None:
            self._meter._release(self._key)

    def release(self) -> None:
        """Stop counting it now (its storage may still be counted through others)."""
        if self._meter is not None and self._key is not None:
            self._meter._release(self._key)
        self._meter = self._key = None


class MemoryMeter:
    """Live bytes of saved storages on one rank (see the module's note)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a handle may be freed from a collector's pass in any thread
        self._refs: dict[int, list[int]] = {}  # storage key -> [handles, bytes]
        self._static: set[int] = set()  # parameters and buffers: never counted
        self._step: set[int] = set()  # this step's context storages: never counted
        self.live = 0
        self.peak = 0
        self.label = ""  # what is running (the op), recorded with the peak
        self.peak_at = ""

    def exclude(self, tensors: Iterable[torch.Tensor], *, step: bool = False) -> None:
        """Never count these storages: `step` ones (the layers' context) until
        `new_step`; the others (parameters, buffers) until `set_static`."""
        into = self._step if step else self._static
        for t in tensors:
            found = _storage(t)
            if found is not None:
                into.add(found[0])

    def set_static(self, tensors: Iterable[torch.Tensor]) -> None:
        """The parameters and buffers now: a broadcast that loads parameters gives
        them new storages, and the old ones' addresses may be reused by activations."""
        self._static = set()
        self.exclude(tensors)

    def new_step(self) -> None:
        """The previous step's context is gone: its storages may be reused."""
        self._step = set()

    @contextmanager
    def recording(self):
        """Count what autograd saves inside this block (this thread only)."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
            yield self

    def hold(self, tensor: torch.Tensor) -> Saved:
        """Count `tensor` while the returned handle lives (or until `release`)."""
        return self._pack(tensor)

    def _pack(self, tensor: torch.Tensor) -> Saved:
        # Called for every saved tensor: kept short (a few microseconds a call).
        kept = tensor.detach()
        try:
            # (a DTensor's bytes are its local shard's: tensor parallelism)
            storage = getattr(tensor, "_local_tensor", tensor).untyped_storage()
            key = storage.data_ptr()
        except (RuntimeError, NotImplementedError):  # sparse, meta, ...
            return Saved(None, None, kept)
        if key in self._static or key in self._step:
            return Saved(None, None, kept)
        with self._lock:
            entry = self._refs.get(key)
            if entry is not None:
                entry[0] += 1
                return Saved(self, key, kept)
            nbytes = storage.nbytes()
            if nbytes == 0:
                return Saved(None, None, kept)
            self._refs[key] = [1, nbytes]
            self.live += nbytes
            if self.live > self.peak:
                self.peak, self.peak_at = self.live, self.label
        return Saved(self, key, kept)

    def _release(self, key: int) -> None:
        with self._lock:
            entry = self._refs.get(key)
            if entry is None:
                return
            entry[0] -= 1
            if entry[0] == 0:
                del self._refs[key]
                self.live -= entry[1]


def _unpack(saved: Saved) -> torch.Tensor:
    return saved.tensor


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages of `tensors`."""
    seen: dict[int, int] = {}
    for t in tensors:
        found = _storage(t)
        if found is not None:
            seen[found[0]] = found[1]
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


@dataclass
class RankMemory:
    """One rank's measured memory, in bytes."""

    rank: int
    activation_peak: int  # the most saved-for-backward bytes live at once, over the run
    activation_peak_op: str  # the op running when it was reached
    parameters: int  # of the parts the rank holds
    gradients: int  # at the end of a step, before the optimizer
    optimizer: int  # the optimizer's state after its step
    # The build (`models.materialise.BuildMemory`): {"peak", "growth", "parameters"} bytes; None: not measured.
    build: dict | None = None

    @property
    def static(self) -> int:
        return self.parameters + self.gradients + self.optimizer

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "static": self.static}
