"""Workloads: what a schedule's ops cost.

A workload is the model and its costs, independent of any schedule (Halide's
"algorithm" to the term's "schedule").  Two forms are accepted:

* explicit: ``{"llm": {"layers", "f", "b", "w", "activation", "recompute", "static"},
  "encoders": [...], "link": {"latency", "bandwidth"},
  "host": {"devices", "contention", "pairs", "dispatch"}, "device": {"memory"},
  "units": {"time": "ms", "memory": "GB"}}`` with time per LLM layer per microbatch
  (units optional: unitless when absent);
* analytic: ``{"model": ..., "device": ..., "parallel": ..., "encoders": [{"vit": ...}]}``
  from model dimensions and a device profile (see `analytic.py`); a document is
  analytic when it names a `model`.

Memory (docs/memory.md): `llm.activation` is what one layer keeps per
microbatch until its backward; `llm.recompute.{selective,full}` what it keeps
under that recompute mode (`activation`) and the forward time the recompute
adds (`f`); `llm.static` the static memory (parameters, gradients, optimizer
state) of one layer, the embedding and the head; `llm.embed.activation` and
`llm.head.activation` what the embedding and the head (with the loss) keep
per microbatch (on the first and last chunk); an encoder's `static` that of
a trained copy and `replica_static` that of a forward-only replica;
`device.memory` the device's capacity.  All in the workload's memory unit.

Both resolve to the same `Workload`.  Encoder costs may differ per microbatch
(images per sample vary); they are resolved for a concrete microbatch count by
`Encoder.costs`.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from .analytic import analytic_workload
from .errors import MpipeError, WorkloadError
from .inputs import WORKLOAD_FILE_LIMIT, load_document, load_toml, read_bounded
from .memory_model import RECOMPUTE_MODES as MEMORY_RECOMPUTE_MODES
from .presets import PRESETS, preset_document
from .workloads.step_model import StepModel

# A per-microbatch cost: one number, a list (one per microbatch), or a seeded
# distribution {"uniform": [lo, hi], "seed": s} / {"normal": [mean, std], "seed": s}.
CostSpec = Any

# The units a workload's numbers are in, declared by the workload ("units":
# {"time": "ms", "memory": "GB"}); "" means unitless (abstract units).
TIME_UNITS = ("", "us", "ms", "s")
MEMORY_UNITS = ("", "bytes", "KB", "MB", "GB", "KiB", "MiB", "GiB")
BYTES_PER_UNIT = {"bytes": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2.0 ** 10, "MiB": 2.0 ** 20,
                  "GiB": 2.0 ** 30}


def bytes_per_memory_unit(unit: str) -> float | None:
    """Bytes in one `unit` of memory; None for a unitless workload (abstract units)."""
    return BYTES_PER_UNIT.get(unit)


@dataclass(frozen=True)
class Link:
    latency: float = 0.0
    bandwidth: float | None = None  # bytes per time unit; None = infinite

    def transfer(self, nbytes: float) -> float:
        if self.bandwidth is None or nbytes <= 0:
            return self.latency
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Host:
    """Devices that share one machine's cores and memory bandwidth slow each
    other down: with k of a host's devices computing at once, each runs at
    1 / (1 + contention * (k - 1)) of its own speed (processor sharing).
    `devices` per host (None: every device on one host); contention 0 (the
    default) is the plain model of independent devices.

    `pairs`: the slowdown by what runs where, overriding `contention` for the
    pairs it names: ((victim, other, c), ...) with victim and other op classes
    (`OP_CLASSES`: "llm" or "encoder").  An op of class A then runs at
    1 / (1 + sum of c(A, B) over the host's other busy devices, each running
    class B).  Measured here the pairs differ several-fold: an encoder streams
    its weights through the shared last-level cache, so a small LLM op beside
    it slows far more than it slows the encoder or than two encoders slow each
    other.

    `dispatch`: the fixed time of launching one op that every cost already
    includes (calibration folds the measured gap between ops into costs).  An
    encoder microbatch split into k shards pays it k times: each shard costs
    (cost - dispatch) / k + dispatch."""

    devices: int | None = None
    contention: float = 0.0
    dispatch: float = 0.0
    pairs: tuple[tuple[str, str, float], ...] = ()

    def host_of(self, device: int) -> int:
        return 0 if self.devices is None else device // self.devices

    @property
    def contends(self) -> bool:
        """Whether any busy device slows another (else the plain simulator is exact)."""
        return self.contention > 0 or any(c > 0 for _, _, c in self.pairs)

    def slowdown(self, victim: str, other: str) -> float:
        """c(victim, other): how much one busy device running `other` slows an op of class `victim`."""
        for a, b, c in self.pairs:
            if a == victim and b == other:
                return c
        return self.contention

    def pairs_doc(self) -> dict[str, dict[str, float]]:
        """`pairs` as the workload file writes it: {victim: {other: c}}."""
        doc: dict[str, dict[str, float]] = {}
        for a, b, c in self.pairs:
            doc.setdefault(a, {})[b] = c
        return doc


# The op classes host contention tells apart (`Host.pairs`).
OP_CLASSES = ("llm", "encoder")


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

    def kept_activation(self, mode: str) -> float:
        """What one layer keeps per microbatch until its backward under recompute `mode`."""
        return _kept(self.activation, self.recompute, mode)

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
                        f"llm.chunk_costs.{kind} has {len(table.get(kind, ()))} entries "
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


def _kept(activation: float, recompute: Mapping[str, Mapping[str, float]] | None, mode: str) -> float:
    """What a recompute `mode` keeps: the figure given, else (full) what selective
    keeps, else `activation`."""
    if mode == "none" or recompute is None:
        return activation
    selective = recompute.get("selective", {}).get("activation", activation)
    if mode == "selective":
        return selective
    return recompute.get("full", {}).get("activation", selective)


@dataclass(frozen=True)
class Encoder:
    name: str
    f: CostSpec = 1.0
    b: CostSpec = 1.0
    w: CostSpec = 1.0
    trainable: bool = False
    output_bytes: float = 0.0
    input_bytes: float = 0.0
    param_bytes: float = 0.0
    activation: float = 0.0
    # Bytes of the gradient a replica all-reduces (None: param_bytes); analytic
    # workloads state fp32 gradients, 4 bytes per parameter.
    grad_bytes: float | None = None
    # Images per sample, e.g. {"min": 1, "max": 6, "seed": 0}: f/b/w/activation
    # are then per image and scale with the microbatch's image count.
    images: Mapping[str, int] | None = None
    # Transformer layers, for `balanced` to split (1: not splittable).
    layers: int = 1
    # Static memory of a copy that trains (runs the backward) and of a
    # forward-only replica (None: the same as `static`).
    static: float = 0.0
    replica_static: float | None = None
    # Per recompute mode, per image for the whole encoder (as `activation`):
    # what it keeps and the forward time the recompute adds, when `balanced`
    # folded its layers into chunks that `recompute` names (see `LLM.recompute`).
    recompute: Mapping[str, Mapping[str, float]] | None = None

    @property
    def gradient_bytes(self) -> float:
        """What its gradient all-reduce moves the buffer of."""
        return self.param_bytes if self.grad_bytes is None else self.grad_bytes

    def static_of_copy(self, trains: bool) -> float:
        """Static memory a device holding this encoder has: a trained copy or a forward-only replica."""
        if trains or self.replica_static is None:
            return self.static
        return self.replica_static

    def image_counts(self, microbatches: int) -> list[int]:
        if self.images is None:
            return [1] * microbatches
        lo, hi = int(self.images.get("min", 1)), int(self.images.get("max", 1))
        return list(_image_counts(lo, hi, self.images.get("seed", 0), microbatches))

    def costs(self, kind: str, microbatches: int) -> list[float]:
        """Per-microbatch time of one encoder op kind ('F', 'B', 'W', 'BW')."""
        if kind == "BW":
            return [b + w for b, w in zip(self.costs("B", microbatches), self.costs("W", microbatches))]
        spec = {"F": self.f, "B": self.b, "W": self.w}[kind]
        base = _resolve_costs(spec, microbatches, where=f"encoder '{self.name}'.{kind.lower()}")
        return [c * n for c, n in zip(base, self.image_counts(microbatches))]

    def activations(self, microbatches: int, mode: str = "none") -> list[float]:
        """Per-microbatch activation it keeps until its backward, under recompute `mode`."""
        per_image = _kept(self.activation, self.recompute, mode)
        return [per_image * n for n in self.image_counts(microbatches)]

    def recompute_costs(self, mode: str, microbatches: int) -> list[float]:
        """Per-microbatch forward time a recompute of the whole encoder adds under `mode`:
        what the workload says, else its forward (full) or nothing (selective)."""
        def given(m: str) -> float | None:
            return None if self.recompute is None else self.recompute.get(m, {}).get("f")

        per_image = given("full")
        full = self.costs("F", microbatches) if per_image is None else \
            [per_image * n for n in self.image_counts(microbatches)]
        if mode == "full":
            return full
        per_image = given("selective") or 0.0
        return [min(per_image * n, f) for n, f in zip(self.image_counts(microbatches), full)]


@lru_cache(maxsize=64)
def _image_counts(lo: int, hi: int, seed: int, microbatches: int) -> tuple[int, ...]:
    """Images per sample, drawn with the seed (asked for on every simulation: kept)."""
    rng = random.Random(seed)
    return tuple(rng.randint(lo, hi) for _ in range(microbatches))


@dataclass(frozen=True)
class Workload:
    llm: LLM = field(default_factory=lambda: LLM(layers=None))
    encoders: tuple[Encoder, ...] = ()
    link: Link = field(default_factory=Link)
    name: str = "custom"
    host: Host = field(default_factory=Host)
    time_unit: str = ""  # one of TIME_UNITS
    memory_unit: str = ""  # one of MEMORY_UNITS
    # The device's memory capacity in `memory_unit` (None: unknown).
    capacity: float | None = None
    # The document it was read from, kept so saving/exporting round-trips it.
    source: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # An analytic workload's step figures and cluster (None: explicit costs only).
    step: StepModel | None = None

    def link_for(self, devices: int) -> Link:
        """The link a pipeline of `devices` stages sends on: the cluster's (the
        slowest class a hop between two stages crosses), else `link`."""
        if self.step is None or self.step.cluster is None:
            return self.link
        hop = self.step.hop_link(devices)
        if hop is None:
            return Link(0.0, None)
        unit = self.step.seconds_per_unit
        return Link(hop.latency_s / unit, hop.bytes_per_s * unit)

    def encoder(self, name: str) -> Encoder:
        for enc in self.encoders:
            if enc.name == name:
                return enc
        known = ", ".join(e.name for e in self.encoders) or "none"
        raise WorkloadError(f"unknown encoder '{name}' (this workload has: {known})")

    def to_dict(self) -> dict[str, Any]:
        if self.source is not None:
            return json.loads(json.dumps(self.source))
        return explicit_dict(self)


def explicit_dict(wl: Workload) -> dict[str, Any]:
    """The explicit-cost form of a workload (what `mpipe calibrate` and exports write)."""
    llm: dict[str, Any] = {
        "layers": wl.llm.layers, "f": wl.llm.f, "b": wl.llm.b, "w": wl.llm.w,
        "activation": wl.llm.activation, "boundary_bytes": wl.llm.boundary_bytes,
    }
    if wl.llm.chunk_costs is not None:
        llm["chunk_costs"] = {k: list(v) for k, v in wl.llm.chunk_costs.items()}
    if wl.llm.layer_costs is not None:
        llm["layer_costs"] = {k: list(v) for k, v in wl.llm.layer_costs.items()}
    for part in ("embed", "head"):
        spec = dict(getattr(wl.llm, part) or {})
        if getattr(wl.llm, f"{part}_activation"):
            spec["activation"] = getattr(wl.llm, f"{part}_activation")
        if spec or getattr(wl.llm, part) is not None:
            llm[part] = spec
    if wl.llm.recompute is not None:
        llm["recompute"] = {mode: dict(spec) for mode, spec in wl.llm.recompute.items()}
    if wl.llm.has_static:
        llm["static"] = {"layer": wl.llm.static_layer, "embed": wl.llm.static_embed, "head": wl.llm.static_head}
    encoders = []
    for e in wl.encoders:
        doc = {
            "name": e.name, "f": e.f, "b": e.b, "w": e.w, "trainable": e.trainable,
            "output_bytes": e.output_bytes, "input_bytes": e.input_bytes,
            "param_bytes": e.param_bytes, "activation": e.activation, "layers": e.layers,
        }
        if e.images is not None:
            doc["images"] = dict(e.images)
        if e.static:
            doc["static"] = e.static
        if e.replica_static is not None:
            doc["replica_static"] = e.replica_static
        if e.grad_bytes is not None:
            doc["grad_bytes"] = e.grad_bytes
        if e.recompute is not None:
            doc["recompute"] = {mode: dict(spec) for mode, spec in e.recompute.items()}
        encoders.append(doc)
    doc = {
        "name": wl.name, "llm": llm, "encoders": encoders,
        "link": {"latency": wl.link.latency, "bandwidth": wl.link.bandwidth},
        **({"host": {"devices": wl.host.devices, "contention": wl.host.contention,
                     "dispatch": wl.host.dispatch,
                     **({"pairs": wl.host.pairs_doc()} if wl.host.pairs else {})}}
           if wl.host != Host() else {}),
    }
    if wl.capacity is not None:
        doc["device"] = {"memory": wl.capacity}
    if wl.time_unit or wl.memory_unit:
        doc["units"] = {"time": wl.time_unit, "memory": wl.memory_unit}
    return doc


def _parse_units(doc: Any) -> tuple[str, str]:
    if doc is None:
        return "", ""
    if not isinstance(doc, dict):
        raise WorkloadError('units: expected {"time": ..., "memory": ...}')
    _check_keys(doc, {"time", "memory"}, "units")
    time, memory = doc.get("time", ""), doc.get("memory", "")
    if time not in TIME_UNITS:
        raise WorkloadError(f"units.time: expected one of {', '.join(repr(u) for u in TIME_UNITS)}, "
                            f"got {time!r}")
    if memory not in MEMORY_UNITS:
        raise WorkloadError(f"units.memory: expected one of {', '.join(repr(u) for u in MEMORY_UNITS)}, "
                            f"got {memory!r}")
    return time, memory


# --------------------------------------------------------------------------- parsing

def _number(doc: Mapping[str, Any], key: str, where: str, default: float | None = None,
            minimum: float = 0.0, allow_none: bool = False) -> Any:
    if key not in doc or doc[key] is None:
        if key in doc and allow_none:
            return None
        if default is None and not allow_none:
            raise WorkloadError(f"{where}: missing required key '{key}'")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"{where}.{key}: expected a number, got {value!r}")
    if value < minimum:
        raise WorkloadError(f"{where}.{key}: must be >= {minimum:g}, got {value!r}")
    return float(value)


MAX_LAYERS = 1_000_000
MAX_IMAGES = 100_000
MAX_DEVICES = 1_000_000
MAX_NAME = 200
_DISTRIBUTIONS = ("uniform", "normal")


def _finite(value: Any, where: str, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"{where}: expected a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{where}: must be >= {minimum:g}, got {value!r}")
    return float(value)


def _integer(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise WorkloadError(f"{where}: expected an integer from {lo} to {hi}, got {value!r}")
    return value


def _seed(doc: Mapping[str, Any], where: str) -> int:
    return _integer(doc.get("seed", 0), f"{where}.seed", -(2**63), 2**63 - 1)


def _check_keys(doc: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise WorkloadError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})")


def _check_cost_list(spec: Any, where: str) -> tuple[float, ...]:
    if not isinstance(spec, list):
        raise WorkloadError(f"{where}: expected a list of numbers, got {type(spec).__name__}")
    if not spec:
        raise WorkloadError(f"{where}: the list of costs is empty")
    return tuple(_finite(x, f"{where}[{i}]") for i, x in enumerate(spec))


def _check_cost_spec(spec: Any, where: str) -> Any:
    """A per-microbatch cost: a number, a list of numbers, or a seeded distribution
    whose draws are never negative (every value finite)."""
    if isinstance(spec, list):
        return list(_check_cost_list(spec, where))
    if isinstance(spec, dict):
        kinds = [k for k in _DISTRIBUTIONS if k in spec]
        if len(kinds) != 1:
            raise WorkloadError(f"{where}: a distribution needs exactly one of 'uniform' or 'normal'")
        kind = kinds[0]
        _check_keys(spec, {kind, "seed"}, where)
        pair = spec[kind]
        if not (isinstance(pair, list) and len(pair) == 2):
            raise WorkloadError(f"{where}.{kind}: expected [a, b], got {pair!r}")
        a, b = (_finite(x, f"{where}.{kind}[{i}]") for i, x in enumerate(pair))
        if kind == "uniform" and a > b:
            raise WorkloadError(f"{where}.uniform: need low <= high, got {pair!r}")
        return {kind: [a, b], "seed": _seed(spec, where)}
    return _finite(spec, where)


def _resolve_costs(spec: CostSpec, microbatches: int, where: str) -> list[float]:
    if isinstance(spec, (int, float)):
        return [float(spec)] * microbatches
    if isinstance(spec, list):
        if len(spec) != microbatches:
            raise WorkloadError(
                f"{where}: has {len(spec)} per-microbatch costs but the schedule has "
                f"{microbatches} microbatches"
            )
        return [float(x) for x in spec]
    rng = random.Random(spec.get("seed", 0))
    if "uniform" in spec:
        lo, hi = spec["uniform"]
        return [rng.uniform(lo, hi) for _ in range(microbatches)]
    mean, std = spec["normal"]
    return [max(0.0, rng.gauss(mean, std)) for _ in range(microbatches)]


def _parse_encoder(doc: Any, index: int) -> Encoder:
    where = f"encoders[{index}]"
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: expected an object, got {type(doc).__name__}")
    name = doc.get("name")
    if not isinstance(name, str) or not name.isidentifier() or name == "llm" or len(name) > 64:
        raise WorkloadError(f"{where}.name: expected an identifier other than 'llm', got {name!r}")
    _check_keys(doc, {"name", "f", "b", "w", "trainable", "output_bytes", "input_bytes",
                      "param_bytes", "grad_bytes", "activation", "images", "vit", "layers", "static",
                      "replica_static", "recompute"},
                where)
    images = doc.get("images")
    if images is not None:
        if not isinstance(images, dict):
            raise WorkloadError(f"{where}.images: expected {{'min': int, 'max': int, 'seed': int}}")
        _check_keys(images, {"min", "max", "seed"}, f"{where}.images")
        lo = _integer(images.get("min"), f"{where}.images.min", 1, MAX_IMAGES)
        hi = _integer(images.get("max"), f"{where}.images.max", 1, MAX_IMAGES)
        if lo > hi:
            raise WorkloadError(f"{where}.images: need min <= max, got {images!r}")
        images = {"min": lo, "max": hi, "seed": _seed(images, f"{where}.images")}
    trainable = doc.get("trainable", False)
    if not isinstance(trainable, bool):
        raise WorkloadError(f"{where}.trainable: expected true or false, got {trainable!r}")
    layers = doc.get("layers", 1)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise WorkloadError(f"{where}.layers: expected a positive integer, got {layers!r}")
    activation = _number(doc, "activation", where, 0.0)
    return Encoder(
        name=name,
        layers=layers,
        f=_check_cost_spec(doc.get("f", 1.0), f"{where}.f"),
        b=_check_cost_spec(doc.get("b", 1.0), f"{where}.b"),
        w=_check_cost_spec(doc.get("w", 1.0), f"{where}.w"),
        trainable=trainable,
        output_bytes=_number(doc, "output_bytes", where, 0.0),
        input_bytes=_number(doc, "input_bytes", where, 0.0),
        param_bytes=_number(doc, "param_bytes", where, 0.0),
        grad_bytes=_number(doc, "grad_bytes", where, None, allow_none=True),
        activation=activation,
        images=images,
        recompute=_parse_recompute(doc.get("recompute"), activation, f"{where}.recompute", f"{where}.activation"),
        static=_number(doc, "static", where, 0.0),
        replica_static=_number(doc, "replica_static", where, None, allow_none=True),
    )


def parse_workload(doc: Any, name: str = "custom") -> Workload:
    """Validate a workload document (explicit or analytic form) into a `Workload`."""
    if not isinstance(doc, dict):
        raise WorkloadError(f"workload: expected an object at the top level, got {type(doc).__name__}")
    if "model" in doc:  # the analytic form (an explicit workload may name a device's memory only)
        explicit, step = analytic_workload(doc)
        wl = parse_workload(explicit, name=doc.get("name", name))
        return replace(wl, source=doc, step=step)
    # `origin`: where a measured workload came from (`mpipe profile`: the model, the device).
    _check_keys(doc, {"llm", "encoders", "link", "host", "name", "description", "origin", "units", "device"},
                "workload")
    if "origin" in doc and not isinstance(doc["origin"], dict):
        raise WorkloadError("origin: expected an object")
    llm_doc = doc.get("llm", {})
    if not isinstance(llm_doc, dict):
        raise WorkloadError("llm: expected an object")
    _check_keys(llm_doc, {"layers", "f", "b", "w", "activation", "boundary_bytes", "chunk_costs", "layer_costs",
                          "embed", "head", "recompute", "static"}, "llm")
    layers = llm_doc.get("layers")
    if layers is not None:
        layers = _integer(layers, "llm.layers", 1, MAX_LAYERS)
    chunk_costs = llm_doc.get("chunk_costs")
    if chunk_costs is not None:
        if not isinstance(chunk_costs, dict) or not {"F", "B", "W"} <= set(chunk_costs):
            raise WorkloadError("llm.chunk_costs: expected {'F': [...], 'B': [...], 'W': [...]}")
        _check_keys(chunk_costs, {"F", "B", "W"}, "llm.chunk_costs")
        chunk_costs = {k: _check_cost_list(v, f"llm.chunk_costs.{k}") for k, v in chunk_costs.items()}
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
            checked[k] = tuple(_check_cost_spec(x, f"llm.layer_costs.{k}[{i}]") for i, x in enumerate(v))
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
            parts[part] = {k: _number(spec, k, f"llm.{part}") for k in spec if k != "activation"}
            part_activation[part] = _number(spec, "activation", f"llm.{part}", 0.0)
    activation = _number(llm_doc, "activation", "llm", 1.0)
    static = _parse_llm_static(llm_doc.get("static"))
    llm = LLM(
        layers=layers,
        layer_costs=layer_costs,
        embed=parts.get("embed"),
        head=parts.get("head"),
        embed_activation=part_activation.get("embed", 0.0),
        head_activation=part_activation.get("head", 0.0),
        f=_number(llm_doc, "f", "llm", 1.0),
        b=_number(llm_doc, "b", "llm", 1.0),
        w=_number(llm_doc, "w", "llm", 1.0),
        activation=activation,
        boundary_bytes=_number(llm_doc, "boundary_bytes", "llm", 0.0),
        chunk_costs=chunk_costs,
        recompute=_parse_recompute(llm_doc.get("recompute"), activation, "llm.recompute", "llm.activation"),
        static_layer=static["layer"], static_embed=static["embed"], static_head=static["head"],
    )
    enc_docs = doc.get("encoders", [])
    if not isinstance(enc_docs, list):
        raise WorkloadError("encoders: expected a list")
    encoders = tuple(_parse_encoder(e, i) for i, e in enumerate(enc_docs))
    names = [e.name for e in encoders]
    if len(set(names)) != len(names):
        raise WorkloadError(f"encoders: duplicate encoder name in {names}")
    link_doc = doc.get("link")
    link_doc = {} if link_doc is None else link_doc
    if not isinstance(link_doc, dict):
        raise WorkloadError("link: expected an object")
    _check_keys(link_doc, {"latency", "bandwidth"}, "link")
    bandwidth = _number(link_doc, "bandwidth", "link", None, allow_none=True)
    if bandwidth is not None and bandwidth <= 0:
        raise WorkloadError(f"link.bandwidth: must be > 0 or null, got {bandwidth!r}")
    link = Link(latency=_number(link_doc, "latency", "link", 0.0), bandwidth=bandwidth)
    label = doc.get("name", name)
    if not isinstance(label, str) or len(label) > MAX_NAME or "\x00" in label:
        raise WorkloadError(f"name: expected text of at most {MAX_NAME} characters, got {str(label)[:40]!r}")
    description = doc.get("description", "")
    if not isinstance(description, str) or "\x00" in description:
        raise WorkloadError("description: expected text without NUL characters")
    time_unit, memory_unit = _parse_units(doc.get("units"))
    return Workload(llm, encoders, link, name=label, host=parse_host(doc.get("host")),
                    time_unit=time_unit, memory_unit=memory_unit, capacity=_parse_device(doc.get("device")),
                    source=doc)


# The modes a `recompute` section states: memory_model's, less "none" (nothing recomputed).
RECOMPUTE_MODES = tuple(mode for mode in MEMORY_RECOMPUTE_MODES if mode != "none")


def _parse_recompute(doc: Any, activation: float, at: str, limit: str) -> dict[str, dict[str, float]] | None:
    """`recompute`: {mode: {"activation": memory kept, "f": time added}}, per
    layer for the LLM, per image for an encoder; what a mode keeps is at most
    `activation` (named `limit` in messages)."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise WorkloadError(f'{at}: expected {{"selective": {{...}}, "full": {{...}}}}')
    _check_keys(doc, set(RECOMPUTE_MODES), at)
    out: dict[str, dict[str, float]] = {}
    for mode in RECOMPUTE_MODES:
        if mode not in doc:
            continue
        where = f"{at}.{mode}"
        spec = doc[mode]
        if not isinstance(spec, dict):
            raise WorkloadError(f'{where}: expected {{"activation": memory, "f": time}}')
        _check_keys(spec, {"activation", "f"}, where)
        entry = {key: _number(spec, key, where) for key in ("activation", "f") if key in spec}
        if entry.get("activation", 0.0) > activation:
            raise WorkloadError(f"{where}.activation: {entry['activation']:g} is more than {limit} "
                                f"({activation:g}): a recompute keeps at most what is kept without one")
        out[mode] = entry
    full, selective = out.get("full", {}).get("activation"), out.get("selective", {}).get("activation")
    if full is not None and selective is not None and full > selective:
        raise WorkloadError(f"{at}.full.activation: {full:g} is more than {at}.selective.activation "
                            f"({selective:g}): a full recompute keeps at most what a selective one keeps")
    return out


def _parse_llm_static(doc: Any) -> dict[str, float]:
    """llm.static: {"layer": per layer, "embed": the embedding's, "head": the head's} static memory."""
    if doc is None:
        return {"layer": 0.0, "embed": 0.0, "head": 0.0}
    if not isinstance(doc, dict):
        raise WorkloadError('llm.static: expected {"layer": memory, "embed": memory, "head": memory}')
    _check_keys(doc, {"layer", "embed", "head"}, "llm.static")
    return {key: _number(doc, key, "llm.static", 0.0) for key in ("layer", "embed", "head")}


def _parse_device(doc: Any) -> float | None:
    """device: {"memory": capacity} in the workload's memory unit (null: unknown)."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise WorkloadError('device: an explicit workload takes {"memory": capacity}; a device preset or '
                            'profile goes with a "model" (the analytic form)')
    _check_keys(doc, {"memory"}, "device")
    value = doc.get("memory")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"device.memory: expected a number, got {value!r}")
    if value <= 0:
        raise WorkloadError(f"device.memory: must be > 0 or null, got {value!r}")
    return float(value)


def parse_host(doc: Any) -> Host:
    if doc is None:
        return Host()
    if not isinstance(doc, dict):
        raise WorkloadError("host: expected an object")
    _check_keys(doc, {"devices", "contention", "dispatch", "pairs"}, "host")
    devices = doc.get("devices")
    if devices is not None:
        devices = _integer(devices, "host.devices", 1, MAX_DEVICES)
    return Host(devices=devices, contention=_number(doc, "contention", "host", 0.0),
                dispatch=_number(doc, "dispatch", "host", 0.0), pairs=_parse_pairs(doc.get("pairs")))


def _parse_pairs(doc: Any) -> tuple[tuple[str, str, float], ...]:
    """host.pairs: {victim: {other: c}} over `OP_CLASSES`."""
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        raise WorkloadError("host.pairs: expected an object {op class: {op class: contention}}")
    out = []
    for victim, row in doc.items():
        if victim not in OP_CLASSES:
            raise WorkloadError(f"host.pairs: unknown op class {str(victim)[:40]!r} (known: {', '.join(OP_CLASSES)})")
        if not isinstance(row, dict):
            raise WorkloadError(f"host.pairs.{victim}: expected an object {{op class: contention}}")
        for other in row:
            if other not in OP_CLASSES:
                raise WorkloadError(f"host.pairs.{victim}: unknown op class {str(other)[:40]!r} "
                                    f"(known: {', '.join(OP_CLASSES)})")
            out.append((victim, other, _finite(row[other], f"host.pairs.{victim}.{other}")))
    return tuple(out)



def with_parallel(workload: Workload, parallel: Mapping[str, Any]) -> Workload:
    """An analytic workload with `parallel`'s keys set in its `parallel` section
    (the CLI's `--parallel tp=8,sp`); checked like the document's own."""
    doc = workload.source
    if doc is None or "model" not in doc:
        raise WorkloadError("--parallel needs an analytic workload (one that names a model and a device); "
                            f"'{workload.name}' states its costs explicitly")
    changed = json.loads(json.dumps(doc))
    section = changed.get("parallel", {})
    changed["parallel"] = {**(section if isinstance(section, dict) else {}), **parallel}
    return parse_workload(changed, name=workload.name)


def preset(name: str) -> Workload:
    """A named workload (`presets.PRESETS`)."""
    return parse_workload(preset_document(name), name=name)


def load_workload(source: "Workload | Mapping[str, Any] | str | Path | None") -> Workload:
    """A workload from a `Workload`, a dict, a preset name, or a .json/.toml file path."""
    if source is None:
        return Workload(name="uniform")
    if isinstance(source, Workload):
        return source
    if isinstance(source, Mapping):
        return parse_workload(dict(source))
    text = str(source)
    if text in PRESETS:
        return preset(text)
    path = Path(text)
    if not path.exists():
        from .suggest import closest

        hint = closest(text, PRESETS)
        extra = f"; did you mean preset '{hint}'?" if hint else f" (presets: {', '.join(sorted(PRESETS))})"
        raise WorkloadError(f"workload '{text}': no such file or preset{extra}")
    try:
        raw = read_bounded(path, WORKLOAD_FILE_LIMIT, "the workload file")
        if path.suffix.lower() == ".toml":
            doc = load_document(raw, str(path), load_toml, "toml")
        else:
            doc = load_document(raw, str(path), kind=path.suffix.lstrip(".").lower() or "json")
    except MpipeError as error:
        raise WorkloadError(error.message) from None
    try:
        return parse_workload(doc, name=path.stem[:MAX_NAME])
    except WorkloadError as error:
        raise WorkloadError(f"{path}: {error.message}") from None
