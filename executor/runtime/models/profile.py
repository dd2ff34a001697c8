"""`mpipe profile`: measure a model's per-layer costs and bytes, write a workload.

Each part is timed exactly as the executor runs it: F is the part's forward
with autograd recording (under the memory meter's saved-tensor hooks, as on
a rank); B is `autograd_split.backward_input` (the input gradient) and W
`backward_weight` (the weight gradient) on that graph.  The
encoder has no input gradient, so its B is empty and W is its whole backward,
as in the runtime.  Every measurement is warm-up runs then the median of
``repeats`` runs; CUDA/NPU work is synchronised before the clock is read.

Bytes: the hidden state between chunks (``boundary_bytes``), one image's
features (``output_bytes``) and input (``input_bytes``), the encoder's
parameters (``param_bytes``).  Memory, in bytes (``units.memory``), counted
as the runtime counts it on a rank (`memory_meter`: the storages autograd
saves for backward, each once, never parameters, buffers or the layers'
context): per microbatch what each layer keeps (``activation``; under
``recompute.selective``, the attention core recomputed, and under
``recompute.full``, its input only, as `recompute` runs them; the time a
selective recompute adds is the attention core's forward), what the
embedding and the head with the loss keep (``embed.activation``,
``head.activation``) and the encoder per image; static bytes (``static``):
each part's parameters, their gradients and the optimizer's state after a
step of ``optimizer`` (the executor's SGD by default), an encoder's
forward-only replica its parameters only (``replica_static``); the encoder's
trained gradient (``grad_bytes``).

Times are in seconds, so the workload predicts a run's wall time; the link is
left free (latency 0, infinite bandwidth) unless given.
"""
from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from mpipe_core.runs.model_spec import ModelSpec

from ..autograd_split import backward_input, backward_weight
from ..memory_meter import MemoryMeter, optimizer_state_tensors, storage_bytes, tensors_in
from ..recompute import SelectiveAttention
from ..runtime import OptimizerSpec
from .protocol import PipelineModel, encoder_trainable, step_normalizer

Progress = Callable[[str, int, int], None]  # (part, index, total)


class _Timer:
    def __init__(self, device: torch.device):
        self.sync = {"cuda": getattr(torch, "cuda", None), "npu": getattr(torch, "npu", None)}.get(device.type)

    def now(self) -> float:
        if self.sync is not None:
            self.sync.synchronize()
        return time.perf_counter()


class _AttentionTime(TorchFunctionMode):
    """Adds up the time of scaled_dot_product_attention calls (the attention core)."""

    def __init__(self, timer: _Timer):
        super().__init__()
        self.timer, self.seconds = timer, 0.0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not F.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        t0 = self.timer.now()
        out = func(*args, **(kwargs or {}))
        self.seconds += self.timer.now() - t0
        return out


class _Memory:
    """Saved-for-backward bytes of one call, counted as a rank counts them."""

    def __init__(self, model: PipelineModel, context: Any):
        self.static = list(model.root.parameters()) + list(model.root.buffers()) + list(tensors_in(context))

    def meter(self) -> MemoryMeter:
        meter = MemoryMeter()
        meter.exclude(self.static)
        return meter

    def recording(self):
        """A fresh meter counting what is saved inside the block (as a rank's does)."""
        return self.meter().recording()

    def saved(self, fn: Callable[[], Any]) -> tuple[Any, int]:
        """`fn()` and the bytes it left saved for backward (while its result lives)."""
        meter = self.meter()
        with meter.recording():
            out = fn()
        return out, meter.live


def _static_bytes(params: list[torch.nn.Parameter], trained: list[torch.nn.Parameter],
                  optimizer: OptimizerSpec) -> tuple[float, float]:
    """(a trained copy, its parameters only): `params`, plus for those of them the
    backward gave a gradient (`trained`) the gradients and the optimizer's state
    after one step (on copies: the model is left as it is)."""
    held = storage_bytes(params)
    ids = {id(p) for p in trained}
    trainable = [p for p in params if id(p) in ids]
    if not trainable:
        return float(held), float(held)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in trainable]
    for c in copies:
        c.grad = torch.zeros_like(c)
    opt = optimizer.build(copies)
    opt.step()
    trained = held + storage_bytes(c.grad for c in copies) + storage_bytes(optimizer_state_tensors(opt))
    return float(trained), float(held)


def _static_split(layers, model, trained: dict, keep: Callable[[Any], bool] = lambda p: True
                  ) -> dict[str, dict[str, float]]:
    """llm.param_bytes and llm.grad_bytes: each part's parameters (those `keep` keeps) and the
    gradients its backward gave (per layer: the layers' mean, as `static`'s)."""
    def split(params, got) -> tuple[float, float]:
        ids = {id(p) for p in got}
        params = [p for p in params if keep(p)]
        return (float(storage_bytes(params)),
                float(storage_bytes(p for p in params if id(p) in ids and p.requires_grad)))

    per_layer = [split(list(layer.parameters()), trained[i]) for i, layer in enumerate(layers)]
    embed = split(list(model.embedding.parameters()), trained["embed"])
    head = split(list(model.head.parameters()), trained["head"])
    return {key: {"layer": statistics.mean(pl[k] for pl in per_layer), "embed": embed[k], "head": head[k]}
            for k, key in enumerate(("param_bytes", "grad_bytes"))}


def _tp_sharded_ids(model) -> set[int] | None:
    """The parameters the model's tensor-parallel plan shards (None: it has no plan)."""
    from ...parallel.tensor_parallel import model_plan, sharded_parameters

    plan = model_plan(model, sequence_parallel=False)  # sp changes layouts, not which weights shard
    return None if plan is None else sharded_parameters(model, plan)


def _tp_share(layers, model, trained: dict, optimizer: OptimizerSpec, sharded: set[int]) -> dict:
    """llm.tp_sharded: the part of each part's static bytes, parameters and gradient that the
    tp plan shards (a tp rank keeps 1/tp of it and the rest whole: `layout_memory`)."""
    def only(module) -> list:
        return [p for p in module.parameters() if id(p) in sharded]

    statics = {"layer": statistics.mean(_static_bytes(only(layer), trained[i], optimizer)[0]
                                        for i, layer in enumerate(layers)),
               "embed": _static_bytes(only(model.embedding), trained["embed"], optimizer)[0],
               "head": _static_bytes(only(model.head), trained["head"], optimizer)[0]}
    return {"static": statics, **_static_split(layers, model, trained, keep=lambda p: id(p) in sharded)}


def _measure(timer: _Timer, forward: Callable[[], tuple[list, list, list]], params: list,
             warmup: int, repeats: int, trained: list | None = None,
             record: Callable[[], Any] = nullcontext) -> tuple[float, float, float]:
    """Median F, B, W seconds.  `forward` returns (outputs, grad_outputs, inputs);
    `trained` gets the parameters the backward gave a gradient; `record` is the
    memory meter the runtime runs every op under (its hooks cost time too)."""
    times: list[tuple[float, float, float]] = []
    for i in range(warmup + repeats):
        with record():
            t0 = timer.now()
            outs, grads, ins = forward()
            t1 = timer.now()
            _, state = backward_input(outs, grads, ins, params)
            t2 = timer.now()
            backward_weight(state)
            t3 = timer.now()
            del outs, grads, ins, state
        if i >= warmup:
            times.append((t1 - t0, t2 - t1, t3 - t2))
    if trained is not None:
        trained.extend(p for p in params if p.grad is not None)
    for p in params:
        p.grad = None
    return tuple(statistics.median(t[k] for t in times) for k in range(3))  # type: ignore[return-value]


def _attention_seconds(timer: _Timer, fn: Callable[[], Any], warmup: int, repeats: int) -> float:
    """Median time of the attention core inside `fn` (what a selective recompute reruns)."""
    times = []
    for i in range(warmup + repeats):
        mode = _AttentionTime(timer)
        with torch.no_grad(), mode:
            fn()
        if i >= warmup:
            times.append(mode.seconds)
    return statistics.median(times)


def _params(module) -> list:
    return [p for p in module.parameters() if p.requires_grad]


def profile_model(model: PipelineModel, spec: ModelSpec, *, device: str = "cpu", warmup: int = 3,
                  repeats: int = 10, progress: Progress | None = None, optimizer: str = "sgd") -> dict[str, Any]:
    """The explicit workload of `model` measured on `device` (a `mpipe_core` workload document);
    static bytes count the state of `optimizer` (sgd or adamw, as `mpipe run --optimizer`)."""
    dev = torch.device(device)
    model.root.to(dev)
    timer = _Timer(dev)
    opt = OptimizerSpec(name=optimizer)
    say = progress or (lambda part, i, n: None)
    batch = model.make_batch(0, 0, 1).to(dev)
    normalizer = max(1, step_normalizer(model, 0, 1))
    trainable = encoder_trainable(model)
    layers = model.layers
    total = len(layers) + 2 + (model.encoder is not None)
    done = 0
    with torch.no_grad():
        ctx = model.context(batch)
    memory = _Memory(model, ctx)
    tp_sharded = _tp_sharded_ids(model)

    features = None
    encoder_doc = None
    if model.encoder is not None:
        say("encoder", done, total)
        images = batch.images
        n_img = images.shape[0]
        enc_params = _params(model.encoder)

        def enc_forward():
            feats = model.encoder(images)
            return [feats], [torch.ones_like(feats)], []

        enc_trained: list = []
        if trainable:
            f, b, w = _measure(timer, enc_forward, enc_params, warmup, repeats, enc_trained, memory.recording)
        else:
            with torch.no_grad():
                f = _forward_only(timer, lambda: model.encoder(images), warmup, repeats)
            b = w = 0.0
        with torch.set_grad_enabled(trainable):
            features, act = memory.saved(lambda: model.encoder(images))
        features = features.detach()
        per = max(1, n_img)
        static, replica = _static_bytes(list(model.encoder.parameters()), enc_trained, opt)
        encoder_doc = {
            "name": "vision", "f": f / per, "b": b / per, "w": w / per, "trainable": trainable,
            "output_bytes": features[0].numel() * features.element_size() if n_img else 0.0,
            "input_bytes": images[0].numel() * images.element_size() if n_img else 0.0,
            "param_bytes": float(sum(p.numel() * p.element_size() for p in model.encoder.parameters())),
            "activation": act / per,
            "images": {"min": n_img, "max": n_img, "seed": 0},
            "static": static, "replica_static": replica,
            # The trained gradient (fp32 as the executor keeps it): what a replica all-reduces,
            # and what splits `static` into parameters, gradient and optimizer state.
            "grad_bytes": float(sum(p.numel() * p.element_size() for p in {id(q): q for q in enc_trained}.values())),
        }
        if tp_sharded is not None:
            # What the plan shards of the tower (nothing: a plan without an `encoder` part).
            mine = [p for p in model.encoder.parameters() if id(p) in tp_sharded]
            t_static, t_replica = _static_bytes(mine, enc_trained, opt)
            trained_ids = {id(q) for q in enc_trained}
            encoder_doc["tp_sharded"] = {
                "static": t_static, "replica_static": t_replica,
                "param_bytes": float(storage_bytes(mine)),
                "grad_bytes": float(storage_bytes(p for p in mine if id(p) in trained_ids))}
        done += 1

    say("embedding", done, total)
    feats_in = None if features is None else features.clone().requires_grad_(trainable)

    def emb_forward():
        x = model.embedding(batch, feats_in)
        return [x], [torch.ones_like(x)], [feats_in] if feats_in is not None else []

    trained: dict[str, list] = {"embed": [], "head": []}
    embed = _measure(timer, emb_forward, _params(model.embedding), warmup, repeats, trained["embed"],
                     memory.recording)
    _, embed_act = memory.saved(lambda: model.embedding(batch, feats_in))
    with torch.no_grad():
        hidden = model.embedding(batch, features)
    done += 1

    per_layer = {"F": [], "B": [], "W": []}
    kept: dict[str, list[float]] = {"none": [], "selective": [], "full": []}
    attention = []
    for i, layer in enumerate(layers):
        say(f"layer {i}", done, total)
        x_in = hidden.detach().requires_grad_(True)

        def layer_forward(layer=layer, x_in=x_in):
            out = layer(x_in, ctx)
            return [out], [torch.ones_like(out)], [x_in]

        trained[i] = []
        for kind, value in zip("FBW", _measure(timer, layer_forward, _params(layer), warmup, repeats, trained[i],
                                               memory.recording)):
            per_layer[kind].append(value)
        out, act = memory.saved(lambda: layer(x_in, ctx))
        kept["none"].append(act)
        with SelectiveAttention():
            kept["selective"].append(memory.saved(lambda: layer(x_in, ctx))[1])
        meter = memory.meter()
        held = meter.hold(x_in)  # what a full recompute keeps: the layer's input
        kept["full"].append(meter.live)
        del held
        attention.append(_attention_seconds(timer, lambda: layer(x_in, ctx), warmup, repeats))
        hidden = out.detach()
        del out
        done += 1

    say("head", done, total)
    x_last = hidden.detach().requires_grad_(True)

    def head_forward():
        loss = model.loss(model.head(x_last), batch, normalizer)
        return [loss], [torch.ones_like(loss)], [x_last]

    head = _measure(timer, head_forward, _params(model.head), warmup, repeats, trained["head"],
                    memory.recording)
    _, head_act = memory.saved(lambda: model.loss(model.head(x_last), batch, normalizer))
    done += 1
    say("done", done, total)
    boundary = hidden[0].numel() * hidden.element_size() * hidden.shape[0]
    layer_static = statistics.mean(_static_bytes(list(layer.parameters()), trained[i], opt)[0]
                                   for i, layer in enumerate(layers))
    return {
        "name": f"profile:{spec}",
        "description": f"measured by mpipe profile on {device}",
        "origin": {"model": spec.to_dict(), "device": device, "warmup": warmup, "repeats": repeats,
                   "unit": "seconds", "torch": torch.__version__, "optimizer": optimizer},
        "units": {"time": "s", "memory": "bytes"},
        "llm": {
            "layers": len(layers),
            "f": statistics.mean(per_layer["F"]), "b": statistics.mean(per_layer["B"]),
            "w": statistics.mean(per_layer["W"]),
            "layer_costs": per_layer,
            "embed": {**dict(zip("FBW", embed)), "activation": float(embed_act)},
            "head": {**dict(zip("FBW", head)), "activation": float(head_act)},
            "activation": statistics.mean(kept["none"]),
            "recompute": {
                "selective": {"activation": statistics.mean(kept["selective"]), "f": statistics.mean(attention)},
                "full": {"activation": statistics.mean(kept["full"])},
            },
            "static": {"layer": layer_static,
                       "embed": _static_bytes(list(model.embedding.parameters()), trained["embed"], opt)[0],
                       "head": _static_bytes(list(model.head.parameters()), trained["head"], opt)[0]},
            # `static` split: parameters and gradients (the rest is optimizer state), what a run's
            # ZeRO-1 shards (`executor.analysis.layout_memory`).
            **_static_split(layers, model, trained),
            # What the model's tensor-parallel plan shards of them (`layout_memory.tp_profile`).
            **({"tp_sharded": _tp_share(layers, model, trained, opt, tp_sharded)} if tp_sharded is not None else {}),
            "boundary_bytes": float(boundary),
        },
        "encoders": [encoder_doc] if encoder_doc is not None else [],
        "link": {"latency": 0.0, "bandwidth": None},
    }


def _forward_only(timer: _Timer, fn: Callable[[], Any], warmup: int, repeats: int) -> float:
    times = []
    for i in range(warmup + repeats):
        t0 = timer.now()
        fn()
        if i >= warmup:
            times.append(timer.now() - t0)
    return statistics.median(times)
