"""What each LLM chunk of a pipeline holds and costs.

A chunk holds `layers[c]` LLM layers (even split unless `partition`/`balanced`
said otherwise) and, once `balanced` folded the encoders into the chain,
`encoder_layers[c]` encoder layers that run inside the chunk's own F/B/W ops.
Folded encoder layers cost a share of the encoder's per-microbatch cost (so a
chunk's time can differ per microbatch when images per sample vary); a frozen
encoder's layers add forward time only and keep no activation for a backward.

`recompute` (the pipeline's per-chunk (full, selective) layer counts) makes a
chunk's backward redo those layers' forward first: their forward time is added
to the chunk's B (and fused BW), their activations shrink to what the mode
keeps from the forward on, and the backward rebuilds the rest: one layer at a
time in a fused BW (each layer is recomputed as its backward reaches it, as
Megatron's checkpointed layers are), all of them in a split B (its W needs
them), held from the backward's start until its last part ends.  A fused BW
runs the backward of what follows the recomputed layers first (the chunk's
other LLM layers, the head), freeing it as it goes, so what it rebuilds is
charged only beyond what that part frees.
The embedding (first chunk) and the head with the loss (last chunk) keep
their own activation per microbatch and are never recomputed.
A chunk's static memory is its layers', plus the embedding on the first chunk,
the head on the last and the encoder layers `balanced` folded into it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from mpipe_core.errors import WorkloadError
from mpipe_core.ir.schedule import Pipeline
from mpipe_core.workloads.workload import Workload

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
    # Recompute: what the backward rebuilds (LLM per chunk; folded encoder
    # layers per chunk and microbatch): all recomputed layers' for a split B,
    # the largest one layer's for a fused BW; and the times without the
    # recomputed forward (essential work, for the lower bound).
    recompute_activation: list[float] | None = None
    encoder_rebuilt: list[list[float]] | None = None
    recompute_activation_fused: list[float] | None = None
    encoder_rebuilt_fused: list[list[float]] | None = None
    essential_llm: dict[str, list[float]] | None = None
    essential_encoder: dict[str, list[list[float]]] | None = None
    # Folded frozen encoder layers: what their forward holds while it runs
    # (chunk -> microbatch), freed when the chunk's forward ends.
    encoder_transient: list[list[float]] | None = None
    # A drawn batch (`LLM.token_ratio`): per microbatch, the factor on the LLM
    # part of its activations (`llm_activation` and what a recompute rebuilds).
    token_ratio: list[float] | None = None

    def duration(self, kind: str, chunk: int, mb: int) -> float:
        if self.encoder is None:
            return self.llm[kind][chunk]
        return self.llm[kind][chunk] + self.encoder[kind][chunk][mb]

    def essential(self, kind: str, chunk: int, mb: int) -> float:
        """`duration` less any recomputed forward (what the lower bound counts)."""
        llm = self.llm if self.essential_llm is None else self.essential_llm
        if self.encoder is None:
            return llm[kind][chunk]
        enc = self.encoder if self.essential_encoder is None else self.essential_encoder
        return llm[kind][chunk] + enc[kind][chunk][mb]

    def activation(self, chunk: int, mb: int) -> float:
        llm = self.llm_activation[chunk]
        if self.token_ratio is not None:
            llm = llm * self.token_ratio[mb]
        if self.encoder_activation is None:
            return llm
        return llm + self.encoder_activation[chunk][mb]

    def per_microbatch(self, kind: str, chunk: int, microbatches: int) -> list[float]:
        return [self.duration(kind, chunk, m) for m in range(microbatches)]


def chain_layers(pipe: Pipeline, workload: Workload) -> list[int]:
    """Layers per chunk in chain order: folded encoder layers, then LLM layers
    (what `recompute`'s counts refer to)."""
    encoder = pipe.encoder_layers or (0,) * pipe.chunks
    return [e + n for e, n in zip(encoder, llm_layers(pipe, workload))]


def split_recompute(pipe: Pipeline) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The pipeline's per-chunk (full, selective) counts over the chain, as
    (encoder part, LLM part) counts per chunk: the chunk's first `full`
    layers are fully recomputed, the next `selective` ones selectively, and
    folded encoder layers come first."""
    counts = pipe.recompute or ((0, 0),) * pipe.chunks
    encoder = pipe.encoder_layers or (0,) * pipe.chunks
    enc_part, llm_part = [], []
    for (full, selective), e in zip(counts, encoder):
        end = full + selective
        enc_full = min(full, e)
        enc_part.append((enc_full, min(end, e) - enc_full))
        llm_full = max(0, full - e)
        llm_part.append((llm_full, max(0, end - e) - llm_full))
    return enc_part, llm_part


def chunk_costs(pipe: Pipeline, workload: Workload) -> ChunkCosts:
    """What each chunk of `pipe` costs and holds on `workload` (never modify the
    answer: the last few are kept, as the simulator, the memory model and a
    planner trying plans on one batch's costs ask for the same ones again)."""
    key = (pipe, id(workload))
    with _KEPT_LOCK:
        hit = _KEPT.get(key)
    if hit is not None and hit[0] is workload:
        return hit[1]
    costs = _chunk_costs(pipe, workload)
    with _KEPT_LOCK:
        _KEPT[key] = (workload, costs)  # (holding the workload keeps its id from being reused)
        while len(_KEPT) > 32:
            _KEPT.popitem(last=False)
    return costs


_KEPT: OrderedDict = OrderedDict()
_KEPT_LOCK = threading.Lock()


def _chunk_costs(pipe: Pipeline, workload: Workload) -> ChunkCosts:
    llm = workload.llm
    if pipe.layers is not None and llm.chunk_costs is not None:
        raise WorkloadError("partition needs per-layer LLM costs (this workload has measured chunk_costs)")
    # Per-layer costs (measured by `mpipe profile`) and embedding/head costs follow the split.
    table = llm.chunk_cost_table(pipe.chunks, pipe.layers)
    layers = llm_layers(pipe, workload)
    act = [k * llm.activation for k in layers]
    head = [0.0] * len(layers)
    head[-1] = llm.head_activation
    static = [k * llm.static_layer for k in layers]
    static[0] += llm.static_embed
    static[-1] += llm.static_head
    rebuilt = rebuilt_fused = essential = None
    enc_counts = None
    if pipe.recompute is not None:
        enc_counts, llm_counts = split_recompute(pipe)
        essential = {k: list(v) for k, v in table.items()}
        act, rebuilt, rebuilt_fused, added = _recompute(llm_counts, layers, llm, head)
        for kind in ("B", "BW"):
            table[kind] = [t + r for t, r in zip(table[kind], added)]
    act = [a + h for a, h in zip(act, head)]
    act[0] += llm.embed_activation
    if pipe.encoder_layers is None:
        costs = ChunkCosts(table, act, static=static, recompute_activation=rebuilt,
                           recompute_activation_fused=rebuilt_fused, essential_llm=essential)
        return _token_scaled(costs, llm, pipe.microbatches)
    M = pipe.microbatches
    chain = encoder_chain(workload)
    recomputes = enc_counts is not None
    per_layer = []  # per encoder: what one of its layers costs and keeps, per microbatch
    for e in workload.encoders:
        kinds = {k: [c / e.layers for c in e.costs(k, M)] for k in ("F", "B", "W")}
        kinds["none"] = [a / e.layers for a in e.activations(M)]
        kinds["transient"] = [0.0] * M
        if not e.trainable:
            # No gradient flows through a frozen tower at the head of the chain
            # (it runs under no_grad): its layers keep nothing for a backward,
            # and one layer's working set is live while the chunk's forward
            # runs them, as in a frozen encoder's own op (`memory.py`).
            kinds["transient"] = e.no_grad_working_set(M)
            kinds["B"] = kinds["W"] = kinds["none"] = [0.0] * M
        for mode in ("full", "selective") if recomputes else ():
            # A frozen encoder has no backward to recompute for.
            kinds[mode] = [a / e.layers for a in e.activations(M, mode)] if e.trainable else kinds["none"]
            redo = e.recompute_costs(mode, M) if e.trainable else [0.0] * M
            kinds["redo " + mode] = [c / e.layers for c in redo]
        per_layer.append(kinds)
    enc: dict[str, list[list[float]]] = {k: [] for k in ("F", "B", "W")}
    enc_act: list[list[float]] = []
    enc_transient: list[list[float]] = []
    enc_rebuilt: list[list[float]] = []
    enc_rebuilt_fused: list[list[float]] = []
    enc_redo: list[list[float]] = []
    position = 0
    for c, count in enumerate(pipe.encoder_layers):
        layers_here = chain[position:position + count]
        position += count
        held = [0] * len(workload.encoders)
        for i, _ in layers_here:
            held[i] += 1
        for k in ("F", "B", "W"):
            enc[k].append([sum(n * per_layer[i][k][m] for i, n in enumerate(held)) for m in range(M)])
        whole = [sum(n * per_layer[i]["none"][m] for i, n in enumerate(held)) for m in range(M)]
        # (layers run one after another: the largest one's working set, not their sum)
        enc_transient.append([max((per_layer[i]["transient"][m] for i, n in enumerate(held) if n), default=0.0)
                              for m in range(M)])
        static[c] += sum(n * workload.encoders[i].static_of_copy(workload.encoders[i].trainable)
                         / workload.encoders[i].layers for i, n in enumerate(held))
        full, selective = enc_counts[c] if recomputes else (0, 0)
        if full == selective == 0:
            enc_act.append(whole)
            if recomputes:
                enc_rebuilt.append([0.0] * M)
                enc_rebuilt_fused.append([0.0] * M)
                enc_redo.append([0.0] * M)
            continue
        # the chunk's first `full` layers fully, the next `selective` ones selectively
        modes = [(i, mode) for (i, _), mode in zip(layers_here, ["full"] * full + ["selective"] * selective)]
        kept = [w - sum(per_layer[i]["none"][m] - per_layer[i][mode][m] for i, mode in modes) for m, w in
                enumerate(whole)]
        enc_act.append(kept)
        enc_rebuilt.append([max(0.0, w - k) for w, k in zip(whole, kept)])
        enc_rebuilt_fused.append([max(per_layer[i]["none"][m] - per_layer[i][mode][m] for i, mode in modes)
                                  for m in range(M)])
        enc_redo.append([sum(per_layer[i]["redo " + mode][m] for i, mode in modes) for m in range(M)])
    essential_enc = None
    if recomputes:
        essential_enc = {k: [list(row) for row in v] for k, v in enc.items()}
        essential_enc["BW"] = [[b + w for b, w in zip(bs, ws)] for bs, ws in zip(enc["B"], enc["W"])]
        enc["B"] = [[b + r for b, r in zip(bs, rs)] for bs, rs in zip(enc["B"], enc_redo)]
    enc["BW"] = [[b + w for b, w in zip(bs, ws)] for bs, ws in zip(enc["B"], enc["W"])]
    costs = ChunkCosts(table, act, enc, enc_act, static=static, recompute_activation=rebuilt,
                       recompute_activation_fused=rebuilt_fused,
                       encoder_rebuilt=enc_rebuilt if recomputes else None,
                       encoder_rebuilt_fused=enc_rebuilt_fused if recomputes else None,
                       essential_llm=essential, essential_encoder=essential_enc,
                       encoder_transient=enc_transient if any(map(any, enc_transient)) else None)
    return _token_scaled(costs, llm, M)


def _recompute(counts, layers: list[int], llm, head: list[float]
               ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per chunk: the activation its layers' forward keeps, what a split backward
    rebuilds (every recomputed layer), what a fused one adds (one layer's
    rebuild beyond what the backward of the layers after it and the head,
    `head` per chunk, has freed by then), and the forward time the recompute
    adds, for (full, selective) layer counts (the first `full` layers fully,
    the next `selective` ones selectively).  A layer's full recompute is its
    forward (or what the workload says); a selective one costs what the
    workload says, at most the full one."""
    kept_full, kept_selective = llm.kept_activation("full"), llm.kept_activation("selective")
    full_f, selective_f = llm.recompute_f("full"), llm.recompute_f("selective") or 0.0
    kept, rebuilt, fused, added = [], [], [], []
    first = 0  # the chunk's first layer in the whole LLM
    for c, ((full, selective), n) in enumerate(zip(counts, layers)):
        keeps = full * kept_full + selective * kept_selective + (n - full - selective) * llm.activation
        kept.append(keeps)
        rebuilt.append(max(0.0, n * llm.activation - keeps))
        # A fused BW reaches the last fully (selectively) recomputed layer once the
        # layers after it and the head are done, their activations freed.
        after_selective = head[c] + (n - full - selective) * llm.activation
        after_full = after_selective + selective * kept_selective
        fused.append(max(llm.activation - kept_full - after_full if full else 0.0,
                         llm.activation - kept_selective - after_selective if selective else 0.0, 0.0))
        if full_f is not None:
            forward = [full_f] * (full + selective)
        elif llm.chunk_costs is not None:  # measured per chunk: each layer's share of the chunk's F
            forward = [llm.chunk_costs["F"][c] / n] * (full + selective)
        elif llm.layer_costs is not None:
            forward = list(llm.layer_costs["F"][first:first + full + selective])
        else:
            forward = [llm.f] * (full + selective)
        added.append(sum(forward[:full]) + sum(min(selective_f, f) for f in forward[full:]))
        first += n
    return kept, rebuilt, fused, added


def folds_encoders(pipelines) -> bool:
    return any(p.encoder_layers is not None for p in pipelines)


def _token_scaled(costs: ChunkCosts, llm, microbatches: int) -> ChunkCosts:
    """The chunk costs of a drawn batch whose microbatches hold different
    token counts (`LLM.token_scale`): microbatch m's LLM time of each kind is
    the chunk's time times scale[kind][m], carried as the per-microbatch part
    (`encoder`, which the simulator, its fast paths and the lower bound read
    per microbatch); its LLM activation is the chunk's times token_ratio[m]
    (`ChunkCosts.token_ratio`, read by `memory.py`; docs/data.md)."""
    scale = llm.token_scale
    if llm.token_ratio is not None:
        costs.token_ratio = list(llm.token_ratio)
    if scale is None:
        return costs
    M = microbatches

    def extra(table: dict[str, list[float]]) -> dict[str, list[list[float]]]:
        out = {k: [[t * (scale[k][m] - 1.0) for m in range(M)] for t in table[k]] for k in ("F", "B", "W")}
        out["BW"] = [[b + w for b, w in zip(bs, ws)] for bs, ws in zip(out["B"], out["W"])]
        return out

    def add(base, more):
        if base is None:
            return more
        return {k: [[e + x for e, x in zip(es, xs)] for es, xs in zip(base[k], more[k])] for k in more}

    if costs.essential_llm is not None:  # recompute-free times scale the same way
        base = costs.essential_encoder if costs.essential_encoder is not None else costs.encoder
        costs.essential_encoder = add(base, extra(costs.essential_llm))
    if costs.encoder is None:
        costs.encoder_activation = [[0.0] * M for _ in costs.llm["F"]]
    costs.encoder = add(costs.encoder, extra(costs.llm))
    return costs
