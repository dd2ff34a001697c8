"""The term language: parse text, check it against signatures, print it back."""
from mpipe_core.algebra.terms.ast import Call, Sym, Term, Value
from mpipe_core.algebra.terms.parser import parse, parse_raw

__all__ = ["Call", "Sym", "Term", "Value", "parse", "parse_raw"]
