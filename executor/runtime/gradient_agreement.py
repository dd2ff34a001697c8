"""When a run's tensor agrees with the reference: the one rule of every gradient check.

A run and its reference compute the same quantity in the same precision (float32
here; bf16 or a tensor/data-parallel run the same way) but in a different order:
microbatch gradients accumulated in the schedule's order, encoder images batched
in shards, all-reduce members summed in the ring's order, B and W split.  Neither
is the exact answer, so neither can be the yardstick of the other.  The yardstick
is the same computation in float64 (`truth`, rounding about 2^29 times smaller
than float32's), and the rule is:

    max|got - truth| <= SAFETY * max( max|ref - truth| ,  terms * u * max|truth| )

over each tensor, where `ref` is the reference run in the run's own precision,
`u` that precision's unit roundoff (2^-24 for float32, 2^-8 for bf16) and
`terms` the number of partial results summed into the tensor in the run
(microbatches x encoder shards + all-reduce members).

* `max|ref - truth|` is what rounding does to this very computation in this
  precision: measured, not guessed, so it covers whatever the model does
  (softmax, layer norm, a gradient that is zero in exact arithmetic and holds
  only noise, AdamW turning that noise into a whole learning-rate step).  A
  correct run is another rounding of the same sums, so its error is of the same
  size.
* `terms * u * max|truth|` is the textbook bound on summing `terms` partial
  results of size up to max|truth| in any order (Higham, *Accuracy and Stability
  of Numerical Algorithms*, eq. 4.4: gamma_n ~ n*u): the part of the run's
  rounding that its own accumulation order adds, and a floor where the
  reference happened to land exactly on the truth (a scalar, a short bias).
* SAFETY (16) covers that a run's worst element is another draw of that noise, from
  sums taken in another order: across 50 seeded runs of every schedule family
  (`python -m benchmarks grad-check`, the figures in docs/running.md) a correct
  run's error reached 3.2x the float32 reference's own on a gradient and 5.9x on a
  parameter after three AdamW steps (AdamW turns gradient noise into whole
  learning-rate steps), so 16 leaves a margin of over 2.5.  A real fault is orders
  of magnitude past it: a dropped microbatch moves gradients by ~1/m of their size,
  a swapped shard or a skipped optimizer step by their whole size, against a noise
  of ~1e-6 of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SAFETY = 16.0
# The rule in one line, for reports.
RULE = ("max|run - float64| <= 16 x max(max|float32 reference - float64|, terms x u x max|float64|) per tensor")


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the spacing of floats at 1: 2^-24 for float32, 2^-8 for bfloat16."""
    return torch.finfo(dtype).eps / 2


@dataclass(frozen=True)
class Agreement:
    """One tensor judged: its worst element against the truth, and the bound."""

    ok: bool
    error: float  # max |got - truth|
    allowed: float  # the bound the error must stay within
    noise: float  # max |ref - truth|: the reference's own rounding in the run's precision
    scale: float  # max |truth|
    index: tuple[int, ...]  # the worst element
    got: float
    truth: float

    @property
    def relative(self) -> float:
        """The error over the tensor's largest element (0 for an all-zero truth without error)."""
        if self.scale > 0:
            return self.error / self.scale
        return 0.0 if self.error == 0 else float("inf")

    @property
    def ratio(self) -> float:
        """The error over its bound: above 1 fails."""
        if self.allowed > 0:
            return self.error / self.allowed
        return 0.0 if self.error == 0 else float("inf")


def agreement(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, *, terms: int) -> Agreement:
    """Does `got` (the run, in its precision) agree with `truth` (float64) as well as
    `ref` (the reference, in the run's precision) does, within the rounding of
    summing `terms` partial results?  The module's note states the rule."""
    if got.shape != truth.shape or ref.shape != truth.shape:
        raise ValueError(f"shapes differ: run {tuple(got.shape)}, reference {tuple(ref.shape)}, "
                         f"float64 reference {tuple(truth.shape)}")
    u = unit_roundoff(got.dtype if got.is_floating_point() else torch.float32)
    got64, ref64, truth64 = got.double(), ref.double(), truth.double()
    if truth64.numel() == 0:
        return Agreement(True, 0.0, 0.0, 0.0, 0.0, (), 0.0, 0.0)
    diff = (got64 - truth64).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    flat = int(torch.argmax(diff.reshape(-1)))
    error = float(diff.reshape(-1)[flat])
    noise = float((ref64 - truth64).abs().max())
    scale = float(truth64.abs().max())
    allowed = SAFETY * max(noise, max(1, terms) * u * scale)
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(truth64.shape)))
    return Agreement(error <= allowed, error, allowed, noise, scale, index,
                     float(got64.reshape(-1)[flat]), float(truth64.reshape(-1)[flat]))


def worst_line(worst: dict | None) -> str:
    """The tensor furthest from its bound (a grad check's "worst"), in words: which
    tensor, what of it, where, and by how much against what the rule allows."""
    if not worst:
        return "no tensor compared"
    where = [f"step {worst['step']}" if worst.get("step") is not None else "",
             f"rank {worst['rank']}" if worst.get("rank") is not None else ""]
    head = f"{worst['name']} ({', '.join([worst['what']] + [w for w in where if w])})"
    if worst.get("got") is None:
        return f"{head}: differs by {worst['error']:.3g}"
    return (f"{head}: off by {worst['error']:.3g}, {worst['ratio']:.3g}x the allowed {worst['allowed']:.3g}; "
            f"element {worst['index']}: {worst['got']:.6g} vs float64 reference {worst['reference']:.6g}")


def verdict_line(check: dict) -> str:
    """A run's gradient check in one line: PASS with its figures, or 'ran;
    gradients differ' with the worst tensor (the run itself completed)."""
    figures = (f"max abs error {check['max_abs_error']:.3g}, max rel error {check['max_rel_error']:.3g}, "
               f"loss error {check['loss_error']:.3g}")
    if check["ok"]:
        worst = check.get("worst")
        closest = f"; closest to its bound: {worst['name']} at {worst['ratio']:.2f}x" if worst else ""
        return f"grad check PASS: {figures}{closest}"
    return f"grad check FAIL: ran; gradients differ: worst tensor {worst_line(check.get('worst'))}; {figures}"
