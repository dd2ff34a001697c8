"""The law of the stack exports: two terms that simulate differently never
export to byte-identical launch configurations.  For each stack format, among
the terms it accepts, equal files (and notes) mean an equal timeline and
equal peak memory: an export never silently drops part of a term."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.formats.export import export_text
from mpipe_core.formats.launch_config import as_text, global_batch_of, launch_files
from mpipe_core.search.plan_space import Layout, layout_document
from mpipe_core.workloads.presets import preset_document

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LLAMA8 = {"llm": {"layers": 8}}
VIT8 = {"llm": {"layers": 8}, "encoders": [{"name": "vision", "f": 6.0, "b": 6.0, "w": 6.0, "layers": 4,
                                             "trainable": True}]}
WORKLOADS = {
    "megatron": layout_document(preset_document("llama2-7b"), Layout(2, 1, 4, 2, 1, True), "dgx-a100"),
    "mindspeed-mm": layout_document(preset_document("internvl-26b"), Layout(4, 1, 4, 2, 1, True, 1),
                                    "cloudmatrix384"),
    "torchtitan": VIT8,
    "megatron-layout": LLAMA8,
    "mindspeed-placement": VIT8,
}
GENERATORS = ("gpipe", "1f1b", "interleaved", "looped_bfs", "zb_h1", "zb_h2", "zbv", "dualpipev")
WRAPPERS = ("{}", "split_bw({})", "defer_w(split_bw({}))", "recompute({})", "recompute({}, mode=selective)",
            "balanced({})", "encoder_batch({}, 2)", "per_batch({})")


def exported(fmt: str, ev) -> str:
    """Everything the format hands over: its files (or text) and its notes."""
    if fmt in ("megatron", "mindspeed-mm", "torchtitan"):
        files = launch_files(ev, global_batch_of(ev), fmt)
        if fmt == "torchtitan":
            from mpipe_core.formats.torchtitan import torchtitan_files

            files = {**files, "notes": "\n".join(torchtitan_files(ev)[1])}
        # torchtitan's TOML echoes the term in a comment: not what makes two launches differ
        return "\n".join(line for line in as_text(files).splitlines() if not line.startswith("# Mpipe: "))
    text, notes = export_text(ev, fmt)
    return text + "\n".join(notes)


def simulated(ev) -> tuple:
    return ev.timeline_rows(), list(ev.metrics.peak_memory)


@st.composite
def term_pairs(draw):
    """Two terms on the same p and m (the pairs most likely to collide)."""
    p = draw(st.sampled_from((2, 4)))
    m = draw(st.sampled_from((2 * p, 4 * p)))

    def one():
        gen = draw(st.sampled_from(GENERATORS))
        return draw(st.sampled_from(WRAPPERS)).format(f"{gen}(p={p}, m={m})")

    return one(), one()


def _evaluate_or_none(term: str, workload):
    try:
        return evaluate(term, workload)
    except MpipeError:
        return None


def _export_or_none(fmt: str, ev):
    try:
        return exported(fmt, ev)
    except MpipeError:
        return None


@pytest.mark.parametrize("fmt", sorted(WORKLOADS))
@SETTINGS
@given(pair=term_pairs())
def test_terms_that_simulate_differently_never_export_the_same(fmt, pair):
    evs = [_evaluate_or_none(term, WORKLOADS[fmt]) for term in pair]
    if None in evs:
        return
    texts = [_export_or_none(fmt, ev) for ev in evs]
    if None in texts or texts[0] != texts[1]:
        return
    assert simulated(evs[0]) == simulated(evs[1]), f"{pair[0]} and {pair[1]} export the same {fmt} files"


@pytest.mark.parametrize("fmt", ["mindspeed-mm", "megatron-layout", "mindspeed-placement", "megatron"])
def test_the_issue_s_three_schedules_are_one_launch_and_two_refusals(fmt):
    """1f1b, gpipe and zb_h2 gave byte-identical mindspeed-mm files: only 1f1b is what the stack runs."""
    workload = WORKLOADS[fmt]
    assert exported(fmt, evaluate("1f1b(p=4, m=16)", workload))
    for generator in ("gpipe", "zb_h2"):
        with pytest.raises(MpipeError, match=f"^--format {fmt} cannot express {generator}: "):
            exported(fmt, evaluate(f"{generator}(p=4, m=16)", workload))
