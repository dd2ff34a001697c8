"""Term syntax trees.

A `Call` is `name(arg, ..., key=value, ...)`.  After checking against its
signature (`signatures.py`) every argument is bound by name and default values
are dropped, so two spellings of one schedule give equal terms and print the
same canonical text.  Source positions ride along for error messages but take
no part in equality.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class Sym:
    """A bare word used as a value, e.g. `prefix` in `mode=prefix`."""

    name: str

    def __str__(self) -> str:
        return self.name


Value = Union[int, float, bool, Sym, "Call", tuple]


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Value, ...] = ()  # positional (raw terms only; bound terms use kwargs)
    kwargs: tuple[tuple[str, Value], ...] = ()
    # (line, column) of the call and of each argument, for error messages.
    pos: tuple[int, int] | None = field(default=None, compare=False)
    arg_pos: tuple[tuple[str | int, tuple[int, int]], ...] = field(default=(), compare=False)

    def kw(self, name: str, default=None):
        for key, value in self.kwargs:
            if key == name:
                return value
        return default

    def position_of(self, key: str | int) -> tuple[int, int] | None:
        for k, p in self.arg_pos:
            if k == key:
                return p
        return self.pos

    def __str__(self) -> str:
        return format_term(self)


Term = Call


def format_value(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def format_term(term: Call) -> str:
    """Canonical text: term-valued arguments positionally, the rest as keywords.

    (A checked term holds a `Call` exactly where its signature has a term
    parameter, so the value says which is which.)"""
    parts: list[str] = [format_value(v) for v in term.args]
    for key, value in term.kwargs:
        if isinstance(value, Call):
            parts.append(format_value(value))
        else:
            parts.append(f"{key}={format_value(value)}")
    return f"{term.name}({', '.join(parts)})"
