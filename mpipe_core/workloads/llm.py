"""The LLM of a workload: its layers and what each costs per microbatch (time per
kind, activation kept, static memory), split into the schedule's chunks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.fields import (MAX_LAYERS, check_cost_list, check_cost_spec, check_keys, integer, kept,
                                         number, parse_recompute)


@dataclass(frozen=True)
class LLM:
    layers: int | None  # None: one layer per chunk, whatever the term asks for
    f: float = 1.0
    b: float = 1.0
    w: float = 1.0
    activation: float = 1.0
    boundary_bytes: float = 0.0  # hidden state shipped between chunks per microbatch
    # Measured or calibrated cost per chunk and kind (overrides layers * f/b/w).
    chunk_costs: Mapping[str, tuple[float, ...]] | None = None
    # Measured cost per layer and kind (`mpipe profile`; overrides f/b/w), and the
    # embedding's / the norm+head+loss's cost, added to the first / last chunk.
    layer_costs: Mapping[str, tuple[float, ...]] | None = None
    embed: Mapping[str, float] | None = None
    head: Mapping[str, float] | None = None
    # Per recompute mode ("selective", "full"): the activation a layer keeps
    # and the forward time the recompute adds ({"activation": x, "f": t}); a
    # figure not given: selective keeps `activation` and adds no time, full
    # keeps what selective keeps and adds the layer's F.  A selective
    # recompute redoes part of the forward: it costs at most the full one.
    recompute: Mapping[str, Mapping[str, float]] | None = None
    # Static memory of one layer, of the embedding (first chunk), of the head (last chunk).
    static_layer: float = 0.0
    static_embed: float = 0.0
    static_head: float = 0.0
    # Activation the embedding (on the first chunk) and the head with the loss
    # (on the last) keep per microbatch until their backward: never recomputed.
    embed_activation: float = 0.0
    head_activation: float = 0.0
    # Per kind ("F", "B", "W"), each microbatch's time as a multiple of the
    # costs above, from its tokens in one drawn batch (workloads/batch_costs.py;
    # None: every microbatch costs the same).
    token_scale: Mapping[str, tuple[float, ...]] | None = None
    # Each microbatch's tokens over the reference length R of that batch
    # (`batch_costs.token_model`): its activation and the hidden state it ships
    # between chunks are those above times this (linear in tokens, as with
    # flash attention).  None: every microbatch holds the nominal tokens.
    token_ratio: tuple[float, ...] | None = None

    def kept_activation(self, mode: str) -> float:
        """What one layer keeps per microbatch until its backward under recompute `mode`."""
        return kept(self.activation, self.recompute, mode)

    def boundary_bytes_of(self, mb: int) -> float:
        """The hidden state microbatch `mb` ships between chunks (`token_ratio`)."""
        if self.token_ratio is None:
            return self.boundary_bytes
        return self.boundary_bytes * self.token_ratio[mb]

    def recompute_f(self, mode: str) -> float | None:
        """The forward time one layer's recompute adds under `mode`, if the workload says."""
        if self.recompute is None:
            return None
        return self.recompute.get(mode, {}).get("f")

    @property
    def has_static(self) -> bool:
        return bool(self.static_layer or self.static_embed or self.static_head)

    def layers_per_chunk(self, chunks: int) -> list[int]:
        """Layers split as evenly as possible, earlier chunks taking the remainder."""
        layers = chunks if self.layers is None else self.layers
        if layers < chunks:
            raise WorkloadError(
                f"the LLM has {layers} layers but the schedule needs {chunks} chunks "
                f"(each chunk needs at least one layer)"
            )
        base, extra = divmod(layers, chunks)
        return [base + (1 if c < extra else 0) for c in range(chunks)]

    def chunk_cost_table(self, chunks: int, layers: list[int] | tuple[int, ...] | None = None
                         ) -> dict[str, list[float]]:
        """Time of F, B, W, BW for every chunk; chunk c holds `layers[c]` layers
        (an even split when not given)."""
        if self.chunk_costs is not None:
            table = {k: list(v) for k, v in self.chunk_costs.items()}
            for kind in ("F", "B", "W"):
                if len(table.get(kind, ())) != chunks:
                    raise WorkloadError(
                        f"llm.chunk_costs.{kind} has {_entries(len(table.get(kind, ())))} "
                        f"but the schedule has {chunks} chunks"
                    )
        else:
            layers = list(layers) if layers is not None else self.layers_per_chunk(chunks)
            if self.layer_costs is not None:
                bounds = [sum(layers[:c]) for c in range(chunks + 1)]
                table = {k: [sum(self.layer_costs[k][bounds[c]:bounds[c + 1]]) for c in range(chunks)]
                         for k in ("F", "B", "W")}
            else:
                table = {
                    "F": [k * self.f for k in layers],
                    "B": [k * self.b for k in layers],
                    "W": [k * self.w for k in layers],
                }
            for part, chunk in ((self.embed, 0), (self.head, chunks - 1)):
                for kind, cost in (part or {}).items():
                    table[kind][chunk] += cost
        table["BW"] = [b + w for b, w in zip(table["B"], table["W"])]
        return table


def parse_llm_static(doc: Any, where: str = "llm.static") -> dict[str, float]:
    """llm.static: {"layer": per layer, "embed": the embedding's, "head": the head's} static memory
    (and the same shape for its split, llm.param_bytes and llm.grad_bytes)."""
    if doc is None:
        return {"layer": 0.0, "embed": 0.0, "head": 0.0}
    if not isinstance(doc, dict):
        raise WorkloadError(f'{where}: expected {{"layer": memory, "embed": memory, "head": memory}}')
    check_keys(doc, {"layer", "embed", "head"}, where)
    return {key: number(doc, key, where, 0.0) for key in ("layer", "embed", "head")}


def check_static_split(llm_doc: dict, static: dict[str, float]) -> None:
    """llm.param_bytes / llm.grad_bytes (optional, what `mpipe profile` writes): each part's
    static memory split into its parameters and its gradient (the rest is optimizer state),
    so a run's layout can shard the state (ZeRO-1) as the executor does.  Checked, not kept:
    the simulator itself prices the whole `static`."""
    split = {key: parse_llm_static(llm_doc[key], f"llm.{key}") if key in llm_doc else None for key in ("param_bytes", "grad_bytes")}
    for key, parts in split.items():
        if parts is None:
            continue
        for part, value in parts.items():
            if value > static[part]:
                raise WorkloadError(f"llm.{key}.{part} ({value:g}) is more than llm.static.{part} "
                                    f"({static[part]:g}): it is a part of it")
    if split["param_bytes"] and split["grad_bytes"]:
        for part in static:
            total = split["param_bytes"][part] + split["grad_bytes"][part]
            if total > static[part]:
                raise WorkloadError(f"llm.param_bytes.{part} + llm.grad_bytes.{part} ({total:g}) is more than "
                                    f"llm.static.{part} ({static[part]:g})")


def check_tp_sharded(llm_doc: dict, static: dict[str, float]) -> None:
    """llm.tp_sharded (optional, what `mpipe profile` writes for a model with a tensor-parallel
    plan): {"static", "param_bytes", "grad_bytes"}, each {"layer", "embed", "head"}: the part of
    each figure that tp shards.  Checked, not kept: a run's layout applies it
    (`executor.analysis.layout_memory`)."""
    doc = llm_doc.get("tp_sharded")
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise WorkloadError('llm.tp_sharded: expected {"static": {...}, "param_bytes": {...}, "grad_bytes": {...}}')
    check_keys(doc, {"static", "param_bytes", "grad_bytes"}, "llm.tp_sharded")
    for key, value in doc.items():
        whole = static if key == "static" else (parse_llm_static(llm_doc[key], f"llm.{key}") if key in llm_doc else None)
        parts = parse_llm_static(value, f"llm.tp_sharded.{key}")
        for part, share in parts.items():
            if whole is not None and share > whole[part]:
                raise WorkloadError(f"llm.tp_sharded.{key}.{part} ({share:g}) is more than llm.{key}.{part} "
                                    f"({whole[part]:g}): it is the part of it tp shards")


def parse_llm(llm_doc: Any) -> LLM:
    """The `llm` section: layers, per-layer (or per-chunk, per-layer measured) costs,
    the embedding and the head, activation, recompute and static memory."""
    if not isinstance(llm_doc, dict):
        raise WorkloadError("llm: expected an object")
    check_keys(llm_doc, {"layers", "f", "b", "w", "activation", "boundary_bytes", "chunk_costs", "layer_costs",
                          "embed", "head", "recompute", "static", "param_bytes", "grad_bytes", "tp_sharded"}, "llm")
    layers = llm_doc.get("layers")
    if layers is not None:
        layers = integer(layers, "llm.layers", 1, MAX_LAYERS)
    chunk_costs = llm_doc.get("chunk_costs")
    if chunk_costs is not None:
        if not isinstance(chunk_costs, dict) or not {"F", "B", "W"} <= set(chunk_costs):
            raise WorkloadError("llm.chunk_costs: expected {'F': [...], 'B': [...], 'W': [...]}")
        check_keys(chunk_costs, {"F", "B", "W"}, "llm.chunk_costs")
        chunk_costs = {k: check_cost_list(v, f"llm.chunk_costs.{k}") for k, v in chunk_costs.items()}
        if len({len(v) for v in chunk_costs.values()}) != 1:
            raise WorkloadError("llm.chunk_costs: F, B and W need one entry per chunk each")
    layer_costs = llm_doc.get("layer_costs")
    if layer_costs is not None:
        if not isinstance(layer_costs, dict) or set(layer_costs) != {"F", "B", "W"}:
            raise WorkloadError("llm.layer_costs: expected {'F': [...], 'B': [...], 'W': [...]}")
        checked = {}
        for k, v in layer_costs.items():
            if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                  for x in v):
                raise WorkloadError(f"llm.layer_costs.{k}: expected a list of numbers, one per layer")
            checked[k] = tuple(check_cost_spec(x, f"llm.layer_costs.{k}[{i}]") for i, x in enumerate(v))
        layer_costs = checked
        if layers is None or any(len(v) != layers for v in layer_costs.values()):
            raise WorkloadError(f"llm.layer_costs: need one entry per layer ({layers})")
    parts, part_activation = {}, {}
    for part in ("embed", "head"):
        spec = llm_doc.get(part)
        if spec is not None:
            if not isinstance(spec, dict) or not set(spec) <= {"F", "B", "W", "activation"}:
                raise WorkloadError(f"llm.{part}: expected {{'F': time, 'B': time, 'W': time, "
                                    f"'activation': memory}}")
            parts[part] = {k: number(spec, k, f"llm.{part}") for k in spec if k != "activation"}
            part_activation[part] = number(spec, "activation", f"llm.{part}", 0.0)
    activation = number(llm_doc, "activation", "llm", 1.0)
    static = parse_llm_static(llm_doc.get("static"))
    check_static_split(llm_doc, static)
    check_tp_sharded(llm_doc, static)
    llm = LLM(
        layers=layers,
        layer_costs=layer_costs,
        embed=parts.get("embed"),
        head=parts.get("head"),
        embed_activation=part_activation.get("embed", 0.0),
        head_activation=part_activation.get("head", 0.0),
        f=number(llm_doc, "f", "llm", 1.0),
        b=number(llm_doc, "b", "llm", 1.0),
        w=number(llm_doc, "w", "llm", 1.0),
        activation=activation,
        boundary_bytes=number(llm_doc, "boundary_bytes", "llm", 0.0),
        chunk_costs=chunk_costs,
        recompute=parse_recompute(llm_doc.get("recompute"), activation, "llm.recompute", "llm.activation"),
        static_layer=static["layer"], static_embed=static["embed"], static_head=static["head"],
    )
    return llm


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"
