"""Parameters several parts of a model use, and the ranks that must agree on them.

A plug-in may use one parameter in several parts: the encoder and the
embedding (a shared projection), two decoder layers, the embedding and the LM
head (tied weights).  Trained alone, such a parameter gets the sum of the
gradients of all its uses and one optimizer update per step.  Pipelined, its
uses may run on different ranks (each holding a copy), and on one rank in
different chunks or in split backward parts (B, then W).  What keeps it exact:

* every use accumulates into the rank's one ``.grad`` (`autograd_split` adds,
  never overwrites), and a rank trains each parameter once however many of its
  chunks use it;
* at the end of the step, before the optimizer, the ranks *holding* it (every
  rank that runs one of its parts, encoder replicas included) sum their
  gradients with one all-reduce per group of ranks (a rank without a gradient
  adds zeros; none with one leaves it None on all, as training alone would);
* the encoder's own broadcast and all-reduce (`BCAST`, `AR` under
  `transpose`) leave shared parameters out, so nothing is counted twice or
  overwritten.

Every holder then applies the same update to the same value, so every copy
ends the step identical.  The summation order differs from the unpipelined
run's only as the order of microbatches and ranks does, which the gradient
check's rule (`reference`) allows.  This exchange is not an op of the
schedule: the simulator does not cost it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .chunks import model_chunks
from .protocol import PipelineModel, model_parts, parameter_names


@dataclass(frozen=True)
class SharedParameter:
    name: str  # its name in root
    parts: tuple[str, ...]  # the parts using it (encoder, embedding, layers[i], head)
    ranks: tuple[int, ...]  # the ranks holding one of those parts


def parameter_uses(model: PipelineModel) -> dict[int, tuple[str, list[str]]]:
    """id(trainable parameter) -> (its name, the parts using it), for parameters in
    two or more parts."""
    names = parameter_names(model)
    uses: dict[int, tuple[str, list[str]]] = {}
    for part, module in model_parts(model):
        for p in module.parameters():  # each parameter once per part
            if p.requires_grad:
                uses.setdefault(id(p), (names[id(p)], []))[1].append(part)
    return {k: v for k, v in uses.items() if len(v[1]) > 1}


def part_ranks(model: PipelineModel, plan) -> dict[str, set[int]]:
    """Which ranks hold each part under `plan` (an `ExecutionPlan`)."""
    chunks = model_chunks(model, plan.chunks, plan.layers, plan.encoder_layers)
    out: dict[str, set[int]] = {"head": {plan.chunk_device[-1]}}
    for chunk in chunks:
        device = plan.chunk_device[chunk.index]
        for i in chunk.layers:
            out[f"layers[{i}]"] = {device}
        if chunk.embeds:
            out["embedding"] = {device}
        if chunk.tower:  # a folded tower: every rank holding some of its layers
            out.setdefault("encoder", set()).add(device)
    if model.encoder is not None and plan.encoder_layers is None:
        out["encoder"] = {r.device for r in plan.ranks if plan.holds_encoder(r.device)}
    return out


def shared_parameters(model: PipelineModel, plan) -> list[SharedParameter]:
    """Every parameter used by several parts, with its holders, sorted by name (every
    rank computes the same list, so collectives are posted in the same order)."""
    holders = part_ranks(model, plan)
    out = []
    for name, parts in parameter_uses(model).values():
        ranks = sorted(set().union(*(holders[p] for p in parts)))
        out.append(SharedParameter(name, tuple(parts), tuple(ranks)))
    return sorted(out, key=lambda s: s.name)


def sync_groups(shared: list[SharedParameter]) -> list[tuple[int, ...]]:
    """The rank groups whose gradients must be summed (more than one rank), in a fixed order."""
    return sorted({s.ranks for s in shared if len(s.ranks) > 1})
