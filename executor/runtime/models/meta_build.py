"""Building a model whose constructor draws its own weights (HF models, plug-ins)
on the `meta` device, and replaying that constructor's initialisation one
parameter at a time.

`meta_parameters()` runs a constructor with every parameter placed on the meta
device as it is registered (no storage), while buffers (rotary tables,
position ids: small, computed from the config, not drawn) stay real; so the
constructor's own code runs unchanged and a rank then makes real only what it
holds (`materialise`).

`replay_init(root, name, tensor, seed, init_for)` gives one parameter the value
the model's own per-module initialisers give it, independently of every other
parameter: the modules from the parameter's owner up to the root each run
their initialiser (the owner's first, then its parents', which may overwrite
it: HF's `_init_weights` on a CLIP attention block writes its projections'
weights), with only that parameter real (the others of the subtree stand in on
the meta device, where an initialiser's write is a no-op) and torch's generator
seeded from (seed, parameter name, module).  The value depends on the name
alone, so a rank that makes three layers real and the reference that makes the
whole model real get the same tensors.  Its distribution is the initialiser's;
its draws are not the ones a whole eager construction would have made.
"""
from __future__ import annotations

import threading
import zlib
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

from .protocol import ModelError

# Factories seed torch's global generator and then draw the weights; ranks run as
# threads of one process (`run_local`) must not interleave those draws, nor let
# another model's construction (torch's default initialisers draw from the same
# generator: the built-in model's too, before it overwrites them) draw in between.
# Re-entrant: a build holding it replays initialisers (`replay_init`), which take it too.
BUILD_LOCK = threading.RLock()

# The initialiser that module `ancestors[-1]` runs, given its ancestors from the root
# (HF: the `_init_weights` of its nearest `PreTrainedModel`); None: it has none.
InitFor = Callable[[list[nn.Module]], Callable[[nn.Module], None] | None]


@contextmanager
def meta_parameters() -> Iterator[None]:
    """Within: every parameter a module registers lands on the meta device (buffers stay
    real).  Process-wide (it patches `nn.Module.register_parameter`), so it holds the
    build lock: ranks run as threads build one at a time."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    with BUILD_LOCK:
        nn.Module.register_parameter = register
        try:
            yield
        finally:
            nn.Module.register_parameter = original


def replay_init(root: nn.Module, name: str, tensor: torch.Tensor, seed: int, init_for: InitFor) -> None:
    """Write into `tensor` the value parameter `name` of `root` (on the meta device) gets
    from its modules' own initialisers (see the module's docstring)."""
    target = root.get_parameter(name)
    path = name.split(".")[:-1]
    chain = [root]
    for part in path:
        chain.append(getattr(chain[-1], part))
    tensor.fill_(float("nan"))  # (so a parameter no initialiser writes is seen, not trained on garbage)
    # The global generator: initialisers draw from it, so ranks as threads must not interleave
    # (seeded directly: `torch.manual_seed` is slow, it seeds every device and logs its caller).
    generator = torch.default_generator
    with BUILD_LOCK, torch.no_grad():
        state = generator.get_state()
        try:
            for depth in range(len(chain), 0, -1):  # the owner first, then each parent (which may overwrite)
                init = init_for(chain[:depth])
                if init is None:
                    continue
                module = chain[depth - 1]
                with _alone(module, target, tensor):
                    generator.manual_seed(zlib.crc32(f"{seed}:{name}:{'.'.join(path[:depth - 1])}".encode()))
                    init(module)
        finally:
            generator.set_state(state)
    if tensor.is_floating_point() and torch.isnan(tensor).any():
        raise ModelError(f"parameter {name}: none of its modules' initialisers writes it (give its module "
                         "a reset_parameters(), or the model an init_parameter that sets it)")


def module_reset(ancestors: list[nn.Module]) -> Callable[[nn.Module], None] | None:
    """The `InitFor` of plain torch modules: a module's own `reset_parameters()` (torch's
    standard layers have one; `nn.MultiheadAttention` its `_reset_parameters`)."""
    module = ancestors[-1]
    reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
    return None if reset is None else (lambda m: reset())


@contextmanager
def _alone(module: nn.Module, target: nn.Parameter, tensor: torch.Tensor) -> Iterator[None]:
    """Within: `target` is `tensor` (writes land in it) and every other real parameter of
    `module`'s subtree a meta stand-in (so an initialiser leaves it alone)."""
    saved: list[tuple[nn.Module, str, nn.Parameter]] = []
    stand_in = nn.Parameter(tensor, requires_grad=False)
    for sub in module.modules():
        for key, p in list(sub._parameters.items()):
            if p is None or (p.is_meta and p is not target):
                continue
            saved.append((sub, key, p))
            sub._parameters[key] = stand_in if p is target else \
                nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
    try:
        yield
    finally:
        for sub, key, p in saved:
            sub._parameters[key] = p
