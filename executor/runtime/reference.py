"""The single-process reference run and the gradient comparison.

The reference trains the whole model in one process on the same data: per
microbatch, forward and `backward()` of its `reference_loss` (summed token
loss over the step's token count; for the HF adapters the HF model's own
forward, for a plug-in its parts chained), gradients accumulating in `.grad`,
then the same optimizer step.  A pipelined run must reproduce its loss and every
parameter's gradient.

Tolerance (float32): for every element, |g - g_ref| <= RTOL * |g_ref| +
ATOL_SCALE * max|g_ref| over that tensor, with RTOL = 1e-5 and ATOL_SCALE =
1e-6 (the absolute slack scales with the tensor, so near-zero entries of a
tensor are not judged by relative error); the loss must agree within RTOL.
Differences come only from summation order (gradient accumulation order of
the schedule, all-reduce order, encoder images batched in shards).

A tensor whose gradient is zero in exact arithmetic (an attention key bias:
softmax ignores a shift shared by all keys) holds only rounding noise, so its
own maximum is no scale to judge it by: a tensor whose reference maximum is
below ATOL_SCALE times the step's largest gradient element is judged with
that step-wide slack instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .models.protocol import PipelineModel, step_normalizer
from .precision import compute_context

RTOL = 1e-5
ATOL_SCALE = 1e-6


@dataclass
class ReferenceStep:
    loss: float
    grads: dict[str, torch.Tensor]


def reference_run(model: PipelineModel, microbatches: int, steps: int, optimizer,
                  step_batches: Callable[[PipelineModel, int], list] | None = None,
                  precision: str = "fp32") -> tuple[list[ReferenceStep], dict]:
    """Steps of the whole (freshly built) model; returns per-step loss and
    gradients, and the final parameters.  `step_batches(model, step)`: that
    step's batches in draw order (a data run's: each step its own drawn
    batch); default the model's seeded `make_batch`.  `precision`: the forward
    under the run's autocast (`precision.compute_context`), the backward after it."""
    root = model.root
    params = [p for p in root.parameters() if p.requires_grad]
    opt = optimizer.build(params)
    out = []
    for step in range(steps):
        if step_batches is None:
            batches = [model.make_batch(step, m, microbatches) for m in range(microbatches)]
            normalizer = step_normalizer(model, step, microbatches)
        else:
            batches = step_batches(model, step)
            normalizer = sum(model.target_count(b) for b in batches)
        total = torch.zeros(())
        for batch in batches:
            with compute_context(precision, "cpu"):
                loss = model.reference_loss(batch, normalizer)
            loss.backward()
            total += loss.detach()
        grads = {n: p.grad.detach().clone() for n, p in root.named_parameters() if p.grad is not None}
        out.append(ReferenceStep(float(total), grads))
        opt.step()
        opt.zero_grad(set_to_none=True)
    final = {n: p.detach().clone() for n, p in root.named_parameters() if p.requires_grad}
    return out, final


def _scale(ref: torch.Tensor, floor: float) -> float:
    """What a tensor's absolute slack scales with: its own largest element, or the
    step's (`floor`) when its own is below ATOL_SCALE of that."""
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    return floor if scale < ATOL_SCALE * floor else scale


def compare_tensors(got: torch.Tensor, ref: torch.Tensor, floor: float = 0.0,
                    tolerance: tuple[float, float] = (RTOL, ATOL_SCALE)) -> tuple[float, float, bool]:
    """(max abs error, max error / max|ref|, within tolerance); `floor` is the
    step's largest gradient element (see the module's note on zero gradients);
    `tolerance` (rtol, atol scale): `precision.BF16_TOLERANCE` under bf16."""
    rtol, atol_scale = tolerance
    got, ref = got.double(), ref.double()
    diff = (got - ref).abs()
    scale = _scale(ref, floor)
    max_abs = float(diff.max()) if diff.numel() else 0.0
    ok = bool((diff <= rtol * ref.abs() + atol_scale * scale).all()) if diff.numel() else True
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return max_abs, rel, ok


def worst_element(got: torch.Tensor, ref: torch.Tensor,
                  tolerance: tuple[float, float] = (RTOL, ATOL_SCALE)) -> tuple[tuple[int, ...], float, float]:
    """Where `got` is furthest past the tolerance: (index, got value, reference value).
    The slack's constant part (whatever scale it has) does not change which element."""
    got64, ref64 = got.double(), ref.double()
    scale = float(ref64.abs().max()) if ref64.numel() else 0.0
    excess = (got64 - ref64).abs() - (tolerance[0] * ref64.abs() + tolerance[1] * scale)
    flat = int(torch.argmax(excess.reshape(-1)))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(ref64.shape)))
    return index, float(got64.reshape(-1)[flat]), float(ref64.reshape(-1)[flat])


def check_step(rank_grads: list[dict[str, torch.Tensor]], ref: ReferenceStep, loss: float,
               tolerance: tuple[float, float] = (RTOL, ATOL_SCALE)) -> dict:
    """Compare every gradient copy the ranks hold with the reference.

    Each reference parameter must have a gradient on at least one rank; a
    parameter held on several ranks (an encoder replica) is checked on each
    rank that has a gradient for it.
    """
    per_param: dict[str, dict] = {}
    failures = []
    floor = max((float(g.abs().max()) for g in ref.grads.values() if g.numel()), default=0.0)
    for name, g_ref in ref.grads.items():
        copies = [(r, g[name]) for r, g in enumerate(rank_grads) if name in g]
        if not copies:
            failures.append(f"{name}: no rank holds a gradient")
            per_param[name] = {"max_abs": None, "max_rel": None, "ok": False, "ranks": []}
            continue
        worst = (0.0, 0.0, True)
        where = ""  # the first failing copy: its rank and worst element
        for rank, g in copies:
            if g.shape != g_ref.shape:
                worst = (float("inf"), float("inf"), False)
                where = f" on rank {rank}: shape {tuple(g.shape)}, reference {tuple(g_ref.shape)}"
                break
            a, r, ok = compare_tensors(g, g_ref, floor, tolerance)
            if not ok and not where:
                index, got, want = worst_element(g, g_ref, tolerance)
                where = f" on rank {rank}, worst element {list(index)}: {got:.6g} vs reference {want:.6g}"
            worst = (max(worst[0], a), max(worst[1], r), worst[2] and ok)
        per_param[name] = {"max_abs": worst[0], "max_rel": worst[1], "ok": worst[2],
                           "ranks": [r for r, _ in copies]}
        if not worst[2]:
            failures.append(f"{name}: max abs error {worst[0]:.3g} (relative {worst[1]:.3g}){where}")
    # A parameter the loss does not use (e.g. LLaVA's last vision layer) has no
    # reference gradient; an encoder all-reduce gives it zeros, which agree.
    extra = sorted({n for g in rank_grads for n in g if bool(g[n].any())} - set(ref.grads))
    for name in extra:
        failures.append(f"{name}: a gradient the reference does not have")
    loss_err = abs(loss - ref.loss)
    loss_ok = loss_err <= tolerance[0] * abs(ref.loss)
    if not loss_ok:
        failures.append(f"loss {loss!r} != reference {ref.loss!r}")
    finite = [v for v in per_param.values() if v["max_abs"] is not None]
    return {
        "ok": not failures,
        "loss": loss,
        "reference_loss": ref.loss,
        "loss_error": loss_err,
        "max_abs_error": max((v["max_abs"] for v in finite), default=0.0),
        "max_rel_error": max((v["max_rel"] for v in finite), default=0.0),
        "parameters": per_param,
        "failures": failures,
    }
