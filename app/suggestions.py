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


def is_transposed(term: str) -> bool:
    """Whether `term` already transposes its encoders (under recompute, encoder_batch and the like)."""
    from mpipe_core.search.fit import family

    try:
        return family(term) == "transpose"
    except MpipeError:
        return False


def _pair(term: str, baseline: str | None = None) -> tuple[str, str] | None:
    """(before, after): what you would run against its transpose.  A transpose is
    compared with `baseline` (the plan's winner it was opened from) where given, else
    with its own body; any other term with itself transposed, a `balanced(t)` in it
    (the encoders folded into the chain, which cannot be transposed) as `t`."""
    from mpipe_core.algebra.terms import parse

    try:
        ast = parse(term)
    except MpipeError:
        return None
    text = str(ast)
    if ast.name == "transpose":
        return (baseline or str(ast.kw("term")), text)
    if is_transposed(text):  # e.g. recompute(transpose(...)): no one body to compare it with
        return (baseline, text) if baseline else None
    return (text, transposed(str(unfolded(ast))))


def unfolded(node):
    """The term with every `balanced(t)` replaced by `t`: the encoders back as ops of their
    own, which is what a transpose can move (recompute and the like stay around it)."""
    from mpipe_core.algebra.terms import Call

    if not isinstance(node, Call):
        return node
    if node.name == "balanced":
        return unfolded(node.kw("term"))
    return Call(node.name, tuple(unfolded(a) for a in node.args),
                tuple((k, unfolded(v)) for k, v in node.kwargs))


def pair_refusal(term: str, workload: WorkloadChoice, baseline: str | None = None) -> str | None:
    """Why Before / after has no pair for the Designer's `term` (None: it has one)."""
    pair = _pair(term, baseline)
    if pair is None:
        return refusal(term, workload) or f"{term} has no untransposed form to compare it with"
    return next((f"{t}: {why}" for t in pair if (why := refusal(t, workload)) is not None), None)


def before_after_pair(term: str, workload: WorkloadChoice, baseline: str | None = None) -> tuple[str, str] | None:
    """Before / after for the Designer's `term`: a transpose against the plan's
    winner (`baseline`) or its own body, `balanced(t)` against `t` transposed, or `term`
    against its transpose; None when that pair does not evaluate."""
    return _pair(term, baseline) if pair_refusal(term, workload, baseline) is None else None


FIT_CACHE = SharedCache(64)  # (canonical term, workload digest) -> FitSuggestion or None


def fit_suggestion(term: str, workload: WorkloadChoice):
    """The fastest way to make `term` fit the device's memory on `workload`
    (`mpipe_core.search.make_fit.way_to_fit`: recomputing the encoders' own ops,
    sharding a trained encoder's state), or None; cached across sessions.  Raises
    TooBig for a term above what the page evaluates in its own process (the search
    evaluates several variants of it)."""
    from mpipe_core.algebra.evaluate import estimate_ops
    from mpipe_core.algebra.terms import parse
    from mpipe_core.search.make_fit import way_to_fit
    from mpipe_core.workloads.workload import parse_workload

    key = (term, workload.digest)
    hit = FIT_CACHE.get(key)
    if hit is not None:
        return hit or None
    try:
        if estimate_ops(parse(term), parse_workload(workload.body())) > BACKGROUND_OPS:
            raise TooBig(term)
        found = way_to_fit(term, workload.body(), max_ops=app_max_ops())
    except MpipeError:
        found = None
    FIT_CACHE.put(key, found or False)
    return found


class TooBig(Exception):
    """A term too big for the page to search ways of making it fit."""
