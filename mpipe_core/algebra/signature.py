"""What a generator or combinator accepts: its parameters (name, type, range,
default) and their order.  Plain data, imported by the combinators and by the
term checker (`terms/signatures.py`) alike, so neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED = object()


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # "term" | "int" | "float" | "choice" | "bool" | "names" (a word or [word, ...]) | "ints"
    default: Any = REQUIRED
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False  # accepts `none`
    help: str = ""

    @property
    def positional(self) -> bool:
        return self.type == "term"

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Signature:
    name: str
    kind: str  # "generator" | "combinator"
    params: tuple[Param, ...]
    doc: str = ""

    def param(self, name: str) -> Param | None:
        for p in self.params:
            if p.name == name:
                return p
        return None

    def usage(self) -> str:
        parts = []
        for p in self.params:
            if p.type == "term":
                parts.append(p.name)
            elif p.required:
                parts.append(f"{p.name}=")
            else:
                parts.append(f"{p.name}={_show(p.default)}")
        return f"{self.name}({', '.join(parts)})"


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
