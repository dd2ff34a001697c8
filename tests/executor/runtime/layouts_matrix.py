"""The deployed layouts the executor tests run (issue 22): Megatron MIMO's
colocated schedule, batched encoder microbatches under transpose, and the
encoder on a device of its own, on the built-in MLLM and HF tiny LLaVA, each
with a trainable and a frozen encoder."""
from __future__ import annotations

from executor.runtime.jobs import Job

from executor_matrix import FROZEN, TRAIN, job
from own_model_matrix import own_job, spec_for

COLOCATED = "colocated(1f1b(p=2, m=4))"
GROUPED = "encoder_batch(transpose(1f1b(p=2, m=4)), 2)"
DISAGGREGATED = "disaggregate(1f1b(p=2, m=4), encoder_devices=1)"
TERMS = (COLOCATED, GROUPED, DISAGGREGATED)
RANKS = {COLOCATED: 2, GROUPED: 2, DISAGGREGATED: 3}
MODELS = ("builtin", "hf:llava")


def layout_job(term: str, model: str, frozen: bool, **kw) -> Job:
    if model == "builtin":
        out = job(term, FROZEN if frozen else TRAIN, **kw)
    else:
        out = own_job(term, spec_for("llava", frozen), **kw)
    out.name = f"{model} {'frozen' if frozen else 'trainable'} {term}"
    return out


CASES = [(term, model, frozen) for term in TERMS for model in MODELS for frozen in (False, True)]


def figures(result) -> str:
    """The gradient check's figures as `mpipe run --check-grads` prints them."""
    g = result.grad_check
    return (f"{result.name}: {'PASS' if g['ok'] else 'FAIL'} max abs error {g['max_abs_error']:.3g}, "
            f"max error / max|grad| {g['max_rel_error']:.3g}, loss error {g['loss_error']:.3g}")
