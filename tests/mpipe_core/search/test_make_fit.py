"""`way_to_fit`: the fastest variant of a term that fits the device's memory, among sharding
a trained encoder's state and recomputing the encoders' ops; and the encoder layers
`balanced` folds into each device's chunks."""
from __future__ import annotations

from mpipe_core.algebra.combinators.partition import folded_encoder_layers
from mpipe_core.api import evaluate
from mpipe_core.search.make_fit import way_to_fit
from mpipe_core.search.plan_space import Layout, layout_document
from mpipe_core.simulation.chunks import encoder_chain
from mpipe_core.workloads.presets import preset_document

# The README's 512-die layout of InternVL-26B: a transpose there needs 129 GB of a 64 GB die.
DOC = layout_document(preset_document("internvl-26b"), Layout(2, 2, 4, 32, 1, True, 1), "cloudmatrix384")
TRANSPOSED = "transpose(zbv(p=4, m=16), mode=dynamic)"


def test_the_suggestion_fits_reproduces_and_is_the_fastest_that_fits():
    assert max(evaluate(TRANSPOSED, DOC).metrics.peak_memory) > 64
    fix = way_to_fit(TRANSPOSED, DOC)
    assert fix is not None and fix.peak_memory <= fix.capacity == 64.0
    again = evaluate(fix.term, fix.document)
    assert again.step.step_time_s == fix.step_time_s and max(again.metrics.peak_memory) == fix.peak_memory
    assert fix.workload_changes == ("encoder_shard gradients",) and fix.document["parallel"]["encoder_shard"] == \
        "gradients" and "encoder_shard" not in DOC["parallel"]  # the input is left as it was
    # Every other variant it weighs that fits is no faster.
    for shard in ("optimizer", "gradients"):
        doc = {**DOC, "parallel": {**DOC["parallel"], "encoder_shard": shard}}
        for mode in ("only", "yes"):
            term = f"transpose(recompute(zbv(p=4, m=16), encoders={mode}), mode=dynamic)"
            ev = evaluate(term, doc)
            if max(ev.metrics.peak_memory) <= 64:
                assert ev.step.step_time_s >= fix.step_time_s


def test_no_suggestion_where_the_capacity_is_unknown():
    assert way_to_fit("transpose(1f1b(p=4, m=4))", preset_document("vit-heavy-small")) is None


def test_balanced_folds_every_encoder_layer_into_the_first_devices():
    ev = evaluate("balanced(zbv(p=4, m=16))", DOC)
    folded = folded_encoder_layers(ev.schedule)
    assert folded is not None and len(folded) == 4 and folded[0] > 0
    assert sum(folded) == len(encoder_chain(ev.workload)) == 45  # InternViT-6B's 45 layers, all of them
    assert folded_encoder_layers(evaluate("zbv(p=4, m=16)", DOC).schedule) is None
