"""The core workload that describes an own model's structure, and the checks
that a schedule fits a model (before anything is launched)."""
from __future__ import annotations

from typing import Any

from .protocol import ModelError, PipelineModel, encoder_trainable
from .tower import check_tower, tower_size

ENCODER_NAME = "vision"  # the one encoder's name in workloads of own models


def model_workload(model: PipelineModel, microbatches: int = 1) -> dict[str, Any]:
    """Nominal costs (one LLM layer's F = 1, encoder F = 1 per image) with the
    model's exact structure: layers, encoder, trainable or frozen, images."""
    doc: dict[str, Any] = {"name": f"model:{model.name}", "llm": {"layers": len(model.layers)},
                           "encoders": []}
    if model.encoder is not None:
        counts = set(model.image_counts(max(1, microbatches)))
        if len(counts) != 1:
            raise ModelError(f"model '{model.name}': images per microbatch vary ({sorted(counts)}); "
                             "give its workload with --workload")
        n = counts.pop()
        doc["encoders"].append({"name": ENCODER_NAME, "f": 1.0, "b": 1.0, "w": 1.0,
                                "layers": tower_size(model),  # (what `balanced` may fold, `models.tower`)
                                "trainable": encoder_trainable(model),
                                "images": {"min": n, "max": n, "seed": 0}})
    return doc


def check_fits(model: PipelineModel, workload, chunks: int, microbatches: int,
               split: tuple[int, ...] | None = None, folded: tuple[int, ...] | None = None) -> None:
    """Refuse a model whose parts do not fit the evaluated schedule (`split`: the
    layers per chunk the schedule states, `partition`/`balanced`; `folded`: the
    encoder layers per chunk `balanced` folded into the chain)."""
    if len(model.layers) < chunks and folded is None:
        raise ModelError(f"model '{model.name}' has {len(model.layers)} layers but the schedule needs "
                         f"{chunks} chunks (each chunk needs at least one layer)")
    if split is not None and sum(split) != len(model.layers):
        raise ModelError(f"model '{model.name}' has {len(model.layers)} layers but the schedule splits "
                         f"the LLM as {list(split)} ({sum(split)} layers)")
    encoders = list(workload.encoders)
    if len(encoders) > 1:
        raise ModelError(f"the executor runs one encoder; the workload has {[e.name for e in encoders]}")
    if (model.encoder is None) != (not encoders):
        have = "an encoder" if model.encoder is not None else "no encoder"
        want = f"encoder '{encoders[0].name}'" if encoders else "no encoder"
        raise ModelError(f"model '{model.name}' has {have} but the schedule's workload has {want}")
    if encoders:
        enc = encoders[0]
        if enc.trainable != encoder_trainable(model):
            state = "trainable" if encoder_trainable(model) else "frozen"
            raise ModelError(f"model '{model.name}' has a {state} encoder but the workload's "
                             f"'{enc.name}' is {'trainable' if enc.trainable else 'frozen'}")
        if enc.images is not None and enc.image_counts(microbatches) != model.image_counts(microbatches):
            raise ModelError(f"model '{model.name}' draws {model.image_counts(microbatches)} images per "
                             f"microbatch but the workload has {enc.image_counts(microbatches)}")
    check_tower(model, folded)


def evaluate_for_model(term: str, model: PipelineModel, workload=None):
    """The term evaluated on `workload` (a profiled one, say) or on the model's
    structural workload, refused if the model's parts do not fit it."""
    from mpipe_core.api import evaluate
    from mpipe_core.workloads.workload import load_workload

    wl = load_workload(workload if workload is not None else model_workload(model))
    ev = evaluate(term, wl)
    schedule = ev.schedule
    microbatches = max(p.microbatches for p in schedule.pipelines)
    one = schedule.pipelines[0] if len(schedule.pipelines) == 1 else None
    check_fits(model, ev.workload, max(p.chunks for p in schedule.pipelines), microbatches,
               one.layers if one else None, one.encoder_layers if one else None)
    return ev
