"""[[term]](workload) -> schedule."""
from __future__ import annotations

import os

from mpipe_core.algebra.combinators import COMBINATORS
from mpipe_core.algebra.combinators.common import CombineError
from mpipe_core.algebra.combinators.encoders import fuse_encoders
from mpipe_core.algebra.generators import GENERATORS
from mpipe_core.algebra.terms.ast import Call, Sym
from mpipe_core.algebra.terms.signatures import signature_of
from mpipe_core.errors import ArgumentError, MpipeError, SizeLimitError, TermError
from mpipe_core.ir.schedule import Schedule
from mpipe_core.workloads.workload import Workload

DEFAULT_MAX_OPS = 5_000_000


MAX_OPS_ENV = "MPIPE_MAX_OPS"


def max_ops(env: str = MAX_OPS_ENV, default: int = DEFAULT_MAX_OPS) -> int:
    """The op limit set in the environment variable `env`, else `default`."""
    value = os.environ.get(env, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise MpipeError(f"{env} must be a positive whole number of ops, not {value[:40]!r}")
    return int(value)


def estimate_ops(term: Call, workload: Workload) -> int:
    """An upper estimate of the op count, computed without building anything."""
    sig = signature_of(term.name)
    if sig.kind == "generator":
        p, m, v = term.kw("p"), term.kw("m"), term.kw("v", 2 if "v" in [q.name for q in sig.params] else 1)
        if term.name in ("zbv", "dualpipev"):
            v = 2
        encoder_ops = 3 * m * len(workload.encoders)
        return 3 * p * v * m + encoder_ops
    children = [value for _, value in term.kwargs if isinstance(value, Call)]
    sizes = [estimate_ops(c, workload) for c in children]
    if term.name == "repeat":
        return sizes[0] * term.kw("n")
    total = sum(sizes)
    if term.name == "split_bw":
        return total * 3 // 2 + 1
    if term.name == "transpose":
        return total * 2 + 4 * (term.kw("shards", 1) or 1) * total // 3
    if term.name in ("colocated", "disaggregate"):  # a barrier or all-reduce per device and encoder
        return total + 3 * len(workload.encoders) * _devices(term)
    return total


def _devices(term: Call) -> int:
    """About how many devices a term's schedule has (an upper estimate)."""
    sig = signature_of(term.name)
    if sig.kind == "generator":
        return term.kw("p")
    children = [_devices(value) for _, value in term.kwargs if isinstance(value, Call)]
    if term.name == "par":
        return sum(children)
    extra = {"encoder_stage": 1, "disaggregate": term.kw("encoder_devices") or 0}.get(term.name, 0)
    return max(children) + extra


def evaluate_term(term: Call, workload: Workload, limit: int | None = None) -> Schedule:
    limit = max_ops() if limit is None else limit
    estimate = estimate_ops(term, workload)
    if estimate > limit:
        raise SizeLimitError(
            f"{term.name}(...) would build about {estimate:,} ops, over the limit of {limit:,} "
            f"(set MPIPE_MAX_OPS or pass a larger limit)"
        )
    return _evaluate(term, workload)


def _plain(value):
    """A combinator's option as a plain value: a bare word is its text (`none`: None)."""
    if isinstance(value, Sym):
        return None if value.name == "none" else value.name
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _transposes(node) -> list[Call]:
    """Every `transpose` call in `node`, outermost first."""
    if not isinstance(node, Call):
        return []
    found = [node] if node.name == "transpose" else []
    for value in (*node.args, *(v for _, v in node.kwargs)):
        found += _transposes(value)
    return found


def _transposed_encoders(term: Call, workload: Workload) -> set[str]:
    """The encoders a `transpose` term moves (`encoders=`: all by default)."""
    chosen = term.kw("encoders")
    if chosen is None or str(chosen) == "all":
        return {e.name for e in workload.encoders}
    return {str(x) for x in (chosen if isinstance(chosen, tuple) else (chosen,))}


def _refuse_transposing_twice(term: Call, workload: Workload) -> None:
    """transpose(transpose(...)) moving one encoder twice is a mistake, not a schedule:
    refused, naming the inner transpose (moving different encoders stepwise is fine)."""
    mine = _transposed_encoders(term, workload)
    for inner in _transposes(term.kw("term")):
        twice = sorted(mine & _transposed_encoders(inner, workload))
        if twice:
            at = f" at line {inner.pos[0]}, column {inner.pos[1]}" if inner.pos else ""
            raise CombineError(f"its term already transposes {', '.join(twice)} (the transpose{at}): an encoder "
                               f"is transposed once; remove one transpose")


def _evaluate(term: Call, workload: Workload, group: int = 1) -> Schedule:
    """`group`: microbatches per encoder op, set by an `encoder_batch` around
    the term; its generators fuse the encoders in groups, and every
    combinator that places encoders reads it from the pipeline."""
    sig = signature_of(term.name)
    line, col = term.pos or (None, None)
    try:
        if sig.kind == "generator":
            params = {k: v for k, v in term.kwargs}
            schedule = GENERATORS[term.name].function(**params)
            return fuse_encoders(schedule, workload, group)
        spec = COMBINATORS[term.name]
        if term.name == "encoder_batch":
            if group != 1:
                raise CombineError(f"encoder_batch inside encoder_batch (k={term.kw('k')} inside k={group}): "
                                   f"write one")
            group = term.kw("k")
        if term.name == "transpose":
            _refuse_transposing_twice(term, workload)
        schedules = [_evaluate(v, workload, group) for k, v in term.kwargs if isinstance(v, Call)]
        options = {k: _plain(v) for k, v in term.kwargs if not isinstance(v, Call)}
        return spec.function(*schedules, workload, **options)
    except ArgumentError as error:
        where = term.position_of(error.argument) or (line, col)
        raise TermError(f"{term.name}: {error.message}", *where) from None
    except TermError:
        raise
    except MpipeError as error:
        raise TermError(f"{term.name}: {error.message}", line, col) from None
