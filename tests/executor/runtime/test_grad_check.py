"""The gradient check itself: `compare_tensors` and `check_step` on tensors whose
answer is known, and a wrong gradient injected into a real run reported by
`mpipe run --check-grads` and by the queue's "gradient check failed" error,
naming the parameter and the worst element."""
from __future__ import annotations

import re

import pytest
import torch

from executor.runtime.reference import ATOL_SCALE, RTOL, ReferenceStep, check_step, compare_tensors, worst_element

from executor_matrix import TEXT, job

PARAM = "llm.blocks.0.attn.qkv.weight"


def test_compare_tensors_tolerance_edges():
    ref = torch.tensor([1.0, -2.0, 0.0, 4.0], dtype=torch.float64)
    scale = 4.0
    # The slack of element 1: RTOL * |g_ref| + ATOL_SCALE * max|g_ref|.
    slack = RTOL * 2.0 + ATOL_SCALE * scale
    inside = ref.clone()
    inside[1] -= 0.9 * slack
    a, rel, ok = compare_tensors(inside, ref)
    assert ok and a == pytest.approx(0.9 * slack) and rel == pytest.approx(0.9 * slack / scale)
    outside = ref.clone()
    outside[1] -= 1.1 * slack
    assert compare_tensors(outside, ref)[2] is False
    # A zero reference element is judged by the absolute slack alone, not by relative error.
    near_zero = ref.clone()
    near_zero[2] = 0.5 * ATOL_SCALE * scale
    assert compare_tensors(near_zero, ref)[2] is True
    near_zero[2] = 2 * ATOL_SCALE * scale
    assert compare_tensors(near_zero, ref)[2] is False
    assert worst_element(near_zero, ref) == ((2,), 2 * ATOL_SCALE * scale, 0.0)
    # All-zero reference: any difference is infinitely relative.
    assert compare_tensors(torch.ones(3), torch.zeros(3)) == (1.0, float("inf"), False)
    assert compare_tensors(torch.zeros(3), torch.zeros(3)) == (0.0, 0.0, True)
    # A tensor of rounding noise (its maximum below ATOL_SCALE x the step's largest gradient,
    # `floor`) is judged with the step-wide slack: noise passes, a wrong element is still
    # caught and named.
    floor = 10.0
    noise = torch.tensor([1e-7, -2e-7, 0.0], dtype=torch.float64)
    assert compare_tensors(noise * 3, noise, floor)[2] is True
    assert compare_tensors(noise * 3, noise)[2] is False  # by its own maximum it would fail
    wrong = noise.clone()
    wrong[2] = 2 * ATOL_SCALE * floor
    assert compare_tensors(wrong, noise, floor) == (pytest.approx(2 * ATOL_SCALE * floor),
                                                    pytest.approx(2 * ATOL_SCALE), False)
    assert worst_element(wrong, noise) == ((2,), 2 * ATOL_SCALE * floor, 0.0)


def test_check_step_names_every_kind_of_failure():
    g = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 1
    ref = ReferenceStep(loss=2.0, grads={"a": g.clone(), "b": g.clone(), "c": g.clone()})
    wrong = g.clone()
    wrong[1, 2] += 0.5
    result = check_step([{"a": g.clone(), "b": wrong}, {"b": g.clone(), "d": g.clone()}], ref, loss=2.0 + 1e-3)
    assert not result["ok"]
    assert result["failures"] == [
        "b: max abs error 0.5 (relative 0.0833) on rank 0, worst element [1, 2]: 6.5 vs reference 6",
        "c: no rank holds a gradient",
        "d: a gradient the reference does not have",
        "loss 2.001 != reference 2.0",
    ]
    assert result["parameters"]["b"]["ranks"] == [0, 1] and result["parameters"]["a"]["ok"]
    assert result["max_abs_error"] == pytest.approx(0.5)
    shape = check_step([{"a": g.reshape(3, 2), "b": g, "c": g}], ref, loss=2.0)
    assert shape["failures"] == ["a: max abs error inf (relative inf) on rank 0: shape (3, 2), reference (2, 3)"]
    assert check_step([{"a": g, "b": g, "c": g}], ref, loss=2.0)["ok"]


WRONG_GRADIENT = {"rank": 0, "kind": "wrong_grad", "param": PARAM, "index": 5, "delta": 1.0}


def _wrong_gradient_job():
    return job("1f1b(p=2, m=4)", TEXT, fault=dict(WRONG_GRADIENT))


def test_a_wrong_gradient_fails_the_check_naming_parameter_and_element():
    from executor.runtime.rank import run_local
    from executor.service.queue_worker import grad_check_failure

    (good,) = run_local([job("1f1b(p=2, m=4)", TEXT)], 2)
    (bad,) = run_local([_wrong_gradient_job()], 2)
    assert good.grad_check["ok"] and not bad.grad_check["ok"]
    failures = bad.grad_check["steps"][0]["failures"]
    assert bad.grad_check["steps"][0]["parameters"][PARAM]["ranks"] == [0]
    from executor.runtime.model import MLLM
    from executor.runtime.runtime import OptimizerSpec

    columns_of_param = dict(MLLM(TEXT).named_parameters())[PARAM].shape[1]
    row, col = divmod(WRONG_GRADIENT["index"], columns_of_param)
    # Exactly two failures: the gradient, at the injected element, off by `delta`; and,
    # since the step's SGD update used it, that parameter afterwards, off by lr * delta.
    assert len(failures) == 2, failures
    found = re.fullmatch(rf"{re.escape(PARAM)}: max abs error 1 \(relative (\S+)\) on rank 0, "
                         rf"worst element \[{row}, {col}\]: (\S+) vs reference (\S+)", failures[0])
    assert found, failures[0]
    relative, got, want = (float(x) for x in found.groups())
    assert got - want == pytest.approx(WRONG_GRADIENT["delta"], abs=1e-4)
    assert relative > 1  # far outside any slack: the error exceeds the tensor's largest gradient
    lr = OptimizerSpec().lr
    assert failures[1] == (f"{PARAM}: parameter after the last step differs by "
                           f"{lr * WRONG_GRADIENT['delta']:.3g} on rank 0")
    # The queue's error for the run names the same.
    error = grad_check_failure(bad.grad_check)
    assert error.startswith("gradient check failed: the pipelined gradients differ from the reference")
    assert error.endswith("; " + "; ".join(failures))


def test_mpipe_run_check_grads_reports_the_wrong_gradient(monkeypatch, capsys):
    from executor.runtime.jobs import Job
    from mpipe_cli.main import main

    make = Job.make.__func__

    def make_with_fault(cls, *args, **kwargs):
        made = make(cls, *args, **kwargs)
        made.fault = dict(WRONG_GRADIENT)
        return made

    monkeypatch.setattr(Job, "make", classmethod(make_with_fault))
    code = main(["run", "1f1b(p=2, m=4)", "--model", "tiny-text", "--in-process", "--check-grads"])
    out = capsys.readouterr().out
    assert code == 1
    assert "grad check FAIL" in out
    assert f"    {PARAM}: max abs error 1 " in out and "on rank 0, worst element [" in out
