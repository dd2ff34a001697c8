"""What each LLM chunk of a pipeline holds and costs.

A chunk holds `layers[c]` LLM layers (even split unless `partition`/`balanced`
said otherwise) and, once `balanced` folded the encoders into the chain,
`encoder_layers[c]` encoder layers that run inside the chunk's own F/B/W ops.
Folded encoder layers cost a share of the encoder's per-microbatch cost (so a
chunk's time can differ per microbatch when images per sample vary); a frozen
encoder's layers add forward time only.
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

    llm: dict[str, list[float]]  # kind -> per chunk
    llm_activation: list[float]  # per chunk
    encoder: dict[str, list[list[float]]] | None = None  # kind -> chunk -> microbatch
    encoder_activation: list[list[float]] | None = None  # chunk -> microbatch

    def duration(self, kind: str, chunk: int, mb: int) -> float:
        if self.encoder is None:
            return self.llm[kind][chunk]
        return self.llm[kind][chunk] + self.encoder[kind][chunk][mb]

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
    act = [k * llm.activation for k in llm_layers(pipe, workload)]
    if pipe.encoder_layers is None:
        return ChunkCosts(table, act)
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
    enc["BW"] = [[b + w for b, w in zip(bs, ws)] for bs, ws in zip(enc["B"], enc["W"])]
    return ChunkCosts(table, act, enc, enc_act)


def folds_encoders(pipelines) -> bool:
    return any(p.encoder_layers is not None for p in pipelines)
