"""The single-process reference runs and the gradient comparison.

The reference trains the whole model in one process on the same data: per
microbatch, forward and `backward()` of its `reference_loss` (summed token
loss over the step's token count; for the HF adapters the HF model's own
forward, for a plug-in its parts chained), gradients accumulating in `.grad`,
then the same optimizer step.  It runs twice: in float32, the run's precision,
and in float64, the yardstick.  A pipelined run must reproduce the loss, every
parameter's gradient and the parameters after the last step as closely as the
float32 reference does, judged against the float64 one by the one rule of
`gradient_agreement` (its module note states it and why).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .gradient_agreement import Agreement, agreement, unit_roundoff
from .models.protocol import Batch, PipelineModel, step_normalizer
from .precision import compute_context

# A comparison of two float32 computations with no float64 reference (tests of a
# model's own parts, the torch benchmark): relative 1e-5 plus 1e-6 of the
# tensor's largest element.  The run's gradient check does not use it.
RTOL = 1e-5
ATOL_SCALE = 1e-6


@dataclass
class ReferenceStep:
    loss: float
    grads: dict[str, torch.Tensor]


@dataclass
class References:
    """The reference in the run's precision and in float64: per step, and the
    parameters after the last step."""

    steps: list[ReferenceStep]
    final: dict[str, torch.Tensor]
    truth_steps: list[ReferenceStep]
    truth_final: dict[str, torch.Tensor]


def _cast(batch: Batch, dtype: torch.dtype) -> Batch:
    """The batch's floating tensors (images, pixel fields) in `dtype`; ids stay."""
    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() else t
    return Batch(None if batch.images is None else cast(batch.images),
                 {k: cast(v) for k, v in batch.fields.items()})


def reference_run(model: PipelineModel, microbatches: int, steps: int, optimizer,
                  step_batches: Callable[[PipelineModel, int], list] | None = None,
                  dtype: torch.dtype = torch.float32, precision: str = "fp32") -> tuple[list[ReferenceStep], dict]:
    """Steps of the whole (freshly built) model; returns per-step loss and
    gradients, and the final parameters.  `step_batches(model, step)`: that
    step's batches in draw order (a data run's: each step its own drawn
    batch); default the model's seeded `make_batch`.  `dtype`: the precision
    the model and its data are cast to (float64: the yardstick); `precision`:
    the forward under the run's autocast (`precision.compute_context`)."""
    root = model.root
    if dtype != torch.float32:
        root.to(dtype)
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
        total = torch.zeros((), dtype=dtype)
        for batch in batches:
            with compute_context(precision, "cpu"):
                loss = model.reference_loss(_cast(batch, dtype), normalizer)
            loss.backward()
            total += loss.detach()
        grads = {n: p.grad.detach().clone() for n, p in root.named_parameters() if p.grad is not None}
        out.append(ReferenceStep(float(total), grads))
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
    final = {n: p.detach().clone() for n, p in root.named_parameters() if p.requires_grad}
    return out, final


def references(build: Callable[[], PipelineModel], microbatches: int, steps: int, optimizer,
               step_batches: Callable[[PipelineModel, int], list] | None = None,
               precision: str = "fp32") -> References:
    """The reference in the run's precision (float32 master weights, the forward under the run's
    autocast) and the float64 one, each on a freshly built model."""
    steps32, final32 = reference_run(build(), microbatches, steps, optimizer, step_batches, precision=precision)
    steps64, final64 = reference_run(build(), microbatches, steps, optimizer, step_batches, dtype=torch.float64)
    return References(steps32, final32, steps64, final64)


def compare_tensors(got: torch.Tensor, ref: torch.Tensor, floor: float = 0.0,
                    tolerance: tuple[float, float] = (RTOL, ATOL_SCALE)) -> tuple[float, float, bool]:
    """(max abs error, max error / max|ref|, within tolerance); `floor` is the
    step's largest gradient element (see the module's note on zero gradients);
    `tolerance` (rtol, atol scale): `precision.BF16_TOLERANCE` under bf16."""
    rtol, atol_scale = tolerance
    got, ref = got.double(), ref.double()
    diff = (got - ref).abs()
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    scale = floor if scale < ATOL_SCALE * floor else scale
    max_abs = float(diff.max()) if diff.numel() else 0.0
    ok = bool((diff <= rtol * ref.abs() + atol_scale * scale).all()) if diff.numel() else True
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return max_abs, rel, ok


def _worst(worst: dict | None, name: str, rank: int | None, a: Agreement, what: str) -> dict:
    """The tensor furthest past (or closest to) its bound so far."""
    if worst is not None and worst["ratio"] >= a.ratio:
        return worst
    return {"name": name, "what": what, "rank": rank, "ratio": a.ratio, "error": a.error,
            "allowed": a.allowed, "index": list(a.index), "got": a.got, "reference": a.truth}


def _failure(name: str, rank: int | None, a: Agreement, what: str = "gradient") -> str:
    where = "" if rank is None else f" on rank {rank}"
    return (f"{name}: {what} off by {a.error:.3g} (allowed {a.allowed:.3g}; relative {a.relative:.3g})"
            f"{where}, worst element {list(a.index)}: {a.got:.6g} vs float64 reference {a.truth:.6g}")


def check_step(rank_grads: list[dict[str, torch.Tensor]], ref: ReferenceStep, truth: ReferenceStep,
               loss: float, terms: int) -> dict:
    """Compare every gradient copy the ranks hold, and the loss, with the
    references (`ref` in the run's precision, `truth` in float64) by the rule
    of `gradient_agreement`, `terms` partial results summed per tensor.

    Each reference parameter must have a gradient on at least one rank; a
    parameter held on several ranks (an encoder replica) is checked on each
    rank that has a gradient for it.
    """
    per_param: dict[str, dict] = {}
    failures = []
    worst = None
    # What "relative" divides by: the tensor's largest element, or, for a tensor that is
    # zero in exact arithmetic (its float64 maximum below u of the step's), the step's scaled by u.
    floor = unit_roundoff(torch.float32) * max((float(g.abs().max()) for g in truth.grads.values() if g.numel()),
                                               default=0.0)
    for name, g_truth in truth.grads.items():
        copies = [(r, g[name]) for r, g in enumerate(rank_grads) if name in g]
        if not copies:
            failures.append(f"{name}: no rank holds a gradient")
            per_param[name] = {"max_abs": None, "max_rel": None, "ok": False, "ranks": []}
            continue
        entry = {"max_abs": 0.0, "max_rel": 0.0, "ok": True, "ranks": [r for r, _ in copies]}
        reported = False
        for rank, g in copies:
            if g.shape != g_truth.shape:
                entry.update(max_abs=float("inf"), max_rel=float("inf"), ok=False)
                failures.append(f"{name}: shape {tuple(g.shape)} on rank {rank}, reference {tuple(g_truth.shape)}")
                worst = {"name": name, "what": "gradient", "rank": rank, "ratio": float("inf"),
                         "error": float("inf"), "allowed": 0.0, "index": [], "got": None, "reference": None}
                break
            a = agreement(g, ref.grads[name], g_truth, terms=terms)
            worst = _worst(worst, name, rank, a, "gradient")
            relative = a.error / max(a.scale, floor) if max(a.scale, floor) > 0 else a.relative
            entry.update(max_abs=max(entry["max_abs"], a.error), max_rel=max(entry["max_rel"], relative),
                         ok=entry["ok"] and a.ok)
            if not a.ok and not reported:  # the first failing copy: its rank and worst element
                failures.append(_failure(name, rank, a))
                reported = True
        per_param[name] = entry
    # A parameter the loss does not use (e.g. LLaVA's last vision layer) has no
    # reference gradient; an encoder all-reduce gives it zeros, which agree.
    extra = sorted({n for g in rank_grads for n in g if bool(g[n].any())} - set(truth.grads))
    for name in extra:
        failures.append(f"{name}: a gradient the reference does not have")
    la = agreement(torch.tensor(loss, dtype=torch.float32), torch.tensor(ref.loss, dtype=torch.float32),
                   torch.tensor(truth.loss, dtype=torch.float64), terms=terms)
    if not la.ok:
        failures.append(f"loss {loss!r} != float64 reference {truth.loss!r} (off by {la.error:.3g}, "
                        f"allowed {la.allowed:.3g}; float32 reference {ref.loss!r})")
        worst = _worst(worst, "loss", None, la, "loss")
    finite = [v for v in per_param.values() if v["max_abs"] is not None]
    return {
        "ok": not failures,
        "loss": loss,
        "reference_loss": truth.loss,
        "loss_error": la.error,
        "max_abs_error": max((v["max_abs"] for v in finite), default=0.0),
        "max_rel_error": max((v["max_rel"] for v in finite), default=0.0),
        "worst": worst,
        "parameters": per_param,
        "failures": failures,
    }


def check_final(trained: list[tuple[int, dict[str, torch.Tensor]]], refs: References, terms: int) -> dict:
    """The parameters after the last optimizer step, on every rank that trained
    them (`trained`: (rank, name -> tensor)), by the same rule; and a parameter
    trained on several ranks (encoder replicas, shared parameters) must end the
    run bit-for-bit the same on each: they apply one update to one value."""
    failures, worst, worst_rel = [], None, 0.0
    for rank, params in trained:
        for name, value in params.items():
            a = agreement(value, refs.final[name], refs.truth_final[name], terms=terms)
            worst_rel = max(worst_rel, a.relative)
            worst = _worst(worst, name, rank, a, "parameter after the last step")
            if not a.ok:
                failures.append(_failure(name, rank, a, "parameter after the last step"))
    copies: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for rank, params in trained:
        for name, value in params.items():
            copies.setdefault(name, []).append((rank, value))
    for name, held in sorted(copies.items()):
        (first, value), rest = held[0], held[1:]
        for rank, other in rest:
            if not torch.equal(value, other):
                failures.append(f"{name}: the copies on ranks {first} and {rank} differ after the last step by "
                                f"{float((value - other).abs().max()):.3g}")
                worst = {"name": name, "what": f"copies on ranks {first} and {rank}", "rank": rank,
                         "ratio": float("inf"), "error": float((value - other).abs().max()), "allowed": 0.0,
                         "index": [], "got": None, "reference": None}
    return {"ok": not failures, "failures": failures, "max_rel_error": worst_rel, "worst": worst}
