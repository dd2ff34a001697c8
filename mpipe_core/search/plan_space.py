"""The space `mpipe plan` searches: the mesh layouts of N devices and the
schedule terms of each, with the lower bounds that prune them.

A *layout* is tp x cp x pp x dp = N, the microbatch size, the distributed
optimizer and the encoders' own tp; its workload document is the user's
analytic one with `parallel` and `model.microbatch_size` set (so `mpipe eval
TERM -w DOC` reproduces a candidate).  A layout's *terms* are schedules of
pp devices and B / (dp x mbs) microbatches: the generators (virtual stages
through interleaved's v and the V-shaped generators), and for an MLLM every
encoder strategy (`TERM_FAMILIES`).

Bounds, in seconds of one optimizer step (valid for every term of the layout,
each family adding its own):

* every device of the pipeline runs an equal share at best: (the LLM's F+B+W
  over all microbatches + the encoders' essential work) / pp, plus the
  optimizer's HBM traffic averaged over the pp devices (the step adds it
  after the pipeline);
* fused (encoders on the first stage): that stage runs all encoder work;
  disaggregate(k) and encoder_stage: the encoder devices run all encoder
  work, the rest all LLM work;
* memory: the static memory (parameters, gradients, optimizer state) of the
  LLM and one copy of each encoder, averaged over the pp devices, is at most
  the fullest device's; recompute never lowers static memory.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from mpipe_core.simulation.step_figures import gradient_sync, optimizer_seconds
from mpipe_core.workloads.workload import Workload

MICROBATCH_SIZES = (1, 2, 4, 8)
# LLM bodies: (generator, extra arguments).  Virtual stages: interleaved's v, zbv's V.
PLAN_BODIES = (("1f1b", ""), ("interleaved", ", v=2"), ("interleaved", ", v=4"), ("zb_h1", ""), ("zb_h2", ""),
               ("zbv", ""))
ENCODER_BATCHES = (2, 4)
DYNAMIC_SHARDS = (1, 2)
DYNAMIC_BODIES = ("1f1b", "zb_h2", "zbv")
# The encoder strategies a term belongs to (the text output and the JSON name them).
TERM_FAMILIES = ("fused", "balanced", "transpose", "colocated", "encoder_batch", "disaggregate", "encoder_stage")


@dataclass(frozen=True, order=True)
class Layout:
    tp: int
    cp: int
    pp: int
    dp: int
    mbs: int
    distributed_optimizer: bool
    encoder_tp: int | None = None  # None: no analytic encoder (or the default gcd rule)

    def microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.mbs)

    def label(self) -> str:
        enc = f" etp={self.encoder_tp}" if self.encoder_tp is not None else ""
        return (f"tp={self.tp} cp={self.cp} pp={self.pp} dp={self.dp} mbs={self.mbs}"
                f"{' dist-opt' if self.distributed_optimizer else ''}{enc}")


@dataclass(frozen=True)
class Term:
    text: str
    family: str
    expensive: bool  # dynamic transposes and grouped encoders: the second phase
    bound_kind: str  # "shared", "fused", "disaggregate:K" (K encoder devices)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def layout_document(doc: Mapping[str, Any], layout: Layout, cluster: Any) -> dict[str, Any]:
    """The user's analytic document with the layout's `parallel` section, microbatch size,
    encoder tp and cluster set (every other key as the user wrote it)."""
    out = copy.deepcopy(dict(doc))
    model = out["model"]
    out["model"] = ({"preset": model} if isinstance(model, str) else dict(model))
    out["model"]["microbatch_size"] = layout.mbs
    section = dict(out.get("parallel") or {})
    section.update(tp=layout.tp, cp=layout.cp, dp=layout.dp, sp=layout.tp > 1,
                   distributed_optimizer=layout.distributed_optimizer)
    out["parallel"] = section
    if layout.encoder_tp is not None:
        out["encoders"] = [dict(e, tp=layout.encoder_tp) if isinstance(e, dict) and "vit" in e else e
                           for e in out.get("encoders", [])]
    if cluster is not None:
        out["cluster"] = copy.deepcopy(cluster)
    return out


def layout_terms(wl: Workload, pp: int, m: int) -> list[Term]:
    """Every term of a layout's space, cheap ones first."""
    bodies = [f"{name}(p={pp}, m={m}{extra})" for name, extra in PLAN_BODIES]
    terms = [Term(b, "fused", False, "fused" if wl.encoders else "shared") for b in bodies]
    if not wl.encoders:
        terms += [Term(f"defer_w(split_bw({b}))", "fused", False, "shared") for b in bodies[:3]]
        return terms
    trainable = any(e.trainable for e in wl.encoders)
    backwards = (", backward=recompute", ", backward=owner") if trainable else ("",)
    for b in bodies:
        terms.append(Term(f"balanced({b})", "balanced", False, "shared"))
        terms.append(Term(f"colocated({b})", "colocated", False, "shared"))
        for overflow in ("full", "min"):
            for back in backwards:
                terms.append(Term(f"transpose({b}, overflow={overflow}{back})", "transpose", False, "shared"))
    if pp > 1:
        terms.append(Term(f"encoder_stage(1f1b(p={pp - 1}, m={m}))", "encoder_stage", False, "disaggregate:1"))
    for k in encoder_device_choices(wl, pp, m):
        for name, extra in PLAN_BODIES:
            if name in DYNAMIC_BODIES:
                terms.append(Term(f"disaggregate({name}(p={pp - k}, m={m}{extra}), encoder_devices={k})",
                                  "disaggregate", False, f"disaggregate:{k}"))
    for name, extra in PLAN_BODIES:
        if name not in DYNAMIC_BODIES:
            continue
        body = f"{name}(p={pp}, m={m}{extra})"
        for back in backwards:
            for shards in DYNAMIC_SHARDS:
                terms.append(Term(f"transpose({body}, mode=dynamic{back}, shards={shards})", "transpose", True,
                                  "shared"))
        for k in ENCODER_BATCHES:
            if k <= m:
                terms.append(Term(f"encoder_batch(colocated({body}), {k})", "encoder_batch", True, "shared"))
    return terms


def encoder_device_choices(wl: Workload, pp: int, m: int) -> list[int]:
    """k worth giving the encoders: those next to the encoders' share of the work
    (where encoder and LLM devices are equally loaded), and 1."""
    if pp < 2 or not wl.encoders:
        return []
    enc, llm = encoder_work(wl, m), llm_work(wl, pp, m)
    share = pp * enc / (enc + llm) if enc + llm > 0 else 1.0
    return sorted(k for k in {1, math.floor(share), math.ceil(share)} if 1 <= k < pp)


def llm_work(wl: Workload, chunks: int, m: int) -> float:
    """The LLM's essential F+B+W over all microbatches, in the workload's time unit."""
    table = wl.llm.chunk_cost_table(max(1, min(chunks, wl.llm.layers or chunks)))
    return m * sum(sum(table[k]) for k in ("F", "B", "W"))


def encoder_work(wl: Workload, m: int) -> float:
    return sum(sum(e.costs("F", m)) + (sum(e.costs("B", m)) + sum(e.costs("W", m)) if e.trainable else 0.0)
               for e in wl.encoders)


@dataclass(frozen=True)
class Bounds:
    """A layout's bounds: seconds (shared by every term), and per family."""

    shared: float
    llm: float  # the LLM's work alone, seconds
    encoder: float  # the encoders' work, seconds
    optimizer: float  # the optimizer's and the gradient sync's least time averaged over the pp devices, s
    static_memory: float  # at most the fullest device's static memory (the workload's unit)

    def term(self, term: Term, pp: int) -> float:
        if term.bound_kind == "fused":
            return max(self.shared, self.encoder + self.optimizer)
        if term.bound_kind.startswith("disaggregate:"):
            k = int(term.bound_kind.split(":")[1])
            return max(self.shared, self.encoder / k + self.optimizer, self.llm / max(pp - k, 1) + self.optimizer)
        return self.shared


def _sync_bound(step, pp: int, n: int, params: float, sharded: float = 0.0) -> float:
    """The gradient sync's bandwidth term averaged over the pp devices, seconds:
    the step model's own collectives (`step_figures.gradient_sync`, so the bound
    moves the bytes the step moves, `grad_bytes` per gradient included) for the
    layout's parameters spread evenly over the pp devices, on the sync's link with
    its latency dropped (a device with nothing to sync pays none; without latency
    a ring's time is linear in its bytes, so the even spread is the least the
    fullest device pays).  The gradient reduction counts only when it is not
    overlapped with the backward (`step_figures.exposed_reduction` says why not its
    last bucket); the all-gathers are never hidden.  The tied embedding's all-reduce
    (on two devices only) is left out, which keeps the bound below the step."""
    link = step.gradient_link(pp)
    if link is None or n <= 1:
        return 0.0
    reduce, gather, shard = gradient_sync(step, params / pp, sharded / pp, replace(link, latency_us=0.0))
    seconds = 0.0 if step.overlap_grad_reduce else reduce.seconds
    if gather is not None:
        seconds += gather.seconds
    return seconds + sum(c.seconds for c in shard)


def layout_bounds(wl: Workload, layout: Layout, m: int) -> Bounds:
    step = wl.step
    unit = step.seconds_per_unit if step is not None else 1.0
    pp = layout.pp
    llm = llm_work(wl, pp, m) * unit
    enc = encoder_work(wl, m) * unit
    optimizer = 0.0
    if step is not None:
        layers = wl.llm.layers or pp
        params = layers * step.layer_params + step.embed_params + step.head_params + sum(
            e.params for e in step.encoders if e.trainable and not e.sharded)
        # A sharded encoder's k copies update 1/(k n) each (k = 1 when `balanced` folds it)
        sharded = sum(e.params for e in step.encoders if e.trainable and e.sharded)
        n = step.dp * step.cp
        optimizer = optimizer_seconds(step, params, sharded) / pp  # (the step model's own; linear)
        optimizer += _sync_bound(step, pp, n, params, sharded)
    layers = wl.llm.layers or pp
    static = layers * wl.llm.static_layer + wl.llm.static_embed + wl.llm.static_head + sum(
        min(e.static_of_copy(True, pp), e.replica_static if e.replica_static is not None else e.static)
        for e in wl.encoders)
    return Bounds((llm + enc) / pp + optimizer, llm, enc, optimizer, static / pp)
