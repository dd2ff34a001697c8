"""What each generator and combinator accepts: names, types, ranges, defaults.

`check` binds a raw call to its signature, so `repeat(x, 3)` and
`repeat(x, n=3)` become the same term, and rejects what does not fit with the
position of the offending argument and the rule it broke.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from mpipe_core.algebra.signature import REQUIRED, Param, Signature
from mpipe_core.algebra.terms.ast import Call, Sym
from mpipe_core.errors import TermError, closest


@lru_cache(maxsize=1)
def signatures() -> dict[str, Signature]:
    from mpipe_core.algebra.combinators import COMBINATORS
    from mpipe_core.algebra.generators import GENERATORS

    table: dict[str, Signature] = {}
    for name, spec in GENERATORS.items():
        params = tuple(
            Param(key, "int", REQUIRED if default is None else default, minimum=1,
                  help={"p": "pipeline devices", "m": "microbatches", "v": "chunks per device"}.get(key, ""))
            for key, default in spec.params.items()
        )
        table[name] = Signature(name, "generator", params, spec.description)
    for name, spec in COMBINATORS.items():
        table[name] = Signature(name, "combinator", spec.params, spec.description)
    return table


def signature_of(name: str) -> Signature | None:
    return signatures().get(name)


def check(call: Call) -> Call:
    """Bind `call` (recursively) to its signature; raise TermError on a mismatch."""
    table = signatures()
    sig = table.get(call.name)
    line, col = call.pos or (None, None)
    if sig is None:
        hint = closest(call.name, table)
        tail = f"; did you mean '{hint}'?" if hint else f" (known: {', '.join(sorted(table))})"
        raise TermError(f"unknown schedule '{call.name}'{tail}", line, col)
    bound: dict[str, Any] = {}
    positional = list(sig.params)  # positional arguments bind in signature order
    if len(call.args) > len(positional):
        extra_pos = call.position_of(len(positional)) or (line, col)
        raise TermError(
            f"{call.name} takes at most {len(positional)} argument(s), got {len(call.args)}: "
            f"usage {sig.usage()}", *extra_pos,
        )
    for i, value in enumerate(call.args):
        bound[positional[i].name] = (value, call.position_of(i))
    for key, value in call.kwargs:
        pos = call.position_of(key)
        param = sig.param(key)
        if param is None:
            hint = closest(key, [p.name for p in sig.params])
            tail = f"; did you mean '{hint}'?" if hint else ""
            raise TermError(f"{call.name} has no argument '{key}'{tail} (usage {sig.usage()})", *pos)
        if key in bound:
            raise TermError(f"argument '{key}' of {call.name} given twice", *pos)
        bound[key] = (value, pos)
    kwargs: list[tuple[str, Any]] = []
    for param in sig.params:
        if param.name not in bound:
            if param.required:
                raise TermError(f"{call.name} is missing argument '{param.name}' (usage {sig.usage()})", line, col)
            continue
        value, pos = bound[param.name]
        value = _check_value(call.name, param, value, pos)
        if not param.required and not param.positional and value == _canonical_default(param):
            continue  # defaults are not part of the canonical term
        kwargs.append((param.name, value))
    arg_pos = tuple((k, p) for k, (_, p) in bound.items())
    return Call(call.name, (), tuple(kwargs), pos=call.pos, arg_pos=arg_pos)


def _canonical_default(param: Param) -> Any:
    if param.type in ("choice", "names") and isinstance(param.default, str):
        return Sym(param.default)
    if param.default is None:
        return Sym("none")
    return param.default


def _check_value(owner: str, param: Param, value: Any, pos) -> Any:
    where = pos or (None, None)
    what = f"{owner}: argument '{param.name}'"
    if param.nullable and value == Sym("none"):
        return value
    if param.type == "term":
        if not isinstance(value, Call):
            raise TermError(f"{what} must be a schedule term, got {_describe(value)}", *where)
        return check(value)
    if param.type == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TermError(f"{what} must be an integer, got {_describe(value)}", *where)
    elif param.type == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TermError(f"{what} must be a number, got {_describe(value)}", *where)
        value = float(value)
    elif param.type == "bool":
        if not isinstance(value, bool):
            raise TermError(f"{what} must be true or false, got {_describe(value)}", *where)
    elif param.type == "ints":
        if not isinstance(value, tuple) or not value or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            got = _describe(value)
            if isinstance(value, tuple) and value:
                bad = next(v for v in value if isinstance(v, bool) or not isinstance(v, int))
                got = f"a list with {_describe(bad)}"
            raise TermError(f"{what} must be a list of integers like [4, 3, 3], got {got}", *where)
        if param.minimum is not None and min(value) < param.minimum:
            bad = next(i for i, v in enumerate(value) if v < param.minimum)
            raise TermError(f"{what}: entry {bad} is {value[bad]}, each must be >= {param.minimum:g}", *where)
        return value
    elif param.type == "names":
        items = value if isinstance(value, tuple) else (value,)
        if not items or not all(isinstance(v, Sym) for v in items):
            raise TermError(f"{what} must be a name or a list of names like [vision, audio], got {_describe(value)}", *where)
        if len({v.name for v in items}) != len(items):
            raise TermError(f"{what} names an encoder twice", *where)
        return value
    elif param.type == "choice":
        if not isinstance(value, Sym) or value.name not in param.choices:
            hint = closest(value.name, param.choices) if isinstance(value, Sym) else None
            tail = f"; did you mean '{hint}'?" if hint else ""
            raise TermError(f"{what} must be one of {', '.join(param.choices)}, got {_describe(value)}{tail}", *where)
        return value
    if param.minimum is not None and value < param.minimum:
        raise TermError(f"{what} must be >= {param.minimum:g}, got {value}", *where)
    return value


def _describe(value: Any) -> str:
    if isinstance(value, Call):
        return f"the term {value.name}(...)"
    if isinstance(value, Sym):
        return f"'{value.name}'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "a list" if value else "an empty list"
    return repr(value)
