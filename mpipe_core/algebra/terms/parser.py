"""Text -> term.  A Lark LALR grammar (never `eval`); errors say line, column and
what was expected."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from lark import Lark, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from mpipe_core.algebra.terms.ast import Call, Sym
from mpipe_core.errors import TermError
from mpipe_core.workloads.inputs import check_nesting

MAX_TERM_TEXT = 100_000

_TOKEN_WORDS = {
    "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "EQUAL": "'='", "NAME": "a name",
    "NUMBER": "a number", "LSQB": "'['", "RSQB": "']'", "$END": "end of input",
}


@lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = (Path(__file__).with_name("grammar.lark")).read_text()
    # cache=True keeps the built LALR tables in a temp file: start-up matters for `mpipe eval`.
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False, cache=True)


class _Build(Transformer):
    @v_args(meta=True)
    def call(self, meta, children):
        name_tok = children[0]
        args, kwargs, arg_pos = [], [], []
        if len(children) > 1:
            for kind, key, value, pos in children[1]:
                if kind == "kw":
                    if any(k == key for k, _ in kwargs):
                        raise TermError(f"argument '{key}' given twice", *pos)
                    kwargs.append((key, value))
                    arg_pos.append((key, pos))
                else:
                    if kwargs:
                        raise TermError("a positional argument cannot follow keyword arguments", *pos)
                    arg_pos.append((len(args), pos))
                    args.append(value)
        return Call(str(name_tok), tuple(args), tuple(kwargs),
                    pos=(name_tok.line, name_tok.column), arg_pos=tuple(arg_pos))

    def arguments(self, children):
        return children

    @v_args(meta=True)
    def keyword(self, meta, children):
        key, value = children
        return ("kw", str(key), value, (key.line, key.column))

    @v_args(meta=True)
    def positional(self, meta, children):
        return ("pos", None, children[0], (meta.line, meta.column))

    def number(self, children):
        text = str(children[0])
        if any(c in text for c in ".eE"):
            return float(text)
        return int(text)

    def symbol(self, children):
        word = str(children[0])
        if word in ("true", "false"):
            return word == "true"
        return Sym(word)

    def list(self, children):
        return tuple(children)


def _end_position(text: str) -> tuple[int, int]:
    stripped = text.rstrip()
    return stripped.count("\n") + 1, len(stripped.rsplit("\n", 1)[-1]) + 1


def _expected(tokens) -> str:
    words = sorted({_TOKEN_WORDS.get(t, t) for t in tokens})
    return " or ".join(words) if words else "something else"


def parse_raw(text: str) -> Call:
    """Parse without checking signatures (positional arguments kept as written)."""
    if len(text) > MAX_TERM_TEXT:
        raise TermError(f"term text is {len(text)} characters; the limit is {MAX_TERM_TEXT}")
    check_nesting(text, "term")
    if not text.strip():
        raise TermError("empty term: expected a schedule such as 1f1b(p=4, m=8)", 1, 1)
    try:
        tree = _lark().parse(text)
    except UnexpectedToken as error:
        if error.token.type == "$END":
            line, col = _end_position(text)
            raise TermError(f"expected {_expected(error.expected)}, got end of input", line, col) from None
        raise TermError(f"expected {_expected(error.expected)}, got '{error.token}'", error.line, error.column) from None
    except UnexpectedCharacters as error:
        raise TermError(f"unexpected character {_character(text[error.pos_in_stream])}", error.line,
                        error.column) from None
    except UnexpectedEOF as error:
        line, col = _end_position(text)
        raise TermError(f"unexpected end of input, expected {_expected(error.expected)}", line, col) from None
    except UnexpectedInput as error:  # pragma: no cover - other Lark errors
        raise TermError(str(error).splitlines()[0], getattr(error, "line", None), getattr(error, "column", None)) from None
    try:
        result = _Build().transform(tree)
    except Exception as error:  # Lark wraps errors raised inside the transformer
        inner = getattr(error, "orig_exc", error)
        if isinstance(inner, TermError):
            raise inner from None
        raise
    if not isinstance(result, Call):
        got = f"the bare name '{result.name}'" if isinstance(result, Sym) else repr(result)
        raise TermError(f"expected a schedule term such as 1f1b(p=4, m=8), got {got}", 1, 1)
    return result


@lru_cache(maxsize=4096)
def parse(text: str) -> Call:
    """Parse and check a term; the result is canonical (arguments bound by name).

    Remembered by text (a `Call` is frozen): `mpipe plan` evaluates each term
    text on many layouts (725 texts, 2,950 parses in a 4-device MLLM search,
    where parsing was a fifth of the time).  A text that fails is not kept."""
    from mpipe_core.algebra.terms.signatures import check

    return check(parse_raw(text))


def _character(ch: str) -> str:
    """A character in a message: as typed if printable, else its escape ('\\x00')."""
    return f"'{ch}'" if ch.isprintable() else repr(ch)
