"""The gradient check itself: the rule (`gradient_agreement.agreement`) and
`check_step` on tensors whose answer is known; a wrong gradient injected into a
real run reported by `mpipe run --check-grads` and by the queue's "ran; gradients
differ" error, naming the parameter and the worst element; correct seeded runs
of every kind of schedule pass, and the mutations a broken run leaves (a dropped
microbatch, a swapped encoder shard, a skipped AdamW step) fail.  The full sweep,
50 seeds per family, is `python -m benchmarks grad-check`."""
from __future__ import annotations

import re

import pytest
import torch

from benchmarks.grad_check_sweep import MUTATIONS
from executor.runtime.gradient_agreement import SAFETY, agreement, unit_roundoff
from executor.runtime.reference import ReferenceStep, check_step

from executor_matrix import TEXT, job

PARAM = "llm.blocks.0.attn.qkv.weight"


def test_agreement_allows_what_rounding_does_to_the_reference_and_no_more():
    truth = torch.tensor([1.0, -2.0, 0.0, 4.0], dtype=torch.float64)
    u = unit_roundoff(torch.float32)
    # The float32 reference lands 2^-16 from the truth on one element: that is the noise.
    ref = truth.clone()
    ref[1] += 2.0 ** -16
    bound = SAFETY * 2.0 ** -16
    inside = truth.clone()
    inside[2] -= 0.9 * bound
    a = agreement(inside.float(), ref.float(), truth, terms=4)
    assert a.ok and a.error == pytest.approx(0.9 * bound, rel=1e-6) and a.allowed == pytest.approx(bound, rel=1e-6)
    assert a.index == (2,) and a.relative == pytest.approx(0.9 * bound / 4.0, rel=1e-6)
    outside = truth.clone()
    outside[2] -= 1.1 * bound
    b = agreement(outside.float(), ref.float(), truth, terms=4)
    assert not b.ok and b.index == (2,) and b.got == pytest.approx(-1.1 * bound, rel=1e-6) and b.truth == 0.0
    # A reference exactly on the truth: the floor is the rounding of summing `terms` partials.
    floor = SAFETY * 10 * u * 4.0
    assert agreement((truth + 0.9 * floor).float(), truth.float(), truth, terms=10).ok
    assert not agreement((truth + 0.9 * floor).float(), truth.float(), truth, terms=5).ok
    # bfloat16's unit roundoff is 2^-8: the same floor is 2^16 times wider.
    assert unit_roundoff(torch.bfloat16) == 2.0 ** -8 and u == 2.0 ** -24
    # A gradient that is zero in exact arithmetic holds only noise; the reference's noise is its scale.
    zero = torch.zeros(3, dtype=torch.float64)
    noise = torch.tensor([1e-9, -2e-9, 0.0])
    assert agreement(noise * (SAFETY - 1), noise, zero, terms=4).ok
    assert not agreement(noise * (SAFETY + 1), noise, zero, terms=4).ok
    # Nothing to compare, and a NaN.
    assert agreement(torch.zeros(3), torch.zeros(3), zero, terms=4).ok
    nan = agreement(torch.tensor([0.0, float("nan"), 0.0]), torch.zeros(3), zero, terms=4)
    assert not nan.ok and nan.index == (1,)
    with pytest.raises(ValueError, match="shapes differ"):
        agreement(torch.zeros(2), torch.zeros(3), zero, terms=1)


def test_check_step_names_every_kind_of_failure():
    g = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 1
    truth = ReferenceStep(loss=2.0, grads={k: g.double() for k in "abc"})
    ref = ReferenceStep(loss=2.0, grads={k: g.clone() for k in "abc"})
    wrong = g.clone()
    wrong[1, 2] += 0.5
    result = check_step([{"a": g.clone(), "b": wrong}, {"b": g.clone(), "d": g.clone()}], ref, truth,
                        loss=2.0 + 1e-3, terms=4)
    assert not result["ok"]
    allowed = SAFETY * 4 * unit_roundoff(torch.float32) * 6.0
    assert result["failures"] == [
        f"b: gradient off by 0.5 (allowed {allowed:.3g}; relative 0.0833) on rank 0, worst element [1, 2]: "
        f"6.5 vs float64 reference 6",
        "c: no rank holds a gradient",
        "d: a gradient the reference does not have",
        f"loss 2.001 != float64 reference 2.0 (off by {abs(float(torch.tensor(2.001)) - 2.0):.3g}, allowed "
        f"{SAFETY * 4 * unit_roundoff(torch.float32) * 2.0:.3g}; float32 reference 2.0)",
    ]
    assert result["parameters"]["b"]["ranks"] == [0, 1] and result["parameters"]["a"]["ok"]
    assert result["max_abs_error"] == pytest.approx(0.5)
    assert result["worst"]["name"] == "b" and result["worst"]["index"] == [1, 2] and result["worst"]["rank"] == 0
    shape = check_step([{"a": g.reshape(3, 2), "b": g, "c": g}], ref, truth, loss=2.0, terms=4)
    assert shape["failures"] == ["a: shape (3, 2) on rank 0, reference (2, 3)"]
    assert check_step([{"a": g, "b": g, "c": g}], ref, truth, loss=2.0, terms=4)["ok"]


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
    found = re.fullmatch(rf"{re.escape(PARAM)}: gradient off by 1 \(allowed (\S+); relative (\S+)\) on rank 0, "
                         rf"worst element \[{row}, {col}\]: (\S+) vs float64 reference (\S+)", failures[0])
    assert found, failures[0]
    allowed, relative, got, want = (float(x) for x in found.groups())
    assert got - want == pytest.approx(WRONG_GRADIENT["delta"], abs=1e-4)
    assert relative > 1 and allowed < 1e-5  # far outside the bound: the error exceeds the tensor's largest gradient
    lr = OptimizerSpec().lr
    assert failures[1].startswith(f"{PARAM}: parameter after the last step off by "
                                  f"{lr * WRONG_GRADIENT['delta']:.3g} (allowed "), failures[1]
    worst = bad.grad_check["worst"]
    assert (worst["name"], worst["what"], worst["step"], worst["rank"], worst["index"]) == (
        PARAM, "gradient", 0, 0, [row, col])
    # The queue's error for the run: it ran, its gradients differ; the worst tensor, then the failures.
    error = grad_check_failure(bad.grad_check)
    assert error.startswith(f"ran; gradients differ: worst tensor {PARAM} (gradient, step 0, rank 0): off by 1, ")
    assert error.endswith("; " + "; ".join(f"step 0: {f}" for f in failures))


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
    assert f"grad check FAIL: ran; gradients differ: worst tensor {PARAM} (gradient, step 0, rank 0): off by 1, " in out
    assert f"    step 0: {PARAM}: gradient off by 1 (allowed " in out and "on rank 0, worst element [" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("family", ["zbv", "transpose dynamic shards", "transpose zbv owner", "encoder_batch",
                                    "disaggregate", "adamw"])
def test_seeded_correct_runs_pass_the_check(family):
    from benchmarks.grad_check_sweep import run_family

    checks = run_family(family, range(3))
    assert [c["ok"] for c in checks] == [True] * 3, [c["failures"] for s in checks for c in s["steps"]]
    assert max(c["worst"]["ratio"] for c in checks) < 1


@pytest.mark.parametrize("what, term, kind, fault", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_each_mutation_fails_the_check_naming_what_it_broke(what, term, kind, fault):
    from benchmarks.grad_check_sweep import run_mutation

    check = run_mutation(term, kind, fault)
    assert not check["ok"]
    worst = check["worst"]
    assert worst["ratio"] > 100, worst  # not a near miss: far past the bound
    if fault["kind"] == "skip_optimizer_step":  # rank 1 kept the encoder's old values
        assert worst["what"].startswith("copies on ranks") or worst["what"] == "parameter after the last step"
        assert not check["final_params_ok"]
    elif fault["kind"] == "wrong_grad":
        assert worst["name"] == fault["param"] and worst["step"] == 0
