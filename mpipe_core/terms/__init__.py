"""The term language: parse text, check it against signatures, print it back."""
from .ast import Call, Sym, Term, Value
from .parser import parse, parse_raw

__all__ = ["Call", "Sym", "Term", "Value", "parse", "parse_raw"]
