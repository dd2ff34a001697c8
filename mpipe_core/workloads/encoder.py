"""A modality encoder of a workload (a vision tower, an audio encoder): its cost per
microbatch, which may differ per microbatch (images per sample vary)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.fields import (
    MAX_IMAGES,
    CostSpec,
    check_cost_spec,
    check_keys,
    integer,
    kept,
    kind_of,
    number,
    parse_recompute,
    resolve_costs,
    seed,
    shown,
)


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
    # The part of `static` sharded over the encoder's trained copies in one
    # pipeline (`parallel.encoder_shard`: optimizer state, and gradients):
    # with k copies each holds static - sharded_static + sharded_static / k,
    # and their gradient sync is a reduce-scatter + all-gather instead of an
    # all-reduce.  None: nothing is sharded over the copies.
    sharded_static: float | None = None
    # Per recompute mode, per image for the whole encoder (as `activation`):
    # what it keeps and the forward time the recompute adds, when `balanced`
    # folded its layers into chunks that `recompute` names (see `LLM.recompute`).
    recompute: Mapping[str, Mapping[str, float]] | None = None
    # Tiles (encoder inputs) of each microbatch of one drawn batch, set from the
    # workload's `data` (workloads/batch_costs.py): f/b/w/activation are then per
    # tile and scale with these counts, as with `images` (never both), and so do
    # output_bytes and input_bytes (which `images` leaves per microbatch).
    counts: tuple[float, ...] | None = None

    @property
    def gradient_bytes(self) -> float:
        """The buffer its gradient all-reduce moves."""
        return self.param_bytes if self.grad_bytes is None else self.grad_bytes

    def static_of_copy(self, trains: bool, copies: int = 1) -> float:
        """Static memory a device holding this encoder has: a trained copy (one of
        `copies` in its pipeline) or a forward-only replica."""
        if trains or self.replica_static is None:
            if self.sharded_static is None or copies <= 1:
                return self.static
            return self.static - self.sharded_static + self.sharded_static / copies
        return self.replica_static

    def image_counts(self, microbatches: int) -> list[float]:
        if self.counts is not None:
            if len(self.counts) != microbatches:
                raise WorkloadError(f"encoder '{self.name}': the drawn batch has {len(self.counts)} microbatches "
                                    f"but the schedule has {microbatches}")
            return list(self.counts)
        if self.images is None:
            return [1] * microbatches
        lo, hi = int(self.images.get("min", 1)), int(self.images.get("max", 1))
        return list(_image_counts(lo, hi, self.images.get("seed", 0), microbatches))

    def output_bytes_of(self, mb: int) -> float:
        """The features microbatch `mb` ships to the LLM (or their gradient back): with
        a drawn batch (`counts`) `output_bytes` is per tile; otherwise per microbatch."""
        return self.output_bytes if self.counts is None else self.output_bytes * self.counts[mb]

    def input_bytes_of(self, mb: int) -> float:
        """The raw input of microbatch `mb` a recompute elsewhere needs (per tile with `counts`)."""
        return self.input_bytes if self.counts is None else self.input_bytes * self.counts[mb]

    def costs(self, kind: str, microbatches: int) -> list[float]:
        """Per-microbatch time of one encoder op kind ('F', 'B', 'W', 'BW')."""
        if kind == "BW":
            return [b + w for b, w in zip(self.costs("B", microbatches), self.costs("W", microbatches))]
        spec = {"F": self.f, "B": self.b, "W": self.w}[kind]
        base = resolve_costs(spec, microbatches, where=f"encoder '{self.name}'.{kind.lower()}")
        return [c * n for c, n in zip(base, self.image_counts(microbatches))]

    def activations(self, microbatches: int, mode: str = "none") -> list[float]:
        """Per-microbatch activation it keeps until its backward, under recompute `mode`."""
        per_image = kept(self.activation, self.recompute, mode)
        return [per_image * n for n in self.image_counts(microbatches)]

    def no_grad_working_set(self, microbatches: int) -> list[float]:
        """Per microbatch, what a frozen tower's forward holds while it runs: it runs
        under no_grad, so each layer frees its intermediates as the next begins and
        one layer's activation (what a trained layer would keep, an upper estimate of
        its working set) is live at a time, not the whole tower's."""
        return [a / max(self.layers, 1) for a in self.activations(microbatches)]

    def forward_held(self, microbatches: int) -> list[float]:
        """Per microbatch, what its forward op holds: a trained tower's activation
        (kept until its backward), a frozen one's working set (while it runs)."""
        return self.activations(microbatches) if self.trainable else self.no_grad_working_set(microbatches)

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


def parse_encoder(doc: Any, index: int) -> Encoder:
    where = f"encoders[{index}]"
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: expected an object, got {kind_of(doc)}")
    name = doc.get("name")
    if not isinstance(name, str) or not name.isidentifier() or name == "llm" or len(name) > 64:
        raise WorkloadError(f"{where}.name: expected an identifier other than 'llm', got {shown(name)}")
    check_keys(doc, {"name", "f", "b", "w", "trainable", "output_bytes", "input_bytes",
                      "param_bytes", "grad_bytes", "activation", "images", "vit", "layers", "static",
                      "replica_static", "sharded_static", "recompute", "tp_sharded"},
                where)
    images = doc.get("images")
    if images is not None:
        if not isinstance(images, dict):
            raise WorkloadError(f"{where}.images: expected {{'min': int, 'max': int, 'seed': int}}")
        check_keys(images, {"min", "max", "seed"}, f"{where}.images")
        lo = integer(images.get("min"), f"{where}.images.min", 1, MAX_IMAGES)
        hi = integer(images.get("max"), f"{where}.images.max", 1, MAX_IMAGES)
        if lo > hi:
            raise WorkloadError(f"{where}.images: need min <= max, got {shown(images)}")
        images = {"min": lo, "max": hi, "seed": seed(images, f"{where}.images")}
    trainable = doc.get("trainable", False)
    if not isinstance(trainable, bool):
        raise WorkloadError(f"{where}.trainable: expected true or false, got {shown(trainable)}")
    layers = doc.get("layers", 1)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise WorkloadError(f"{where}.layers: expected a positive integer, got {shown(layers)}")
    activation = number(doc, "activation", where, 0.0)
    check_tp_sharded(doc, where)
    return Encoder(
        name=name,
        layers=layers,
        f=check_cost_spec(doc.get("f", 1.0), f"{where}.f"),
        b=check_cost_spec(doc.get("b", 1.0), f"{where}.b"),
        w=check_cost_spec(doc.get("w", 1.0), f"{where}.w"),
        trainable=trainable,
        output_bytes=number(doc, "output_bytes", where, 0.0),
        input_bytes=number(doc, "input_bytes", where, 0.0),
        param_bytes=number(doc, "param_bytes", where, 0.0),
        grad_bytes=number(doc, "grad_bytes", where, None, allow_none=True),
        activation=activation,
        images=images,
        recompute=parse_recompute(doc.get("recompute"), activation, f"{where}.recompute", f"{where}.activation"),
        static=number(doc, "static", where, 0.0),
        replica_static=number(doc, "replica_static", where, None, allow_none=True),
        sharded_static=_sharded(doc, where),
    )


def check_tp_sharded(doc: Mapping[str, Any], where: str) -> None:
    """`tp_sharded` (optional, `mpipe profile`): the part of static, replica_static, param_bytes
    and grad_bytes that the model's tp plan shards of the tower; each at most its whole."""
    tp = doc.get("tp_sharded")
    if tp is None:
        return
    if not isinstance(tp, dict):
        raise WorkloadError(f"{where}.tp_sharded: expected an object, got {kind_of(tp)}")
    keys = ("static", "replica_static", "param_bytes", "grad_bytes")
    check_keys(tp, set(keys), f"{where}.tp_sharded")
    for key in tp:
        share = number(tp, key, f"{where}.tp_sharded", 0.0)
        whole = number(doc, key, where, None, allow_none=True)
        if whole is not None and share > whole:
            raise WorkloadError(f"{where}.tp_sharded.{key} ({share:g}) is more than {where}.{key} ({whole:g}): "
                                f"it is the part of it tp shards")


def _sharded(doc: Mapping[str, Any], where: str) -> float | None:
    value = number(doc, "sharded_static", where, None, allow_none=True)
    if value is not None and value > number(doc, "static", where, 0.0):
        raise WorkloadError(f"{where}.sharded_static: {value:g} is more than {where}.static "
                            f"({number(doc, 'static', where, 0.0):g}): it is the part of it sharded over the copies")
    return value
