"""What each LLM chunk of a pipeline holds and costs.

A chunk holds `layers[c]` LLM layers (even split unless `partition`/`balanced`
said otherwise) and, once `balanced` folded the encoders into the chain,
`encoder_layers[c]` encoder layers that run inside the chunk's own F/B/W ops.
Folded encoder layers cost a share of the encoder's per-microbatch cost (so a
chunk's time can differ per microbatch when images per sample vary); a frozen
encoder's layers add forward time only.

`recompute` (the pipeline's per-chunk (full, selective) layer counts) makes a
chunk's backward redo those layers' forward first: their forward time is added
to the chunk's B (and fused BW), their activations shrink to what the mode
keeps from the forward on, and the rest is rebuilt when the backward starts.
A chunk's static memory is its layers', plus the embedding on the first chunk,
the head on the last and the encoder layers `balanced` folded into it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import WorkloadError
from .schedule import Pipeline
from .workload import Workload

KINDS = ("F", "B", "W", "BW")


def llm_layers(pipe: Pipeline, workload: Workload) -> list[int]:
    """LLM layers per chunk of `pipe`."""
    if pipe.layers is not None:
        return list(pipe.layers)
    return workload.llm.layers_per_chunk(pipe.chunks)


def encoder_chain(workload: Workload) -> list[tuple[int, int]]:
    """(encoder index, layer) of every encoder layer, in chain order."""
    return [(i, k) for i, e in enumerate(workload.encoders) for k in range(e.layers)]


@dataclass
class ChunkCosts:
    """Per chunk: the LLM layers' time of each kind, plus (folded encoders) a
    per-microbatch time and activation on top."""

    llm: dict[str, list[float]]  # kind -> per chunk (B and BW include any recompute)
    llm_activation: list[float]  # per chunk: what its forward keeps until the backward
    encoder: dict[str, list[list[float]]] | None = None  # kind -> chunk -> microbatch
    encoder_activation: list[list[float]] | None = None  # chunk -> microbatch
    static: list[float] | None = None  # per chunk: parameters, gradients, optimizer state
    # Recompute: per chunk, what the backward rebuilds (memory from its start) and
    # the LLM time without the recomputed forward (essential work, for the lower bound).
    recompute_activation: list[float] | None = None
    essential_llm: dict[str, list[float]] | None = None

    def duration(self, kind: str, chunk: int, mb: int) -> float:
        if self.encoder is None:
            return self.llm[kind][chunk]
        return self.llm[kind][chunk] + self.encoder[kind][chunk][mb]

    def essential(self, kind: str, chunk: int, mb: int) -> float:
        """`duration` less any recomputed forward (what the lower bound counts)."""
        llm = self.llm if self.essential_llm is None else self.essential_llm
        if self.encoder is None:
            return llm[kind][chunk]
        return llm[kind][chunk] + self.encoder[kind][chunk][mb]

    def activation(self, chunk: int, mb: int) -> float:
        if self.encoder_activation is None:
            return self.llm_activation[chunk]
        return self.llm_activation[chunk] + self.encoder_activation[chunk][mb]

    def per_microbatch(self, kind: str, chunk: int, microbatches: int) -> list[float]:
        return [self.duration(kind, chunk, m) for m in range(microbatches)]


def chunk_costs(pipe: Pipeline, workload: Workload) -> ChunkCosts:
    llm = workload.llm
    if pipe.layers is not None and llm.chunk_costs is not None:
        raise WorkloadError("partition needs per-layer LLM costs (this workload has measured chunk_costs)")
    # Per-layer costs (measured by `mpipe profile`) and embedding/head costs follow the split.
    table = llm.chunk_cost_table(pipe.chunks, pipe.layers)
    layers = llm_layers(pipe, workload)
    act = [k * llm.activation for k in layers]
    static = [k * llm.static_layer for k in layers]
    static[0] += llm.static_embed
    static[-1] += llm.static_head
    rebuilt = essential = None
    if pipe.recompute is not None:
        essential = {k: list(v) for k, v in table.items()}
        act, rebuilt, added = _recompute(pipe.recompute, layers, llm)
        for kind in ("B", "BW"):
            table[kind] = [t + r for t, r in zip(table[kind], added)]
    if pipe.encoder_layers is None:
        return ChunkCosts(table, act, static=static, recompute_activation=rebuilt, essential_llm=essential)
    M = pipe.microbatches
    chain = encoder_chain(workload)
    per_layer = []  # per encoder: kind -> per-microbatch cost of one of its layers
    for e in workload.encoders:
        kinds = {k: [c / e.layers for c in e.costs(k, M)] for k in ("F", "B", "W")}
        if not e.trainable:
            kinds["B"] = kinds["W"] = [0.0] * M
        kinds["act"] = [a / e.layers for a in e.activations(M)]
        per_layer.append(kinds)
    enc: dict[str, list[list[float]]] = {k: [] for k in ("F", "B", "W")}
    enc_act: list[list[float]] = []
    position = 0
    for count in pipe.encoder_layers:
        held = [0] * len(workload.encoders)
        for i, _ in chain[position:position + count]:
            held[i] += 1
        position += count
        for k in ("F", "B", "W"):
            enc[k].append([sum(n * per_layer[i][k][m] for i, n in enumerate(held)) for m in range(M)])
        enc_act.append([sum(n * per_layer[i]["act"][m] for i, n in enumerate(held)) for m in range(M)])
        static[len(enc_act) - 1] += sum(n * workload.encoders[i].static_of_copy(workload.encoders[i].trainable)
                                        / workload.encoders[i].layers for i, n in enumerate(held))
    enc["BW"] = [[b + w for b, w in zip(bs, ws)] for bs, ws in zip(enc["B"], enc["W"])]
    return ChunkCosts(table, act, enc, enc_act, static=static, recompute_activation=rebuilt, essential_llm=essential)


def _recompute(counts, layers: list[int], llm) -> tuple[list[float], list[float], list[float]]:
    """Per chunk: the activation its forward keeps, what its backward rebuilds,
    and the forward time the recompute adds, for (full, selective) layer counts
    (the first `full` layers fully, the next `selective` ones selectively)."""
    kept_full, kept_selective = llm.kept_activation("full"), llm.kept_activation("selective")
    full_f, selective_f = llm.recompute_f("full"), llm.recompute_f("selective") or 0.0
    kept, rebuilt, added = [], [], []
    first = 0  # the chunk's first layer in the whole LLM
    for c, ((full, selective), n) in enumerate(zip(counts, layers)):
        keeps = full * kept_full + selective * kept_selective + (n - full - selective) * llm.activation
        kept.append(keeps)
        rebuilt.append(max(0.0, n * llm.activation - keeps))
        if full_f is not None:
            forward = full * full_f
        elif llm.chunk_costs is not None:  # measured per chunk: its share of the chunk's F
            forward = llm.chunk_costs["F"][c] * full / n
        elif llm.layer_costs is not None:
            forward = sum(llm.layer_costs["F"][first:first + full])
        else:
            forward = full * llm.f
        added.append(forward + selective * selective_f)
        first += n
    return kept, rebuilt, added


def folds_encoders(pipelines) -> bool:
    return any(p.encoder_layers is not None for p in pipelines)
