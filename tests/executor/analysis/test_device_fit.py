"""`calibrate --device` (executor/analysis/device_fit.py): a 'measured' run made by
the model itself at a known gemm_efficiency is fitted back to it; the report's
residuals and errors; the refusals."""
import pytest

from executor.analysis.calibrate import measured_from_rows
from executor.analysis.device_fit import fit_device, predicted_ms, with_device
from executor.errors import CalibrationError
from mpipe_core.api import evaluate
from mpipe_core.ir.timeline_record import TimelineRecord

DOC = {"model": "llama2-7b", "device": "a100", "cluster": "dgx-a100", "parallel": {"tp": 2, "dp": 2}}
TERM = "1f1b(p=4, m=8)"


def synthetic_rows(doc: dict, term: str = TERM, **fractions) -> list[TimelineRecord]:
    """The model's own timeline at the given device fractions, in seconds as a run stores it."""
    ev = evaluate(term, with_device(doc, fractions))
    return [r._replace(start=r.start * 1e-3, end=r.end * 1e-3) for r in ev.timeline.records()]


def test_a_run_made_at_gemm_efficiency_0_7_is_fitted_back_to_it():
    measured = measured_from_rows(TERM, DOC, synthetic_rows(DOC, gemm_efficiency=0.7))
    fit = fit_device(measured, DOC)
    assert fit.fitted["gemm_efficiency"] == pytest.approx(0.7, abs=1e-3)
    assert fit.before["gemm_efficiency"] == 0.7959  # the a100 preset's
    assert fit.error_after < 1e-3 < fit.error_before
    assert {r.kind for r in fit.residuals} == {"llm F", "llm BW"}
    # the preset (0.7959) predicted too fast: 12% on the GEMMs, less on whole ops with their other work
    assert all(abs(r.after) < 1e-3 and r.before < -0.05 for r in fit.residuals)
    assert fit.workload["device"]["preset"] == "a100"
    assert fit.workload["device"]["gemm_efficiency"] == fit.fitted["gemm_efficiency"]
    # The fitted workload predicts the measured ops.
    ops = list(measured.steps[0])
    measured_ms = [(measured.steps[0][op].end - measured.steps[0][op].start) * 1e3 for op in ops]
    assert predicted_ms(measured.evaluation.schedule, fit.workload, ops) == pytest.approx(measured_ms, rel=1e-3)
    assert "gemm_efficiency   0.7959 -> 0.7" in fit.format()


def test_memory_efficiency_is_fitted_where_memory_bound_work_identifies_it():
    # llama2-7b's norms, residual adds and activation are memory-bound: the run tells memory_efficiency.
    fit = fit_device(measured_from_rows(TERM, DOC, synthetic_rows(DOC, gemm_efficiency=0.7)), DOC)
    assert not fit.not_fitted
    assert fit.fitted["memory_efficiency"] == pytest.approx(0.9, abs=1e-3)


def test_a_run_faster_than_the_peak_allows_is_refused():
    rows = [r._replace(end=r.start + (r.end - r.start) * 0.3) for r in synthetic_rows(DOC, gemm_efficiency=1.0)]
    with pytest.raises(CalibrationError, match=r"^the fitted gemm_efficiency would be above 1 \(the run is "
                                                r"faster than the device's peak\), outside \(0, 1\]"):
        fit_device(measured_from_rows(TERM, DOC, rows), DOC)


@pytest.mark.parametrize("doc, message", [
    ("uniform", "calibrate --device needs an analytic workload (a model, a device and a cluster); this one "
                "states its op costs explicitly"),
    ({"model": "llama2-7b", "device": "a100"}, "calibrate --device needs a workload with a cluster: without "
                                               "one an op's time is the device's single efficiency, not its roofline"),
])
def test_workloads_without_a_roofline_are_refused(doc, message):
    measured = measured_from_rows("1f1b(p=2, m=2)", None, evaluate("1f1b(p=2, m=2)").timeline.records())
    with pytest.raises(CalibrationError) as err:
        fit_device(measured, doc if isinstance(doc, dict) else None)
    assert str(err.value) == message
