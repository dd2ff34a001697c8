"""The terms the app offers with one click (the Designer's examples, "Transpose
it", the fused baseline of a transpose, Before / after's pair): each is checked
on the workload before it is offered, so a suggestion never fails when clicked.

A suggestion is evaluated by the core up to `app.evaluation.BACKGROUND_OPS` ops
(what the page evaluates in its own process); a bigger one is built (every
combinator's refusal is raised while building) but not simulated, so checking
it never costs the page a second long simulation.  Verdicts are cached across
sessions by (canonical term, workload digest), like evaluations.
"""
from __future__ import annotations

from mpipe_core.errors import MpipeError

from .evaluation import BACKGROUND_OPS, SharedCache, WorkloadChoice, app_max_ops

CACHE = SharedCache(256)  # (canonical term, workload digest) -> None (valid) or the refusal
_VALID = "ok"


def refusal(term: str, workload: WorkloadChoice) -> str | None:
    """Why `term` cannot be evaluated on `workload` (the core's message), or None."""
    from mpipe_core.api import evaluate
    from mpipe_core.algebra.evaluate import estimate_ops, evaluate_term
    from mpipe_core.algebra.terms import parse
    from mpipe_core.workloads.workload import parse_workload

    try:
        ast = parse(term)
    except MpipeError as error:
        return _reason(error)
    key = (str(ast), workload.digest)
    hit = CACHE.get(key)
    if hit is not None:
        return None if hit == _VALID else hit
    try:
        wl = parse_workload(workload.body())
        if estimate_ops(ast, wl) > BACKGROUND_OPS:
            evaluate_term(ast, wl, app_max_ops())  # built (and refused above the app's limit), not simulated
        else:
            evaluate(ast, wl, max_ops=app_max_ops())
    except MpipeError as error:
        CACHE.put(key, _reason(error))
        return _reason(error)
    CACHE.put(key, _VALID)
    return None


def _reason(error: MpipeError) -> str:
    """The refusal without the term's line and column (the suggestion is not text the user typed)."""
    return getattr(error, "detail", None) or error.message


def valid(term: str, workload: WorkloadChoice) -> bool:
    return refusal(term, workload) is None


def transposed(term: str) -> str:
    """The one-click transpose of `term`."""
    return f"transpose({term}, mode=dynamic)"


def _pair(term: str) -> tuple[str, str] | None:
    from mpipe_core.algebra.terms import parse

    try:
        ast = parse(term)
    except MpipeError:
        return None
    return (str(ast.kw("term")), str(ast)) if ast.name == "transpose" else (str(ast), transposed(str(ast)))


def pair_refusal(term: str, workload: WorkloadChoice) -> str | None:
    """Why Before / after has no pair for the Designer's `term` (None: it has one)."""
    pair = _pair(term)
    if pair is None:
        return refusal(term, workload)
    return next((f"{t}: {why}" for t in pair if (why := refusal(t, workload)) is not None), None)


def before_after_pair(term: str, workload: WorkloadChoice) -> tuple[str, str] | None:
    """Before / after for the Designer's `term`: a transpose and its fused
    baseline, or `term` and its transpose; None when that pair does not evaluate."""
    return _pair(term) if pair_refusal(term, workload) is None else None
