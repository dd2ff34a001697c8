"""The term language: parsing, canonical printing, errors with positions."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpipe_core.algebra.terms import parse
from mpipe_core.api import evaluate
from mpipe_core.errors import TermError
from timeline_checks import timeline_problems

ISSUE_EXAMPLES = [
    "gpipe(p=4, m=8)", "1f1b(p=4, m=8)", "interleaved(p=4, m=8, v=2)", "looped_bfs(p=4, m=8, v=2)",
    "zb_h1(p=4, m=8)", "zb_h2(p=4, m=8)", "zbv(p=4, m=8)", "dualpipev(p=4, m=8)",
    "split_bw(1f1b(p=4, m=8))", "defer_w(split_bw(1f1b(p=4, m=8)))", "repeat(1f1b(p=2, m=4), 3)",
    "par(1f1b(p=2, m=4), gpipe(p=2, m=4))", "overlay(1f1b(p=4, m=4), mirror(1f1b(p=4, m=4)))",
]


@pytest.mark.parametrize("text", ISSUE_EXAMPLES)
def test_issue_examples_parse_evaluate_and_round_trip(text):
    term = parse(text)
    assert parse(str(term)) == term
    ev = evaluate(text)
    assert timeline_problems(ev) == []
    assert ev.summary()["ops"] == ev.schedule.num_ops > 0


def test_spellings_of_one_term_are_equal_and_print_canonically():
    a = parse("repeat(1f1b(p=2, m=4), 3)")
    b = parse("repeat( 1f1b(m=4, p=2) , n=3 )  # three steps")
    assert a == b
    assert str(a) == "repeat(1f1b(p=2, m=4), n=3)"
    # defaults are dropped, so interleaved's v=2 is implied
    assert str(parse("interleaved(p=4, m=8, v=2)")) == "interleaved(p=4, m=8)"
    assert str(parse("interleaved(p=4, m=8, v=3)")) == "interleaved(p=4, m=8, v=3)"
    assert str(parse("transpose(1f1b(p=4,m=4), mode=dynamic, shards=2)")) == \
        "transpose(1f1b(p=4, m=4), mode=dynamic, shards=2)"


@pytest.mark.parametrize("text, message", [
    ("1f1b(p=4, m=8", "1:14: expected ')' or ',', got end of input"),
    ("1f1b(p=4,, m=8)", "1:10: expected ')' or '[' or a name or a number, got ','"),
    ("1f1c(p=4, m=8)", "1:1: unknown schedule '1f1c'; did you mean '1f1b'?"),
    ("1f1b(p=4, mm=8)", "1:11: 1f1b has no argument 'mm'; did you mean 'm'? (usage 1f1b(p=, m=))"),
    ("1f1b(p=0, m=8)", "1:6: 1f1b: argument 'p' must be >= 1, got 0"),
    ("1f1b(p=4, m=-1)", "1:11: 1f1b: argument 'm' must be >= 1, got -1"),
    ("interleaved(p=4, m=8, v=1.5)", "1:23: interleaved: argument 'v' must be an integer, got 1.5"),
    ("1f1b(p=4)", "1:1: 1f1b is missing argument 'm' (usage 1f1b(p=, m=))"),
    ("split_bw(3)", "1:10: split_bw: argument 'term' must be a schedule term, got 3"),
    ("transpose(1f1b(p=4, m=4), mode=prefx)",
     "1:27: transpose: argument 'mode' must be one of prefix, dynamic, got 'prefx'; did you mean 'prefix'?"),
    ("1f1b(p=4, m=8, p=2)", "1:16: argument 'p' given twice"),
    ("1f1b(p=4, m=8)\n  $", "2:3: unexpected character '$'"),
    ("", "1:1: empty term: expected a schedule such as 1f1b(p=4, m=8)"),
    ("4", "1:1: expected a schedule term such as 1f1b(p=4, m=8), got 4"),
])
def test_bad_terms_name_line_column_and_what_was_expected(text, message):
    with pytest.raises(TermError) as info:
        parse(text)
    assert str(info.value) == message


@pytest.mark.parametrize("text, message", [
    ("overlay(1f1b(p=4, m=4), 1f1b(p=2, m=4))",
     "1:1: overlay: overlay needs schedules on the same number of devices (4 vs 2)"),
    ("defer_w(1f1b(p=4, m=4))", "1:1: defer_w: defer_w needs split B/W ops (write defer_w(split_bw(...)))"),
    ("transpose(1f1b(p=4, m=4))", "1:1: transpose: transpose needs a workload with encoders (this one has none)"),
])
def test_evaluation_errors_point_at_the_combinator(text, message):
    with pytest.raises(TermError) as info:
        evaluate(text)
    assert str(info.value) == message


def test_generator_rule_errors_point_at_the_argument():
    with pytest.raises(TermError) as info:
        evaluate("dualpipev(p=4, m=6)")
    assert info.value.line == 1 and info.value.column == 16  # the 'm' keyword
    assert "dualpipev needs m >= 2p" in info.value.detail


def test_size_limit_refuses_before_building(monkeypatch):
    from mpipe_core.errors import SizeLimitError

    with pytest.raises(SizeLimitError, match="over the limit of 1,000"):
        evaluate("1f1b(p=8, m=64)", max_ops=1000)
    monkeypatch.setenv("MPIPE_MAX_OPS", "100")
    with pytest.raises(SizeLimitError):
        evaluate("repeat(1f1b(p=4, m=8), 10)")


# ---------------------------------------------------------------- property: parse(print(t)) == t

GENERATORS = ["gpipe", "1f1b", "interleaved", "looped_bfs", "zb_h1", "zb_h2", "zbv", "dualpipev"]


@st.composite
def terms(draw, depth=3):
    if depth == 0 or draw(st.booleans()):
        name = draw(st.sampled_from(GENERATORS))
        p, m = draw(st.integers(1, 16)), draw(st.integers(1, 64))
        extra = f", v={draw(st.integers(1, 4))}" if name in ("interleaved", "looped_bfs") and draw(st.booleans()) else ""
        return f"{name}(p={p}, m={m}{extra})"
    kind = draw(st.sampled_from(["split_bw", "defer_w", "mirror", "repeat", "par", "overlay", "seq",
                                 "transpose", "encoder_stage", "recompute", "colocated", "encoder_batch",
                                 "disaggregate"]))
    inner = draw(terms(depth=depth - 1))
    if kind == "repeat":
        return f"repeat({inner}, {draw(st.integers(1, 5))})"
    if kind == "encoder_batch":
        k = draw(st.integers(1, 8))
        return draw(st.sampled_from([f"encoder_batch({inner}, {k})", f"encoder_batch({inner}, k={k})"]))
    if kind == "disaggregate":
        return f"disaggregate({inner}, encoder_devices={draw(st.integers(1, 4))})"
    if kind in ("par", "overlay", "seq"):
        return f"{kind}({inner}, {draw(terms(depth=depth - 1))})"
    if kind == "transpose":
        opts = draw(st.sampled_from(["", ", mode=dynamic", ", overflow=min", ", backward=owner, shards=3",
                                     ", mode=dynamic, memory_cap=2.5"]))
        return f"transpose({inner}{opts})"
    if kind == "recompute":
        opts = draw(st.sampled_from(["", ", mode=full", ", mode=selective", ", chunks=[0, 2]", ", layers=[1, 0, 3]",
                                     ", mode=selective, layers=[2]", ", chunks=none"]))
        return f"recompute({inner}{opts})"
    return f"{kind}({inner})"


@settings(max_examples=300, deadline=None)
@given(terms())
def test_parse_print_round_trip(text):
    term = parse(text)
    printed = str(term)
    assert parse(printed) == term
    assert str(parse(printed)) == printed
