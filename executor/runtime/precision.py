"""`--precision`: what the executor computes in (issue 39, section 6).

* ``fp32`` (the default): everything in float32.
* ``bf16``: the forward's matmuls, convolutions and attention in bfloat16
  (`torch.autocast`, as torch's AMP and FSDP2's `MixedPrecisionPolicy` run
  them), with float32 *master weights* (the parameters and the optimizer's
  state stay float32; autocast casts a weight to bf16 where an op uses it) and
  float32 *gradients*: a parameter's `.grad` is float32, so microbatches
  accumulate, and the encoder's all-reduce and the shared parameters' sums
  (the gradient reductions) run, in float32.  The backward runs outside
  autocast, as after `loss.backward()`, on the dtypes the forward chose.

Messages between ranks travel in float32: a bf16 output (a projector's
features, a conv stem's) is upcast before it is sent, which is exact, and the
backward casts the gradient it receives to its output's dtype, as autograd's
own cast would in one process.  A recomputed forward runs under the autocast
state its forward ran under (`recompute._Recomputed`).

The gradient check under bf16 compares with the single-process model run
under the same autocast (`reference.reference_run`), at `BF16_TOLERANCE`.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from mpipe_core.runs.run_options import PRECISIONS  # noqa: F401  (one list: the CLI, the queue, here)

# The gradient check's (rtol, atol scale) under bf16: one bf16 unit roundoff (2^-8) of the element
# plus one of the tensor's largest element (docs/running.md says why).
BF16_TOLERANCE = (2.0 ** -8, 2.0 ** -8)


def compute_context(precision: str, device: torch.device | str):
    """The forward's compute dtype: autocast to bf16, or nothing (fp32)."""
    if precision == "fp32":
        return nullcontext()
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    raise ValueError(f"unknown precision '{precision}' ({', '.join(PRECISIONS)})")


def wire(tensor: torch.Tensor) -> torch.Tensor:
    """What a message carries: floating point as float32 (an exact upcast from bf16)."""
    return tensor.float() if tensor.is_floating_point() and tensor.dtype != torch.float32 else tensor
