"""`mpipe profile`: measure a model's per-layer costs and bytes, write a workload.

Each part is timed exactly as the executor runs it: F is the part's forward
with autograd recording; B is `autograd_split.backward_input` (the input
gradient) and W `backward_weight` (the weight gradient) on that graph.  The
encoder has no input gradient, so its B is empty and W is its whole backward,
as in the runtime.  Every measurement is warm-up runs then the median of
``repeats`` runs; CUDA/NPU work is synchronised before the clock is read.

Bytes: the hidden state between chunks (``boundary_bytes``), one image's
features (``output_bytes``) and input (``input_bytes``), the encoder's
parameters (``param_bytes``); activations are the bytes autograd saves during
F (per layer per microbatch, per image for the encoder).

Times are in seconds, so the workload predicts a run's wall time; the link is
left free (latency 0, infinite bandwidth) unless given.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from ..autograd_split import backward_input, backward_weight
from mpipe_core.model_spec import ModelSpec
from .protocol import PipelineModel, encoder_trainable, step_normalizer

Progress = Callable[[str, int, int], None]  # (part, index, total)


class _Timer:
    def __init__(self, device: torch.device):
        self.sync = {"cuda": getattr(torch, "cuda", None), "npu": getattr(torch, "npu", None)}.get(device.type)

    def now(self) -> float:
        if self.sync is not None:
            self.sync.synchronize()
        return time.perf_counter()


def _saved_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run `fn`, counting the bytes autograd saves for backward (distinct storages)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        try:
            key = t.untyped_storage().data_ptr()
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except RuntimeError:  # a tensor without storage
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def _measure(timer: _Timer, forward: Callable[[], tuple[list, list, list]], params: list,
             warmup: int, repeats: int) -> tuple[float, float, float]:
    """Median F, B, W seconds.  `forward` returns (outputs, grad_outputs, inputs)."""
    times: list[tuple[float, float, float]] = []
    for i in range(warmup + repeats):
        t0 = timer.now()
        outs, grads, ins = forward()
        t1 = timer.now()
        _, state = backward_input(outs, grads, ins, params)
        t2 = timer.now()
        backward_weight(state)
        t3 = timer.now()
        if i >= warmup:
            times.append((t1 - t0, t2 - t1, t3 - t2))
    for p in params:
        p.grad = None
    return tuple(statistics.median(t[k] for t in times) for k in range(3))  # type: ignore[return-value]


def _params(module) -> list:
    return [p for p in module.parameters() if p.requires_grad]


def profile_model(model: PipelineModel, spec: ModelSpec, *, device: str = "cpu", warmup: int = 3,
                  repeats: int = 10, progress: Progress | None = None) -> dict[str, Any]:
    """The explicit workload of `model` measured on `device` (a `mpipe_core` workload document)."""
    dev = torch.device(device)
    model.root.to(dev)
    timer = _Timer(dev)
    say = progress or (lambda part, i, n: None)
    batch = model.make_batch(0, 0, 1).to(dev)
    normalizer = max(1, step_normalizer(model, 0, 1))
    trainable = encoder_trainable(model)
    layers = model.layers
    total = len(layers) + 2 + (model.encoder is not None)
    done = 0

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

        if trainable:
            f, b, w = _measure(timer, enc_forward, enc_params, warmup, repeats)
        else:
            with torch.no_grad():
                f = _forward_only(timer, lambda: model.encoder(images), warmup, repeats)
            b = w = 0.0
        with torch.set_grad_enabled(trainable):
            features, act = _saved_bytes(lambda: model.encoder(images))
        features = features.detach()
        per = max(1, n_img)
        encoder_doc = {
            "name": "vision", "f": f / per, "b": b / per, "w": w / per, "trainable": trainable,
            "output_bytes": features[0].numel() * features.element_size() if n_img else 0.0,
            "input_bytes": images[0].numel() * images.element_size() if n_img else 0.0,
            "param_bytes": float(sum(p.numel() * p.element_size() for p in model.encoder.parameters())),
            "activation": act / per,
            "images": {"min": n_img, "max": n_img, "seed": 0},
        }
        done += 1

    say("embedding", done, total)
    feats_in = None if features is None else features.clone().requires_grad_(trainable)

    def emb_forward():
        x = model.embedding(batch, feats_in)
        return [x], [torch.ones_like(x)], [feats_in] if feats_in is not None else []

    embed = _measure(timer, emb_forward, _params(model.embedding), warmup, repeats)
    with torch.no_grad():
        hidden = model.embedding(batch, features)
        ctx = model.context(batch)
    done += 1

    per_layer = {"F": [], "B": [], "W": []}
    activation = []
    for i, layer in enumerate(layers):
        say(f"layer {i}", done, total)
        x_in = hidden.detach().requires_grad_(True)

        def layer_forward(layer=layer, x_in=x_in):
            out = layer(x_in, ctx)
            return [out], [torch.ones_like(out)], [x_in]

        for kind, value in zip("FBW", _measure(timer, layer_forward, _params(layer), warmup, repeats)):
            per_layer[kind].append(value)
        out, act = _saved_bytes(lambda: layer(x_in, ctx))
        activation.append(act)
        hidden = out.detach()
        done += 1

    say("head", done, total)
    x_last = hidden.detach().requires_grad_(True)

    def head_forward():
        loss = model.loss(model.head(x_last), batch, normalizer)
        return [loss], [torch.ones_like(loss)], [x_last]

    head = _measure(timer, head_forward, _params(model.head), warmup, repeats)
    done += 1
    say("done", done, total)
    boundary = hidden[0].numel() * hidden.element_size() * hidden.shape[0]
    return {
        "name": f"profile:{spec}",
        "description": f"measured by mpipe profile on {device}",
        "origin": {"model": spec.to_dict(), "device": device, "warmup": warmup, "repeats": repeats,
                   "unit": "seconds", "torch": torch.__version__},
        "llm": {
            "layers": len(layers),
            "f": statistics.mean(per_layer["F"]), "b": statistics.mean(per_layer["B"]),
            "w": statistics.mean(per_layer["W"]),
            "layer_costs": per_layer,
            "embed": dict(zip("FBW", embed)),
            "head": dict(zip("FBW", head)),
            "activation": statistics.mean(activation),
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
