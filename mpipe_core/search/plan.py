"""`mpipe plan`: the whole layout for N devices and a global batch.

It searches tp x cp x pp x dp = N (tp dividing the heads and key/value heads,
the encoders' own tp dividing theirs), the microbatch size (B / (dp x mbs)
microbatches per step), the distributed optimizer, and per layout the terms
of `plan_space.layout_terms`: the generators (virtual stages included) and,
for an MLLM, every encoder strategy on the same pp devices.  A candidate that
misses the memory cap is tried with recompute (selective, then full, on the
chunks of its over-cap devices, then on every chunk).  Candidates are ranked
by step_time_s, those within the cap first.

Branch and bound: layouts are visited by their lower bound (`plan_space`),
cheap terms of every layout first (phase 1), then the dynamic transposes and
grouped encoders of the layouts that phase 1 ranked best (phase 2); a term
whose bound is above the K-th best step time within the cap is never
evaluated, and a layout whose static memory alone is over the cap is ruled
out whole.  The bounds are valid for every term, so pruning never drops what
an exhaustive search of the same space would rank in the top K; the budget
(`max_evaluations` terms, `DEFAULT_EVALUATIONS` by default) and an optional
time limit can, and the result says how many terms each left out
(`PlanResult.coverage`).  The budget counts terms, not seconds: the same
question gets the same answer on an idle and a loaded machine.

Every candidate is `api.evaluate(term, parse_workload(document))`, so
`mpipe eval TERM -w DOCUMENT` reproduces its step time exactly.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError, WorkloadError
from mpipe_core.search.budget import DEFAULT_EVALUATIONS
from mpipe_core.search.fit import with_recompute
from mpipe_core.search.plan_space import (MICROBATCH_SIZES, Bounds, Layout, Term, divisors, layout_bounds,
                                          layout_document, layout_terms)
from mpipe_core.simulation.metrics import within
from mpipe_core.workloads.cluster import Cluster, parse_cluster, strides
from mpipe_core.workloads.presets import LLMS, VITS
from mpipe_core.workloads.units import seconds
from mpipe_core.workloads.workload import Workload, parse_workload

Progress = Callable[[int, int, str], None]  # (done, total, what) for a progress bar


@dataclass(frozen=True)
class PlanCandidate:
    layout: Layout
    term: str
    family: str
    microbatches: int
    document: dict = field(repr=False, compare=False)
    step_time_s: float = 0.0
    mfu: float = 0.0
    peak_memory: float = 0.0
    static_memory: float = 0.0
    fits: bool | None = None  # within the device's capacity (None: unknown)
    within_cap: bool = True  # within the search's memory cap
    devices_total: int = 0
    breakdown: dict = field(default_factory=dict, repr=False, compare=False)

    def parallel(self) -> dict[str, Any]:
        return dict(self.document["parallel"])

    def as_dict(self) -> dict[str, Any]:
        return {"parallel": self.parallel(), "pp": self.layout.pp, "microbatch_size": self.layout.mbs,
                "microbatches": self.microbatches, "encoder_tp": self.layout.encoder_tp,
                "family": self.family, "term": self.term, "workload": self.document,
                "step_time_s": self.step_time_s, "mfu": self.mfu, "peak_memory": self.peak_memory,
                "static_memory": self.static_memory, "fits": self.fits, "within_cap": self.within_cap,
                "devices_total": self.devices_total, "breakdown": self.breakdown}


@dataclass
class PlanResult:
    devices: int
    global_batch: int
    cluster: Cluster
    memory_cap: float | None
    candidates: list[PlanCandidate]  # every one evaluated, within the cap first, then by step time
    top: int
    ruled_out: list[str]
    searched: dict[str, int]
    seconds: float
    memory_unit: str = "GB"
    least_memory: float | None = None  # require_fit=False and nothing fits: the least any layout needs

    @property
    def best(self) -> PlanCandidate:
        return self.candidates[0]

    def shown(self) -> list[PlanCandidate]:
        return self.candidates[:self.top]

    def pareto(self) -> list[PlanCandidate]:
        """The step time / peak memory front of the candidates within the cap."""
        front, lowest = [], math.inf
        for c in sorted((c for c in self.candidates if c.within_cap), key=lambda c: (c.step_time_s, c.peak_memory)):
            if c.peak_memory < lowest:
                front.append(c)
                lowest = c.peak_memory
        return front

    def coverage(self) -> str:
        """What the search covered, in one sentence: complete, or what the budget
        and the time limit left untried."""
        s = self.searched
        if not s["not_tried"]:
            return (f"the search was complete: each of the {s['terms']:,} terms was evaluated or pruned by a "
                    f"bound that never drops a top-{self.top} layout")
        left = []
        if s.get("left_by_budget"):
            left.append(f"{s['left_by_budget']:,} left by the budget of {s['budget']:,} terms")
        if s.get("left_by_time"):
            left.append(f"{s['left_by_time']:,} left by the time limit")
        return (f"the budget covered {s['terms'] - s['not_tried']:,} of the {s['terms']:,} terms (evaluated or "
                f"pruned); {' and '.join(left)}, so a faster layout may be among those")

    def best_of_family(self) -> dict[str, PlanCandidate]:
        out: dict[str, PlanCandidate] = {}
        for c in self.candidates:
            if c.within_cap:
                out.setdefault(c.family, c)
        return out

    def device_source(self):
        """What every candidate's step time rests on (`workloads.device_source`): the
        device section is the user's, the same in every candidate's document."""
        from mpipe_core.workloads.device_source import device_source

        return device_source(self.best.document)

    def as_dict(self) -> dict[str, Any]:
        source = self.device_source()
        return {"devices": self.devices, "global_batch": self.global_batch, "cluster": self.cluster.name,
                "memory_cap": self.memory_cap,
                "device_source": None if source is None else source.as_dict(),
                "candidates": [c.as_dict() for c in self.shown()], "best": self.best.as_dict(),
                "best_of_family": {k: c.as_dict() for k, c in self.best_of_family().items()},
                "pareto": [{"term": c.term, "parallel": c.parallel(), "microbatch_size": c.layout.mbs,
                            "step_time_s": c.step_time_s, "peak_memory": c.peak_memory} for c in self.pareto()],
                "ruled_out": self.ruled_out, "searched": self.searched, "seconds": self.seconds}


# ------------------------------------------------------------------ checks


def resolve_cluster(doc: Mapping[str, Any], cluster: Any) -> Any:
    """The cluster section the plan uses: --cluster, else the document's, else the device's default."""
    if cluster is not None:
        return cluster
    if "cluster" in doc:
        return doc["cluster"]
    device = doc.get("device")
    from mpipe_core.workloads.presets import DEVICES

    spec = DEVICES.get(device) if isinstance(device, str) else device if isinstance(device, dict) else None
    if isinstance(spec, dict) and "preset" in spec and isinstance(spec["preset"], str):
        spec = {**DEVICES.get(spec["preset"], {}), **spec}
    default = spec.get("cluster") if isinstance(spec, dict) else None
    if not isinstance(default, str):
        raise MpipeError("plan needs a cluster: give --cluster (presets: dgx-a100, dgx-h100, atlas-910b, "
                         "cloudmatrix384) or a `cluster` section in the workload")
    return default


def dies_per_npu(doc: Any) -> int:
    """Dies per NPU of the cluster an analytic workload document runs on (its own
    cluster, else its device's default: 2 on CloudMatrix384, where a device is one die
    of a 910C); 1 for any other document."""
    if not isinstance(doc, Mapping) or "model" not in doc:
        return 1
    try:
        return parse_cluster(resolve_cluster(doc, None)).dies_per_npu
    except MpipeError:
        return 1


def _model_dims(doc: Mapping[str, Any]) -> dict[str, Any]:
    model = doc["model"]
    if isinstance(model, str):
        model = LLMS.get(model, {})
    elif isinstance(model, dict) and "preset" in model:
        model = {**LLMS.get(model["preset"], {}), **model}
    h = model.get("hidden", 0)
    heads = model.get("heads", max(1, int(h) // 128) if h else 1)
    return {"heads": int(heads), "kv_heads": int(model.get("kv_heads", heads)), "layers": int(model.get("layers", 1)),
            "seq_len": int(model.get("seq_len", 1))}


def _encoder_heads(doc: Mapping[str, Any]) -> list[int]:
    out = []
    for enc in doc.get("encoders", []) or []:
        if isinstance(enc, dict) and "vit" in enc:
            vit = enc["vit"]
            spec = VITS.get(vit, {}) if isinstance(vit, str) else (
                {**VITS.get(vit.get("preset"), {}), **vit} if isinstance(vit, dict) else {})
            out.append(int(spec.get("heads", max(1, int(spec.get("hidden", 64)) // 64))))
    return out


DOMINATED = ("distributed_optimizer=false: dominated wherever dp·cp > 1 without overlap_grad_reduce (the same "
             "pipeline, more static memory, a larger gradient sync and a dp·cp times longer optimizer step), "
             "so not evaluated")


def layouts(doc: Mapping[str, Any], devices: int, global_batch: int, cluster: Cluster) -> list[Layout]:
    """Every layout of the space, or an error naming what rules them all out.  Without
    `overlap_grad_reduce` the distributed optimizer is always on where it shards
    anything (`DOMINATED`)."""
    if devices < 1:
        raise MpipeError(f"--devices must be >= 1 (got {devices})")
    if global_batch < 1:
        raise MpipeError(f"--global-batch must be >= 1 (got {global_batch})")
    if cluster.nodes is not None and cluster.nodes * cluster.devices_per_node < devices:
        raise MpipeError(f"cluster {cluster.name} has {cluster.nodes * cluster.devices_per_node} devices "
                         f"({cluster.nodes} nodes of {cluster.devices_per_node}), fewer than --devices {devices}")
    n = cluster.devices_per_node
    if devices > n and devices % n:
        raise MpipeError(f"--devices {devices} is not a multiple of the cluster's {n} devices per node "
                         f"({cluster.name}): a layout beyond one node needs whole nodes")
    dims = _model_dims(doc)
    shaped = []  # (tp, cp, pp, dp) with cp dividing the sequence and pp at most the layers
    for tp in divisors(devices):
        for cp in divisors(devices // tp):
            if dims["seq_len"] % cp:
                continue
            for pp in divisors(devices // (tp * cp)):
                if pp <= dims["layers"]:
                    shaped.append((tp, cp, pp, devices // (tp * cp * pp)))
    heads_ok = [s for s in shaped if dims["heads"] % s[0] == 0 and dims["kv_heads"] % s[0] == 0]
    fit = [s for s in heads_ok if global_batch % s[3] == 0]
    if not fit:
        # The batch is big enough for some layout's replicas but divisible by none of them: the batch;
        # else the heads force more replicas than there are samples: the heads.
        if any(s[3] <= global_batch for s in heads_ok):
            dps = sorted({s[3] for s in heads_ok})
            raise MpipeError(f"--global-batch {global_batch} is not divisible by any data-parallel degree the "
                             f"layouts of {devices} devices allow (dp in {', '.join(map(str, dps))})")
        tps = sorted({s[0] for s in shaped if global_batch % s[3] == 0})
        raise MpipeError(f"no factorization tp·cp·pp·dp = {devices} fits the heads: tp must divide the model's "
                         f"{dims['heads']} attention heads and {dims['kv_heads']} key/value heads, and every "
                         f"layout with a dp dividing the global batch needs tp in {', '.join(map(str, tps))}")
    enc_heads = _encoder_heads(doc)
    section = doc.get("parallel")
    overlap = bool(section.get("overlap_grad_reduce")) if isinstance(section, dict) else False
    out = []
    for tp, cp, pp, dp in fit:
        enc_tps: list[int | None] = [None]
        if enc_heads:
            enc_tps = [t for t in divisors(tp) if all(h % t == 0 for h in enc_heads)]
        for mbs in MICROBATCH_SIZES:
            if (global_batch // dp) % mbs:
                continue
            for dist in ((True,) if dp * cp > 1 and not overlap else (False, True) if dp * cp > 1 else (False,)):
                for etp in enc_tps:
                    out.append(Layout(tp, cp, pp, dp, mbs, dist, etp))
    return out


# ------------------------------------------------------------------ the search


@dataclass
class _Visit:
    layout: Layout
    document: dict
    workload: Workload
    bounds: Bounds
    terms: list[Term]
    best: float = math.inf


def plan(workload: Workload | Mapping[str, Any], devices: int, global_batch: int, cluster: Any = None,
         memory_cap: float | None | str = "capacity", top: int = 5, time_limit: float | None = None,
         progress: Progress | None = None, prune: bool = True, families: tuple[str, ...] | None = None,
         require_fit: bool = True, max_evaluations: int | None = DEFAULT_EVALUATIONS,
         keep: Callable[[str], bool] | None = None) -> PlanResult:
    """Search the layouts of `devices` devices for `global_batch` samples per step.
    `memory_cap`: a number (the workload's memory unit), None (no cap) or
    "capacity" (the device's memory).  `prune=False` evaluates every term of
    the space (the tests' brute force).  `families`: only terms of these
    encoder strategies (`plan_space.TERM_FAMILIES`; the MLLM suite's rows).
    `require_fit=False`: when nothing fits, the result instead of the error
    (its candidates all over the cap; `least_memory` says what the least needs).
    `max_evaluations`: the budget, in terms evaluated (None: no budget); the
    search stops there, whatever the machine's load, so its answer is the
    same on every machine.  `time_limit`: seconds, an optional extra bound
    (None: none) whose answer does depend on the load.  The first term is
    always evaluated.  `keep`: only the terms it accepts (`--runnable-by`:
    those a stack may run, `runnable`)."""
    t0 = time.perf_counter()
    doc = workload.source if isinstance(workload, Workload) else workload
    if doc is None or "model" not in doc:
        raise MpipeError("plan needs an analytic workload (one that names a model and a device)")
    if top < 1:
        raise MpipeError(f"--top must be >= 1 (got {top})")
    if max_evaluations is not None and max_evaluations < 1:
        raise MpipeError(f"--evaluations must be >= 1 (got {max_evaluations})")
    cluster_doc = resolve_cluster(doc, cluster)
    default = None
    cl = parse_cluster(cluster_doc, default)
    space = layouts(doc, devices, global_batch, cl)
    say = progress or (lambda done, total, what: None)
    ruled: dict[str, list[str]] = {}  # axis value -> why its layouts went
    visits: list[_Visit] = []
    cap: float | None = None
    for i, layout in enumerate(space):
        document = layout_document(doc, layout, cluster_doc)
        try:
            wl = parse_workload(document)
        except WorkloadError as error:
            ruled.setdefault(layout.label(), []).append(error.message)
            continue
        if memory_cap == "capacity":
            cap = wl.capacity
        else:
            cap = memory_cap  # type: ignore[assignment]
        m = layout.microbatches(global_batch)
        terms = [t for t in layout_terms(wl, layout.pp, m) if (families is None or t.family in families)
                 and (keep is None or keep(t.text))]
        if terms:
            visits.append(_Visit(layout, document, wl, layout_bounds(wl, layout, m), terms))
        if i % 16 == 0:
            say(0, 0, f"layouts {i + 1}/{len(space)}")
    total_terms = sum(len(v.terms) for v in visits)
    evaluated: list[PlanCandidate] = []
    memory_out: list[_Visit] = []
    counts = {"layouts": len(space), "terms": total_terms, "evaluated": 0, "recompute_tries": 0,
              "pruned_by_bound": 0, "pruned_by_memory": 0, "refused": 0, "not_tried": 0,
              "left_by_budget": 0, "left_by_time": 0, "budget": max_evaluations}
    if prune and cap is not None:
        kept = []
        for v in visits:
            (memory_out if not within(v.bounds.static_memory, cap) else kept).append(v)
        counts["pruned_by_memory"] = sum(len(v.terms) for v in memory_out)
        visits = kept
    visits.sort(key=lambda v: (v.bounds.shared, v.layout))
    fitting: list[float] = []  # step times within the cap, sorted (the K-th is the bar)
    done = 0
    deadline = math.inf if time_limit is None else t0 + time_limit

    def bar() -> float:
        return fitting[top - 1] if prune and len(fitting) >= top else math.inf

    def run(v: _Visit, term: Term) -> None:
        nonlocal done
        done += 1
        m = v.layout.microbatches(global_batch)
        c = _evaluate(v, term.text, term.family, m, cap, counts)
        if c is not None and not c.within_cap:
            # over the cap: recompute the chunks of the over-cap devices, then every chunk
            for variant in _recompute_variants(c, v.workload, cap):
                counts["recompute_tries"] += 1
                r = _evaluate(v, variant, term.family, m, cap, counts)
                if r is not None and r.within_cap:
                    _keep(r)
                    break
        if c is not None:
            _keep(c)
        if done % 8 == 0 or c is not None and c.within_cap and c.step_time_s <= bar():
            best = fitting[0] if fitting else math.inf
            say(done, total_terms, f"best {seconds(best)}" if fitting else "no layout within the cap yet")

    def _keep(c: PlanCandidate) -> None:
        evaluated.append(c)
        if c.within_cap:
            fitting.append(c.step_time_s)
            fitting.sort()
        v_best[c.layout] = min(v_best.get(c.layout, math.inf), c.step_time_s if c.within_cap else math.inf)

    v_best: dict[Layout, float] = {}
    tried: set[tuple[Layout, str]] = set()

    def visit(v: _Visit, term: Term) -> None:
        if (v.layout, term.text) in tried:
            return
        tried.add((v.layout, term.text))
        if prune and v.bounds.term(term, v.layout.pp) > bar() * (1 + 1e-12):
            counts["pruned_by_bound"] += 1
            return
        if evaluated and max_evaluations is not None and done >= max_evaluations:
            counts["not_tried"] += 1
            counts["left_by_budget"] += 1
            return
        if evaluated and time.perf_counter() > deadline:
            counts["not_tried"] += 1
            counts["left_by_time"] += 1
            return
        run(v, term)

    # Phase 0: one probe term per layout, by bound, so the bar is a good one early;
    # phase 1: every cheap term, the layouts the probes ranked best first;
    # phase 2: the expensive terms in the same order.
    for v in visits:
        probe = _probe(v.terms)
        if probe is not None:
            visit(v, probe)
    order = sorted(visits, key=lambda v: (v_best.get(v.layout, math.inf), v.bounds.shared, v.layout))
    for expensive in (False, True):
        for v in order:
            for term in v.terms:
                if term.expensive == expensive:
                    visit(v, term)
        order = sorted(visits, key=lambda v: (v_best.get(v.layout, math.inf), v.bounds.shared, v.layout))
    counts["evaluated_total"] = counts["evaluated"]
    if not evaluated or not any(c.within_cap for c in evaluated):
        if require_fit or not evaluated and not memory_out:
            raise MpipeError(_nothing_fits(evaluated, memory_out, cap, devices))
        evaluated.sort(key=_rank)
        result = PlanResult(devices, global_batch, cl, cap, evaluated, top, [_nothing_fits(evaluated, memory_out,
                                                                                            cap, devices)],
                            counts, time.perf_counter() - t0)
        result.least_memory = min([c.peak_memory for c in evaluated] + [v.bounds.static_memory for v in memory_out])
        return result
    evaluated.sort(key=_rank)
    say(total_terms, total_terms, "done")
    result = PlanResult(devices, global_batch, cl, cap, evaluated, top, [], counts, time.perf_counter() - t0)
    result.ruled_out = ruled_out(result, memory_out, ruled, visits)
    result.seconds = time.perf_counter() - t0
    return result


PROBES = ("balanced(zbv(", "zbv(", "balanced(1f1b(", "1f1b(")


def _probe(terms: list[Term]) -> Term | None:
    """The term that stands for its layout in phase 0: a zero-bubble V body (balanced under encoders)."""
    for prefix in PROBES:
        for t in terms:
            if t.text.startswith(prefix):
                return t
    return terms[0] if terms else None


def _rank(c: PlanCandidate) -> tuple:
    return (not c.within_cap, c.step_time_s, c.peak_memory, c.layout, c.term)


def _evaluate(v: _Visit, term: str, fam: str, m: int, cap: float | None, counts: dict) -> PlanCandidate | None:
    try:
        ev = evaluate(term, v.workload)
        step = ev.step
    except MpipeError:
        counts["refused"] += 1
        return None
    counts["evaluated"] += 1
    peak = max(ev.metrics.peak_memory, default=0.0)
    return PlanCandidate(v.layout, ev.term, fam, m, v.document, step.step_time_s, step.mfu, peak,
                         max(ev.metrics.static_memory, default=0.0), ev.metrics.fits,
                         cap is None or within(peak, cap), step.devices_total,
                         {k: x for k, x in step.breakdown.items() if k != "dp_sync"})


def _recompute_variants(c: PlanCandidate, wl: Workload, cap: float | None) -> list[str]:
    """Recompute tries for a candidate over the cap, least costly first: a trained
    encoder running as ops of its own alone (`encoders=only`), then the LLM chunks
    of the over-cap devices (selective, full), then every chunk, those with the
    encoders too."""
    if cap is None or not within(c.static_memory, cap):
        return []
    from mpipe_core.algebra.combinators.partition import chunk_devices
    from mpipe_core.algebra.terms import parse

    ev = evaluate(c.term, wl)
    over = {d for d, p in enumerate(ev.metrics.peak_memory) if not within(p, cap)}
    placed = chunk_devices(ev.schedule, "llm", ev.schedule.pipelines[0].chunks)
    chunks = [ch for ch, d in enumerate(placed) if d in over]
    ast = parse(c.term)
    own = c.family not in ("balanced",) and not ev.schedule.pipelines[0].encoder_layers and any(
        e.trainable and e.activations(1, "full")[0] < e.activations(1)[0] for e in wl.encoders)
    out = [with_recompute(ast, "full", None, "only")] if own else []
    both = "yes" if own else "no"
    if wl.llm.kept_activation("selective") < wl.llm.activation and chunks:
        out.append(with_recompute(ast, "selective", chunks, both))
    if chunks and len(chunks) < len(placed):
        out.append(with_recompute(ast, "full", chunks, both))
    out.append(with_recompute(ast, "full", None, both))
    return out


# ------------------------------------------------------------------ reasons


def ruled_out(result: PlanResult, memory_out: list[_Visit], refused: dict[str, list[str]],
              visits: list[_Visit]) -> list[str]:
    """Why each axis value and encoder strategy is not in the top K: memory (its
    static memory alone, or the least any of its candidates needs), its bound
    above the K-th best, or its best step time and what costs it."""
    top = result.shown()
    best = result.best
    unit = f" {result.memory_unit}"
    cap = result.memory_cap
    lines: list[str] = []
    axes = ("tp", "cp", "pp", "dp", "mbs")
    shown_values = {axis: {getattr(c.layout, axis) for c in top} for axis in axes}
    for axis in axes:
        values = sorted({getattr(v.layout, axis) for v in visits + memory_out})
        for value in values:
            if value in shown_values[axis]:
                continue
            mine = [c for c in result.candidates if getattr(c.layout, axis) == value]
            fitting = [c for c in mine if c.within_cap]
            name = f"{axis}={value}"
            if fitting:
                c = fitting[0]
                extra = _tp_note(c, result) if axis == "tp" else ""
                lines.append(f"{name}: best {seconds(c.step_time_s)} ({c.step_time_s / best.step_time_s - 1:+.0%} "
                             f"over the best), {c.layout.label()} {c.term}{extra}")
            elif mine:
                least = min(mine, key=lambda c: c.peak_memory)
                lines.append(f"{name} does not fit: {least.peak_memory:.4g}{unit} > {cap:.4g}{unit} "
                             f"(the least any of its candidates needs, {least.layout.label()} {least.term})")
            else:
                out = [v for v in memory_out if getattr(v.layout, axis) == value]
                if out and len(out) == len([v for v in visits + memory_out if getattr(v.layout, axis) == value]):
                    least = min(out, key=lambda v: v.bounds.static_memory)
                    lines.append(f"{name} does not fit: {least.bounds.static_memory:.4g}{unit} > {cap:.4g}{unit} "
                                 f"(static memory alone, at least, {least.layout.label()})")
                else:
                    mine_v = [v for v in visits if getattr(v.layout, axis) == value]
                    if mine_v:
                        low = min(v.bounds.shared for v in mine_v)
                        lines.append(f"{name}: pruned, its lower bound {seconds(low)} is above the "
                                     f"{ordinal(min(result.top, len(result.candidates)))} best")
    fams = result.best_of_family()
    for fam, c in fams.items():
        if c.family == best.family:
            continue
        lines.append(f"{fam}: best {seconds(c.step_time_s)} ({c.step_time_s / best.step_time_s - 1:+.0%} over the "
                     f"best), {c.layout.label()} {c.term}")
    for fam in sorted({c.family for c in result.candidates} - set(fams)):
        least = min((c for c in result.candidates if c.family == fam), key=lambda c: c.peak_memory)
        lines.append(f"{fam} does not fit: {least.peak_memory:.4g}{unit} > {cap:.4g}{unit} "
                     f"({least.layout.label()} {least.term})")
    if not any(not v.layout.distributed_optimizer and v.layout.dp * v.layout.cp > 1 for v in visits + memory_out):
        lines.append(DOMINATED)
    for label, messages in list(refused.items())[:5]:
        lines.append(f"{label}: {messages[0]}")
    return lines


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _tp_note(c: PlanCandidate, result: PlanResult) -> str:
    """For tp beyond one node: how much its layer communication grows over the scale-up link."""
    n = result.cluster.devices_per_node
    if c.layout.tp <= n:
        return ""
    doc = dict(c.document)
    doc["cluster"] = {**(doc["cluster"] if isinstance(doc["cluster"], dict) else {"preset": doc["cluster"]}),
                      "devices_per_node": c.layout.tp * c.layout.cp}
    try:
        inside = sum(parse_workload(doc).step.tp_layer)
    except MpipeError:
        return ""
    actual = sum(parse_workload(c.document).step.tp_layer)
    return f"; tp={c.layout.tp} crosses nodes: {actual / inside - 1:+.0%} TP time" if inside > 0 else ""


def _nothing_fits(evaluated: list[PlanCandidate], memory_out: list[_Visit], cap: float | None, devices: int) -> str:
    if evaluated:
        least = min(evaluated, key=lambda c: c.peak_memory)
        return (f"no layout of {devices} devices fits the memory cap {cap:.4g} GB: the least any candidate needs "
                f"is {least.peak_memory:.4g} GB ({least.layout.label()} {least.term}); --memory-cap none "
                f"searches without a cap")
    if memory_out:
        least = min(memory_out, key=lambda v: v.bounds.static_memory)
        return (f"no layout of {devices} devices fits the memory cap {cap:.4g} GB: static memory alone is at "
                f"least {least.bounds.static_memory:.4g} GB a device ({least.layout.label()})")
    return f"no term of any layout of {devices} devices could be evaluated"


# ------------------------------------------------------------------ the device map


def device_map(candidate: PlanCandidate, cluster: Cluster) -> dict[str, Any]:
    """Which ranks form each TP, CP, DP and PP group and where each rank sits
    (node, domain), under the cluster's rank order (Megatron's tp-cp-dp-pp)."""
    lay = candidate.layout
    sizes = {"tp": lay.tp, "cp": lay.cp, "dp": lay.dp, "pp": lay.pp}
    st = strides(cluster.order, sizes)
    world = lay.tp * lay.cp * lay.dp * lay.pp
    ranks = []
    for r in range(world):
        coords = {d: (r // st[d]) % sizes[d] for d in sizes}
        node = r // cluster.devices_per_node
        ranks.append({"rank": r, **coords, "node": node, "domain": node // cluster.nodes_per_domain})
    groups: dict[str, list[list[int]]] = {}
    for dim in sizes:
        seen: dict[tuple, list[int]] = {}
        for rank in ranks:
            key = tuple(rank[d] for d in sizes if d != dim)
            seen.setdefault(key, []).append(rank["rank"])
        groups[dim] = list(seen.values())
    return {"devices_per_node": cluster.devices_per_node, "nodes_per_domain": cluster.nodes_per_domain,
            "order": "-".join(cluster.order), "ranks": ranks, "groups": groups}
