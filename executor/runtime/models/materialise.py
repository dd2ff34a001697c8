"""Each rank builds only its part: a model constructed on the `meta` device,
then only the parameters this rank's chunks (and its encoder replica) hold
made real, each initialised from its own name.

A model that can be built that way says so by taking ``meta=True`` in its
constructor and giving ``init_parameter(name, tensor)``: the value of the
parameter of that name (its name in ``root``), written in place, the same in
every process whatever else it holds.  The built-in model does (its weights
were already seeded per name, `model.init_parameter`); the single-process
reference builds the whole model the ordinary way and gets the same values.
A parameter keeps its Python identity when it is made real
(`torch.utils.swap_tensors`), so every part that shares it (a wrapper module,
a tied weight) sees the real one.

What a build costs is measured as the process's peak resident memory
(`BuildMemory`): the peak once the rank's parts are real, and how far it rose
above what the process held when the build started (the import of torch
before it, and of the optimizer's machinery after it, are not the model's).  With ranks as threads of one process (`--in-process`) they share
that figure.
"""
from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from .protocol import ModelError, PipelineModel, parameter_names


def builds_partially(model: PipelineModel) -> bool:
    """Whether `model` was constructed on the meta device (its parameters await `materialise`)."""
    return any(p.is_meta for p in model.root.parameters())


def materialise(model: PipelineModel, modules: Iterable[nn.Module | None], device: torch.device) -> int:
    """Make real, on `device`, every meta parameter of `modules`, initialised by the
    model's `init_parameter`; returns the bytes made."""
    names = parameter_names(model)
    made, seen = 0, set()
    for module in modules:
        if module is None:
            continue
        for b_name, buf in module.named_buffers():
            if buf.is_meta:
                raise ModelError(f"model '{model.name}': buffer {b_name} is on the meta device; "
                                 "partial builds materialise parameters only")
        for p in module.parameters():
            if id(p) in seen or not p.is_meta:
                continue
            seen.add(id(p))
            real = torch.empty(p.shape, dtype=p.dtype, device="cpu")
            model.init_parameter(names[id(p)], real)
            torch.utils.swap_tensors(p, nn.Parameter(real.to(device), requires_grad=p.requires_grad))
            made += real.numel() * real.element_size()
    return made


def current_rss() -> int | None:
    """This process's resident bytes now (Linux `/proc`), None where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None


def peak_rss() -> int:
    """The most resident bytes this process has held so far (`ru_maxrss`, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class BuildMemory:
    """A rank's build: the process's peak resident bytes after it, how far that peak
    rose above the resident bytes before it, and the parameter bytes it made."""

    peak: int
    growth: int | None
    parameters: int

    @classmethod
    def of(cls, before: int | None, peak: int, parameters: int) -> "BuildMemory":
        """`before`: resident bytes when the build started; `peak`: `peak_rss()` when it ended."""
        return cls(peak, None if before is None else max(0, peak - before), parameters)
