"""A chunk's forward and backward as `recompute(...)` asks (`Pipeline.recompute`:
per chunk, its first `full` layers are fully recomputed, the next `selective`
ones selectively), built on `autograd_split`, so B then W still work.

**Full** (Megatron's `--recompute-granularity full`, its "block" method: the
chunk's first layers): the forward runs those layers without autograd and
keeps only each one's input; the backward rebuilds them just before their
own backward.  A chunk is then a chain of graphs, each an `autograd_split`
segment: the embedding (chunk 0), each fully recomputed layer (rebuilt in the
backward) and the rest (the other layers, the head and the loss):

* a fused BW runs the rest's backward first (freeing it as it goes), then
  rebuilds the recomputed layers one at a time, last first, each freed with
  its input once its backward is done, then the embedding's backward;
* a split B rebuilds every recomputed layer (its W needs their saved inputs)
  and runs each segment's input-gradient part; W runs each segment's
  weight-gradient part, and the graphs go.

**Selective** (Megatron's selective recompute of the attention core): inside
those layers, torch's `scaled_dot_product_attention` keeps only its inputs
(q, k, v, the mask) and runs again in the backward to get its gradient; its
output and softmax statistics are not kept.  The layers are reached through a
thread-local `TorchFunctionMode`, so a model needs no change; a layer that
does not call `scaled_dot_product_attention` (a plug-in with an attention of
its own) keeps everything under selective.  Attention dropout would make the
recompute differ from the forward: it is refused.

The embedding and the head are never recomputed (as in Megatron).  A
recompute runs the forward's own ops on the same inputs, and a fully
recomputed layer reruns under the random state its forward started with (the
CPU's and its device's generators, as `torch.utils.checkpoint` keeps them), so
a dropout draws the same mask and the gradients are the ones without it; the
rerun leaves the global random state as it found it.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import get_device_states, set_device_states

from ..errors import ExecutorError
from .autograd_split import WeightGradState, backward_fused, backward_input, backward_weight
from .models.chunks import trainable_parameters

Hold = Callable[[torch.Tensor], Any]  # counts a tensor while the handle lives (`MemoryMeter.hold`)

# scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
#                              scale=None, enable_gqa=False): its keyword names, after the three tensors.
_SDPA_OPTIONS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class _RecomputedAttention(torch.autograd.Function):
    """scaled_dot_product_attention that saves only its inputs and reruns in the backward."""

    @staticmethod
    def forward(ctx, options: dict, query, key, value, mask):
        ctx.options = options
        ctx.save_for_backward(query, key, value, mask)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, **options)

    @staticmethod
    def backward(ctx, grad):
        query, key, value, mask = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:4]
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(n) for t, n in zip((query, key, value), needs)]
            out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, **ctx.options)
            wanted = [t for t in leaves if t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad)) if wanted else iter(())
        return (None, *[next(grads) if n else None for n in needs], None)


class SelectiveAttention(TorchFunctionMode):
    """Within it, scaled_dot_product_attention under autograd is `_RecomputedAttention`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention or not torch.is_grad_enabled():
            return func(*args, **kwargs)
        query, key, value, *rest = args
        kwargs.update(zip(_SDPA_OPTIONS, rest))
        mask = kwargs.pop("attn_mask", None)
        if isinstance(mask, torch.Tensor) and mask.requires_grad:  # a learned bias: keep it as it is
            return func(query, key, value, attn_mask=mask, **kwargs)
        if kwargs.get("dropout_p", 0.0):
            raise ExecutorError("selective recompute reruns the attention core in the backward, which "
                                f"attention dropout ({kwargs['dropout_p']}) would make differ from the forward")
        return _RecomputedAttention.apply(kwargs, query, key, value, mask)


@dataclass(frozen=True)
class _RngState:
    """The random state a fully recomputed layer's forward started with: the CPU
    generator's and, for an accelerator input, its device's."""

    cpu: torch.Tensor
    device_type: str
    devices: list[int]
    device_states: list[torch.Tensor]

    @classmethod
    def capture(cls, x: torch.Tensor) -> "_RngState":
        devices, states = get_device_states(x)
        return cls(torch.get_rng_state(), x.device.type, devices, states)

    @contextmanager
    def restored(self):
        """Run with this state; the global state is put back afterwards."""
        with torch.random.fork_rng(devices=self.devices, device_type=self.device_type):
            torch.set_rng_state(self.cpu)
            if self.devices:
                set_device_states(self.devices, self.device_states, device_type=self.device_type)
            yield


@dataclass(frozen=True)
class _Step:
    """One layer of a chunk's chain, `run(hidden, context) -> hidden`: an LLM layer,
    or a layer of a folded tower (the tower's last one followed by the embedding)."""

    run: Callable[[torch.Tensor, Any], torch.Tensor]
    modules: tuple[torch.nn.Module, ...]


def chunk_steps(chunk, model, batch) -> list[_Step]:
    """The chunk's layers in chain order: folded tower layers first, then LLM layers
    (what `recompute(...)`'s counts refer to, as in `mpipe_core.simulation.chunks`)."""
    steps = []
    tower = chunk.tower_modules(model)
    for n, layer in enumerate(tower):
        if n == len(tower) - 1 and chunk.embeds:
            def run(h, _context, layer=layer):
                return model.embedding(batch, layer(h))
            steps.append(_Step(run, (layer, model.embedding)))
        else:
            steps.append(_Step(lambda h, _context, layer=layer: layer(h), (layer,)))
    for i in chunk.layers:
        layer = model.layers[i]
        steps.append(_Step(layer, (layer,)))
    return steps


@dataclass
class _Recomputed:
    """A fully recomputed layer: its held input, its parameters, its forward's random state."""

    layer: _Step
    held: Any
    params: list[torch.nn.Parameter]
    rng: _RngState
    grad_in: bool = True  # its input needs a gradient (not the images a folded tower starts from)
    # The autocast its forward ran under (device type, dtype; None: none), as `--precision bf16` sets it.
    autocast: tuple[str, torch.dtype] | None = None

    def rebuild(self, context) -> tuple[torch.Tensor, torch.Tensor]:
        """(leaf, output): the layer run again on its input, under autograd (and the
        forward's autocast, so the rebuilt graph is the forward's)."""
        leaf = self.held.tensor.detach().requires_grad_(self.grad_in)
        cast = torch.autocast(self.autocast[0], dtype=self.autocast[1]) if self.autocast else nullcontext()
        with torch.enable_grad(), self.rng.restored(), cast:
            return leaf, self.layer.run(leaf, context)


def _autocast_of(x: torch.Tensor) -> tuple[str, torch.dtype] | None:
    """The autocast in force for `x`'s device now (None: none)."""
    kind = x.device.type
    return (kind, torch.get_autocast_dtype(kind)) if torch.is_autocast_enabled(kind) else None


@dataclass
class _Segment:
    """One graph of a chunk: its output(s), the inputs whose gradient it gives, its parameters."""

    outputs: list[torch.Tensor]
    inputs: list[torch.Tensor]
    params: list[torch.nn.Parameter]


@dataclass
class ChunkGraph:
    """What a chunk's forward keeps until its backward."""

    rest: _Segment | None  # the layers after the recomputed ones, the head, the loss (None: nothing)
    recomputed: list[_Recomputed] = field(default_factory=list)
    embedding: _Segment | None = None  # chunk 0 when layers right after it are recomputed
    context: Any = None
    output: torch.Tensor | None = None  # what the chunk hands on (the loss on the last chunk)
    weight_states: list[WeightGradState] = field(default_factory=list)  # B's leftovers for W
    holds: list = field(default_factory=list)  # inputs kept for W's rebuilt graphs
    # (shape, dtype, device) of each chunk input: a gradient autograd leaves None is sent as zeros of it.
    input_shapes: list = field(default_factory=list)

    def backward_fused(self, grad: torch.Tensor) -> list[torch.Tensor | None]:
        """BW: the chunk inputs' gradients (features on chunk 0, else the hidden state)."""
        if not self.recomputed:
            return backward_fused(self.rest.outputs, [grad], self.rest.inputs, self.rest.params)
        if self.rest is not None:
            (grad,) = backward_fused(self.rest.outputs, [grad], self.rest.inputs, self.rest.params)
        while self.recomputed:
            layer = self.recomputed.pop()
            leaf, out = layer.rebuild(self.context)
            (grad,) = backward_fused([out], [grad], [leaf], layer.params)
            layer.held.release()
            del layer, out, leaf
        if self.embedding is not None:
            return backward_fused(self.embedding.outputs, [grad], self.embedding.inputs, self.embedding.params)
        return [grad]

    def backward_input(self, grad: torch.Tensor) -> list[torch.Tensor | None]:
        """B: the chunk inputs' gradients; what W needs stays in `weight_states`
        (the graphs' outputs go, so what only B needed is freed now)."""
        gin = self._backward_input(grad)
        self.rest = self.embedding = self.output = None
        return gin

    def _backward_input(self, grad: torch.Tensor) -> list[torch.Tensor | None]:
        if not self.recomputed:
            gin, state = backward_input(self.rest.outputs, [grad], self.rest.inputs, self.rest.params)
            self.weight_states.append(state)
            return gin
        if self.rest is not None:
            (grad,), state = backward_input(self.rest.outputs, [grad], self.rest.inputs, self.rest.params)
            self.weight_states.append(state)
        while self.recomputed:
            layer = self.recomputed.pop()
            leaf, out = layer.rebuild(self.context)
            (grad,), state = backward_input([out], [grad], [leaf], layer.params)
            self.weight_states.append(state)
            self.holds.append(layer.held)
        if self.embedding is not None:
            gin, state = backward_input(self.embedding.outputs, [grad], self.embedding.inputs,
                                        self.embedding.params)
            self.weight_states.append(state)
            return gin
        return [grad]

    def backward_weight(self) -> None:
        """W: every segment's weight gradients; the graphs and kept inputs go."""
        for state in self.weight_states:
            backward_weight(state)
        self.weight_states.clear()
        for held in self.holds:
            held.release()
        self.holds.clear()


def chunk_forward(chunk, model, x: torch.Tensor | None, features: list[torch.Tensor], batch, context,
                  normalizer: int, full: int = 0, selective: int = 0, hold: Hold | None = None) -> ChunkGraph:
    """Run `chunk` (a `models.chunks.ModelChunk`) forward: its first `full` layers
    fully recomputed, the next `selective` ones selectively.  `x` is the hidden
    state in (None on chunk 0, which embeds the batch with `features`, the
    list of feature tensors that need gradients or not; with a folded tower,
    chunk 0 starts the tower on the batch's images instead)."""
    steps = chunk_steps(chunk, model, batch)
    if full + selective > len(steps):
        raise ExecutorError(f"chunk {chunk.index} holds {len(steps)} layers but {full} full and "
                            f"{selective} selective recomputes were asked for")
    hold = hold or (lambda t: _Plain(t.detach()))
    folded = bool(chunk.tower)
    if folded:  # the tower's start: the images (no gradient), or its hidden state received
        inputs = [x] if chunk.tower_input else []
        h = x if chunk.tower_input else batch.images
    else:
        inputs = list(features) if chunk.first else [x]
        if chunk.first:
            joined = torch.cat(features) if len(features) > 1 else (features[0] if features else None)
            h = model.embedding(batch, joined)
        else:
            h = x
    graph = ChunkGraph(rest=None, context=context,
                       input_shapes=[(t.shape, t.dtype, t.device) for t in inputs if t is not None])
    if full:
        if chunk.first and not folded:
            graph.embedding = _Segment([h], inputs, trainable_parameters([model.embedding]))
        # The chunk's input needs a gradient unless it is a folded tower's images or a frozen
        # tower's hidden state (then no gradient goes back: an empty message).
        grad_in = not folded or (chunk.tower_input and x.requires_grad)
        with torch.no_grad():
            for n, step in enumerate(steps[:full]):
                graph.recomputed.append(_Recomputed(step, hold(h), trainable_parameters(step.modules),
                                                    _RngState.capture(h), grad_in or n > 0, _autocast_of(h)))
                h = step.run(h, context)
        h = h.detach().requires_grad_(True)
        rest_inputs = [h]
    else:
        rest_inputs = inputs
    start = h
    for n, step in enumerate(steps[full:]):
        with SelectiveAttention() if n < selective else nullcontext():
            h = step.run(h, context)
    if chunk.last:
        h = model.loss(model.head(h), batch, normalizer)
    graph.output = h
    if h is not start:  # something after the recomputed layers built a graph
        modules = ([model.embedding] if chunk.first and not folded and not full else []) \
            + [m for step in steps[full:] for m in step.modules] + ([model.head] if chunk.last else [])
        graph.rest = _Segment([h], rest_inputs, trainable_parameters(modules))
    return graph


class _Plain:
    """A kept input when nothing counts memory."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def release(self) -> None:
        pass
