"""The guided term builder: pick a generator and its arguments, wrap it in
combinators, and get the same text a user could type.

Widgets come from the core's signatures (`mpipe_core.algebra.terms.signatures`), so a
new generator or combinator shows up here without touching this file; the text
is printed back canonically by the core's parser.
"""
from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from app.formatting import plain
from mpipe_core.algebra.terms import parse
from mpipe_core.algebra.terms.signatures import Param, Signature, signatures
from mpipe_core.errors import MpipeError

GENERATOR_DEFAULTS = {"p": 4, "m": 4, "v": 2}
SECOND_TERM = {"the same term": "{t}", "its mirror": "mirror({t})"}


def _value_text(param: Param, value: Any) -> str | None:
    """The argument as term text, or None to leave it at its default."""
    if param.type == "bool":
        text = "true" if value else "false"
    elif param.type == "float" and param.nullable:
        text = str(value).strip() or "none"
    else:
        text = str(value).strip()
    default = param.default
    if not param.required:
        if default is None and text == "none":
            return None
        if isinstance(default, bool) and text == ("true" if default else "false"):
            return None
        if not isinstance(default, bool) and str(default) == text:
            return None
    return text


def _param_widget(param: Param, key: str, fallback: Any = None) -> Any:
    label = param.name + (f" — {param.help}" if param.help else "")
    if param.type == "int":
        start = fallback if param.required else param.default
        return st.number_input(label, min_value=int(param.minimum or 0), value=int(start or 1), step=1,
                               key=key)
    if param.type == "float":
        if param.nullable:
            return st.text_input(label, value="none", key=key, help="a number, or none")
        return st.number_input(label, min_value=float(param.minimum or 0.0),
                               value=float(param.default if not param.required else 1.0), key=key)
    if param.type == "choice":
        return st.selectbox(label, param.choices, index=param.choices.index(param.default), key=key)
    if param.type == "bool":
        return st.checkbox(label, value=bool(param.default), key=key)
    # Any other kind of argument (e.g. a list of names): typed as term text.
    start = "" if param.required else ("none" if param.default is None else str(param.default))
    return st.text_input(label, value=start, key=key, help="written into the term as typed")


def _call(sig: Signature, terms: list[str], values: dict[str, Any]) -> str:
    parts = list(terms)
    for p in sig.params:
        if p.type == "term":
            continue
        text = _value_text(p, values[p.name])
        if text is not None:
            parts.append(f"{p.name}={text}")
    return f"{sig.name}({', '.join(parts)})"


def guided_builder(on_use: Callable[[str], None], key: str = "builder") -> None:
    """Draw the builder; `on_use(text)` is called (as a button callback) with the term."""
    table = signatures()
    generators = [n for n, s in table.items() if s.kind == "generator"]
    combinators = [n for n, s in table.items() if s.kind == "combinator"]

    gen = st.selectbox("Generator", generators, key=f"{key}.generator",
                       index=generators.index("1f1b") if "1f1b" in generators else 0,
                       format_func=lambda n: f"{n} — {table[n].doc}")
    sig = table[gen]
    cols = st.columns(max(1, len(sig.params)))
    values = {}
    for col, p in zip(cols, sig.params):
        with col:
            values[p.name] = _param_widget(p, f"{key}.{gen}.{p.name}", GENERATOR_DEFAULTS.get(p.name, 1))
    text = _call(sig, [], values)

    wrappers = st.multiselect("Wrap it in (innermost first)", combinators, key=f"{key}.wrappers",
                              format_func=lambda n: f"{n} — {table[n].doc}")
    for i, name in enumerate(wrappers):
        csig = table[name]
        terms = [p for p in csig.params if p.type == "term"]
        others = [p for p in csig.params if p.type != "term"]
        with st.container(border=True):
            st.markdown(f"**{name}** — {csig.doc}")
            inner = [text]
            if len(terms) == 2:
                second = st.radio(f"{terms[1].name}", list(SECOND_TERM), horizontal=True,
                                  key=f"{key}.{i}.{name}.second")
                inner.append(SECOND_TERM[second].format(t=text))
            vals = {}
            if others:
                ocols = st.columns(len(others))
                for col, p in zip(ocols, others):
                    with col:
                        vals[p.name] = _param_widget(p, f"{key}.{i}.{name}.{p.name}", 2)
            text = _call(csig, inner, vals)

    try:
        canonical = str(parse(text))
    except MpipeError as error:
        st.error(plain(f"The builder's term does not check: {error.message}"))
        st.code(text, language=None)
        return
    st.code(canonical, language=None)
    st.button("Use this term", key=f"{key}.use", on_click=on_use, args=(canonical,), type="primary")
