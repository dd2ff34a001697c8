"""Calibration: per-op costs fitted from a run's measured timings, written as
an explicit workload on which the simulator predicts what was measured.

    cal = calibrate_run(db, run_id)
    cal.workload          # explicit workload (milliseconds), save or write it
    cal.predicted_ms, cal.measured_ms, cal.error

The model the simulator has of a step: each device runs its ops in order;
an op starts when the previous one on its device has ended and its inputs
have arrived (producer's end + link latency if remote), then takes its cost.
Measured, each op also pays a dispatch gap before it starts (posting
receives, checking inputs, Python): so the fit is

* `overhead`: the mean gap before ops whose inputs were already there (their
  start minus the previous op's end on the same device); it is folded into
  every op's cost, and written as `host.dispatch` so that an encoder
  microbatch split into k shards pays it k times;
* op cost = mean measured duration + overhead, per (module, kind, chunk) for
  the LLM, per (kind, microbatch) for an encoder (shards added up), so a
  microbatch with more images costs more;
* link latency: the mean wait of ops whose last input came from another
  device (start minus the producer's end), less the overhead.

Means, not medians, by default: a makespan is a sum of op times along the
critical path, and the expected sum is the sum of the means (CPU timings are
skewed).  `fit(..., statistic="median")` fits medians instead (robust to a
burst of background load on a shared host); either way the prediction is
compared with the same statistic of the measured steps.  The
first step is warm-up (allocations, gloo connections) and is left out when
there are others; steps a crashed run did not finish are left out.

The LLM's fused `BW` cost is split evenly into `B` and `W` when a schedule
has no split backward (the sum is what a fused schedule pays).  An encoder's
recompute `R` is costed as its forward by the core's workload model; its
measured time is reported but cannot be expressed.  Parameter broadcast and
all-reduce cost the fitted latency (no bandwidth term is fitted); `colocated`'s
barriers cost nothing, their tokens the latency.  An encoder op serving a group
of microbatches (`encoder_batch`) is costed at the group's first microbatch.

`portable_workload()` gives per-layer LLM costs and per-image encoder costs:
the form to evaluate other terms (other p, v, m) on.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from mpipe_core.ir.ops import COLLECTIVE_KINDS, LLM, Op, base_module, format_op

from ..errors import CalibrationError

MS = 1000.0
STATISTICS = {"mean": statistics.fmean, "median": statistics.median}


# --------------------------------------------------------------------------- measured runs

@dataclass
class MeasuredRun:
    """A run's timings matched to the ops of its schedule."""

    run_id: int | None
    term: str
    evaluation: Any  # mpipe_core.api.Evaluation of the run's term on its own workload
    steps: dict[int, dict[Op, Any]]  # complete steps: op -> timing row
    partial_steps: list[int]  # steps with some ops missing (a crash, a stop)
    rows: int

    @property
    def used_steps(self) -> list[int]:
        """The steps measurements come from: all complete ones but the first (warm-up)."""
        done = sorted(self.steps)
        return done[1:] if len(done) > 1 else done

    def span(self, step: int) -> tuple[float, float]:
        ops = self.steps[step].values()
        return min(r.start for r in ops), max(r.end for r in ops)

    def makespans_ms(self) -> list[float]:
        return [(b - a) * MS for a, b in (self.span(s) for s in self.used_steps)]

    @property
    def makespan_ms(self) -> float:
        return statistics.fmean(self.makespans_ms())


def match_rows(schedule, rows: Iterable[Any]) -> tuple[dict[int, dict[Op, Any]], list[int]]:
    """Timing rows -> {step: {op: row}} for the steps where every op was timed.

    Rows are `TimelineRecord`s (device = rank); a term with inner steps
    (`repeat`) repeats those keys on a device, in order, so the k-th row of a
    key is the k-th op with that key in the device's order."""
    occurrences: list[dict[tuple, list[Op]]] = []
    for order in schedule.orders:
        occ: dict[tuple, list[Op]] = defaultdict(list)
        for op in order:
            occ[(op.module, op.kind, op.chunk, op.mb)].append(op)
        occurrences.append(occ)
    grouped: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for row in rows:
        grouped[(row.step, row.device)].append(row)
    steps: dict[int, dict[Op, Any]] = defaultdict(dict)
    for (step, rank), items in grouped.items():
        if rank >= len(occurrences):
            continue
        seen: dict[tuple, int] = defaultdict(int)
        for row in sorted(items, key=lambda r: r.start):
            key = (row.module, row.kind, row.chunk, row.microbatch)
            ops = occurrences[rank].get(key, [])
            k = seen[key]
            seen[key] += 1
            if k < len(ops):
                steps[step][ops[k]] = row
    total = schedule.num_ops
    complete = {s: ops for s, ops in steps.items() if len(ops) == total}
    partial = sorted(s for s in steps if s not in complete)
    return dict(sorted(complete.items())), partial


def load_measured(db, run_id: int) -> MeasuredRun:
    """The run's timings and its schedule, re-evaluated from the saved version."""
    from mpipe_core.api import evaluate_once as evaluate
    from storage import get_run, get_version, timings_for

    run = get_run(db, run_id)
    version = get_version(db, run.ref)
    rows = timings_for(db, run_id)
    if not rows:
        raise CalibrationError(f"run {run_id} ({run.status}) has no timings")
    evaluation = evaluate(version.term, version.workload)
    steps, partial = match_rows(evaluation.schedule, rows)
    if not steps:
        raise CalibrationError(f"run {run_id} ({run.status}) has {len(rows)} timings but no complete step "
                               f"(steps seen: {partial})")
    return MeasuredRun(run_id, evaluation.term, evaluation, steps, partial, len(rows))


def measured_from_rows(term: str, workload: Any, rows: Iterable[Any]) -> MeasuredRun:
    """The same from timing rows in hand (`TimelineRecord`s, seconds)."""
    from mpipe_core.api import evaluate_once as evaluate

    evaluation = evaluate(term, workload)
    rows = list(rows)
    steps, partial = match_rows(evaluation.schedule, rows)
    if not steps:
        raise CalibrationError(f"no complete step among {len(rows)} timings")
    return MeasuredRun(None, evaluation.term, evaluation, steps, partial, len(rows))


# --------------------------------------------------------------------------- the fit

@dataclass
class OpCost:
    """Measured time of one op group, in milliseconds (overhead not included);
    `mean_ms` is the fit's statistic (the mean unless `fit(statistic="median")`).

    For an encoder microbatch split into shards, `mean_ms` is the whole
    microbatch (its shards added up) and `min_ms`/`max_ms` are single shards."""

    module: str
    kind: str
    chunk: int | None  # LLM chunk; None for an encoder (costed per microbatch)
    microbatch: int | None  # encoder microbatch; None for the LLM
    samples: int
    mean_ms: float
    min_ms: float
    max_ms: float
    cost_ms: float  # what the calibrated workload charges (mean + overhead, shards added up)

    @property
    def label(self) -> str:
        where = f"chunk {self.chunk}" if self.chunk is not None else f"mb {self.microbatch}"
        return f"{self.module} {self.kind} {where}"


@dataclass
class Calibration:
    run_id: int | None
    term: str
    workload: dict[str, Any]  # explicit, milliseconds
    costs: list[OpCost]
    overhead_ms: float
    latency_ms: float
    steps: list[int]
    measured_steps_ms: list[float]
    measured_ms: float
    predicted_ms: float
    base_workload: dict[str, Any] = field(repr=False, default_factory=dict)
    image_counts: list[int] = field(repr=False, default_factory=list)
    statistic: str = "mean"
    host_fit: Any = field(repr=False, default=None)  # `host_fit.HostFit`: contention from the run's overlaps

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_ms / self.measured_ms - 1.0 if self.measured_ms else float("nan")

    def portable_workload(self) -> dict[str, Any]:
        """Per-layer LLM costs and per-image encoder costs (no per-chunk or
        per-microbatch lists): for evaluating other terms on this hardware."""
        doc = _copy(self.workload)
        llm = doc["llm"]
        table = llm.pop("chunk_costs", None) or llm.pop("layer_costs", None)
        if table is not None:
            layers = llm.get("layers") or len(table["F"])
            for kind in ("F", "B", "W"):
                llm[kind.lower()] = sum(table[kind]) / layers
        for enc in doc.get("encoders", []):
            per_image = enc.get("images") is not None
            for key in ("f", "b", "w"):
                value = enc.get(key)
                if isinstance(value, list):
                    if per_image and self.image_counts:
                        # mean cost of one image, weighted by how many each microbatch had
                        total = sum(v * n for v, n in zip(value, self.image_counts))
                        enc[key] = total / max(1, sum(self.image_counts))
                    else:
                        enc[key] = statistics.fmean(value)
        doc["name"] = f"{doc.get('name', 'calibrated')}-portable"
        return doc

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "term": self.term, "unit": "ms",
            "steps": self.steps, "measured_steps_ms": self.measured_steps_ms,
            "measured_ms": self.measured_ms, "predicted_ms": self.predicted_ms, "error": self.error,
            "overhead_ms": self.overhead_ms, "latency_ms": self.latency_ms,
            "costs": [dict(asdict(c), label=c.label) for c in self.costs],
            "contention": None if self.host_fit is None else self.host_fit.as_dict(),
            "workload": self.workload,
        }

    def format(self) -> str:
        lines = [f"calibrated {self.term}" + (f" from run {self.run_id}" if self.run_id is not None else ""),
                 f"steps used {_steps_text(self.steps)} ({self.statistic} of {len(self.steps)}); times in ms",
                 f"dispatch overhead {self.overhead_ms:.3f} per op (folded into each cost), "
                 f"link latency {self.latency_ms:.3f}"]
        if self.host_fit is not None:
            lines.append("host contention from the run's overlapping ops: " + self.host_fit.summary())
        lines.append("")
        header = ["op", "samples", "mean", "min", "max", "cost"]
        rows = [[c.label, str(c.samples), f"{c.mean_ms:.3f}", f"{c.min_ms:.3f}", f"{c.max_ms:.3f}",
                 f"{c.cost_ms:.3f}"] for c in self.costs]
        lines += _table(rows, header)
        lines += ["", f"measured makespan  {self.measured_ms:.2f}  (per step: "
                  + " ".join(f"{x:.1f}" for x in self.measured_steps_ms) + ")",
                  f"predicted makespan {self.predicted_ms:.2f}  (the same term on the calibrated workload)",
                  f"error              {self.error:+.1%}"]
        return "\n".join(lines)


@dataclass
class Dispatch:
    """How a measured run spends the time between ops (seconds)."""

    overhead: float  # mean gap before an op whose inputs were there: dispatch cost
    latency: float  # mean extra wait for an input from another device
    durations: dict[tuple, list[float]]  # op group -> measured durations


def dispatch(measured: MeasuredRun, host: Any = None, statistic: str = "mean") -> Dispatch:
    """Split the measured gaps between ops into dispatch overhead and link
    latency, and collect op durations by group (the steps `used_steps`).

    With a `host` (`mpipe_core.workloads.hardware.Host`) whose devices contend, an op's
    duration is what it would have taken alone (`contention.solo_work`)."""
    from mpipe_core.simulation.contention import solo_work
    from mpipe_core.simulation.dataflow import collect_facts, predecessors

    schedule = measured.evaluation.schedule
    index = {op: d for d, order in enumerate(schedule.orders) for op in order}
    facts = collect_facts(schedule)
    local_gaps: list[float] = []
    remote_waits: list[float] = []
    durations: dict[tuple, list[float]] = defaultdict(list)
    for step in measured.used_steps:
        ops = measured.steps[step]
        origin, _ = measured.span(step)
        own = _durations(schedule, ops, host, solo_work)
        for d, order in enumerate(schedule.orders):
            prev_end = origin
            for op in order:
                row = ops[op]
                durations[_group(op)].append(own[op])
                remote_end = None
                for producer, _edge in predecessors(tuple(op), d, facts, index):
                    if index.get(producer) not in (None, d):
                        end = ops[Op(*producer)].end
                        remote_end = end if remote_end is None else max(remote_end, end)
                # (an input that arrived with the previous op's end counts as the binding one)
                if remote_end is None or remote_end < prev_end - 1e-6:
                    local_gaps.append(max(0.0, row.start - prev_end))
                else:
                    remote_waits.append(max(0.0, row.start - remote_end))
                prev_end = row.end
    stat = STATISTICS[statistic]
    overhead = stat(local_gaps) if local_gaps else 0.0
    latency = max(0.0, stat(remote_waits) - overhead) if remote_waits else 0.0
    return Dispatch(overhead, latency, dict(durations))


def fit(measured: MeasuredRun, *, name: str | None = None, host: dict | None = None,
        statistic: str = "mean", fit_contention: bool = True) -> Calibration:
    """Fit the calibrated workload to a measured run (see the module docstring).

    Host contention: with `fit_contention` (the default) the run's own
    overlapping ops give `host.contention` / `host.pairs`
    (`executor.analysis.host_fit`), and `host` (`{"devices", "contention",
    "pairs", "dispatch"}`, e.g. from `executor.runtime.contention_probe`) is
    only the prior; without, `host` is taken as it is.  Op costs are then solo
    costs, and the simulator adds the slowdown where ops overlap; the host's
    `dispatch` (an op's fixed part) is added to the measured per-op gap.

    `statistic`: "mean" (the default) or "median" of the op times and gaps;
    the calibration's measured makespan is the same statistic of its steps."""
    from mpipe_core.api import evaluate_once as evaluate
    from mpipe_core.workloads.hardware import parse_host
    from mpipe_core.workloads.workload import explicit_dict

    host_fit = None
    if fit_contention and measured.evaluation.schedule.devices > 1:
        from .host_fit import fit_host

        host_fit = fit_host([measured], prior=host)
        fitted = host_fit.host
        contends = parse_host(fitted).contends
        host = fitted if (contends or host) else None
    ev = measured.evaluation
    schedule = ev.schedule
    used = measured.used_steps
    stat = STATISTICS[statistic]
    gaps = dispatch(measured, parse_host(host), statistic)
    overhead, latency, durations = gaps.overhead, gaps.latency, gaps.durations

    costs: list[OpCost] = []
    mean = {key: stat(v) for key, v in durations.items()}
    doc = explicit_dict(ev.workload)
    base = _copy(doc)
    doc["name"] = name or f"calibrated-{measured.run_id if measured.run_id is not None else 'run'}"
    source = "measured timings" if measured.run_id is None else f"run {measured.run_id}"
    doc["description"] = f"calibrated from {source} ({measured.term}), steps {_steps_text(used)}; times in ms"
    doc["link"] = {"latency": latency * MS, "bandwidth": None}
    if host or overhead > 0:
        # The per-op gap measured here plus any fixed part of an op the host's probe found.
        doc["host"] = dict(host or {}, dispatch=overhead * MS + (host or {}).get("dispatch", 0.0))
    doc["units"] = {"time": "ms", "memory": ev.workload.memory_unit}  # measured times are milliseconds

    # LLM: per (kind, chunk), every replica's copy pooled.
    chunks = max(p.chunks for p in schedule.pipelines)
    llm: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (module, kind, chunk, _mb), values in durations.items():
        if base_module(module) == LLM:
            llm[(kind, chunk)] += values
    table: dict[str, list[float]] = {"F": [], "B": [], "W": []}
    for c in range(chunks):
        f = _cost(llm, ("F", c), overhead, costs, LLM, stat)
        if llm.get(("B", c)):
            b = _cost(llm, ("B", c), overhead, costs, LLM, stat)
            w = _cost(llm, ("W", c), overhead, costs, LLM, stat)
        else:
            bw = _cost(llm, ("BW", c), overhead, costs, LLM, stat)
            b = w = bw / 2
        table["F"].append(f)
        table["B"].append(b)
        table["W"].append(w)
    _write_llm_costs(doc["llm"], schedule, table)

    # Encoders: per (kind, microbatch), shards added up; copies of the model (par/overlay) averaged.
    microbatches = max(p.microbatches for p in schedule.pipelines)
    counts: list[int] = []
    for enc in doc.get("encoders", []):
        wl_enc = ev.workload.encoder(enc["name"])
        counts = wl_enc.image_counts(microbatches)
        per_image = wl_enc.images is not None
        groups: dict[tuple[str, int], list[tuple[str, float, list[float]]]] = defaultdict(list)
        for (module, kind, chunk, mb), values in durations.items():
            if base_module(module) == enc["name"]:
                groups[(kind, mb)].append((module, mean[(module, kind, chunk, mb)], values))
        kinds = {k for k, _ in groups}
        per_kind: dict[str, list[float]] = {}
        for kind in sorted(kinds):
            if kind in COLLECTIVE_KINDS:  # broadcast, all-reduce, colocated's barriers: listed, not fitted
                values = [v for (k, _), parts in groups.items() if k == kind for _, _, vs in parts for v in vs]
                costs.append(_op_cost(enc["name"], kind, None, None, values, 0.0, stat))
                continue
            row = []
            for mb in range(microbatches):
                parts = groups.get((kind, mb), [])
                values = [v for _, _, vs in parts for v in vs]
                copies = max(1, len({module for module, _, _ in parts}))
                measured_mb = sum(m for _, m, _ in parts) / copies  # every shard of one copy
                # One dispatch: the cost model adds it back to every shard (`host.dispatch`).
                total = measured_mb + overhead
                if values:
                    item = _op_cost(enc["name"], kind, None, mb, values, 0.0, stat)
                    item.mean_ms = measured_mb * MS
                    item.cost_ms = total * MS
                    costs.append(item)
                row.append(total * MS)
            per_kind[kind] = row
        scale = [max(1, n) for n in counts] if per_image else [1] * microbatches
        if "F" in per_kind:
            enc["f"] = [v / n for v, n in zip(per_kind["F"], scale)]
        if "B" in per_kind:
            enc["b"] = [v / n for v, n in zip(per_kind["B"], scale)]
            enc["w"] = [v / n for v, n in zip(per_kind.get("W", per_kind["B"]), scale)]
        elif "BW" in per_kind:
            enc["b"] = enc["w"] = [v / n / 2 for v, n in zip(per_kind["BW"], scale)]

    order = {k: i for i, k in enumerate(("F", "B", "W", "BW", "R", "BCAST", "GATHER", "SCATTER", "AR"))}
    costs.sort(key=lambda c: (c.module != LLM, c.module, c.chunk if c.chunk is not None else -1,
                              order.get(c.kind, 99), c.microbatch if c.microbatch is not None else -1))
    predicted = evaluate(ev.ast, doc).timeline
    predicted_ms = predicted.makespan - min(predicted.start, default=0.0)
    return Calibration(
        run_id=measured.run_id, term=measured.term, workload=doc, costs=costs,
        overhead_ms=overhead * MS, latency_ms=latency * MS, steps=used,
        measured_steps_ms=measured.makespans_ms(), measured_ms=stat(measured.makespans_ms()),
        predicted_ms=predicted_ms, base_workload=base, image_counts=counts, statistic=statistic,
        host_fit=host_fit,
    )


def calibrate_run(db, run_id: int, *, name: str | None = None, statistic: str = "mean") -> Calibration:
    if statistic not in STATISTICS:
        raise CalibrationError(f"statistic must be one of {', '.join(STATISTICS)}, not {statistic!r}")
    return fit(load_measured(db, run_id), name=name, statistic=statistic)


# --------------------------------------------------------------------------- helpers

def _write_llm_costs(llm: dict, schedule, table: dict[str, list[float]]) -> None:
    """The fitted per-chunk costs into the workload's LLM section: as `chunk_costs`,
    or, for a `partition(...)` term (which needs per-layer costs), as `layer_costs`
    spreading each chunk's cost evenly over its layers, so the same split gives
    back the measured chunk costs (the embedding's and head's share included)."""
    pipes = schedule.pipelines
    layers = pipes[0].layers if len(pipes) == 1 and pipes[0].encoder_layers is None else None
    if layers is None or any(k <= 0 for k in layers):
        llm.pop("layer_costs", None)
        llm["chunk_costs"] = table
        return
    llm["layers"] = sum(layers)
    llm["layer_costs"] = {kind: [table[kind][c] / k for c, k in enumerate(layers) for _ in range(k)]
                          for kind in ("F", "B", "W")}
    for key in ("chunk_costs", "embed", "head"):
        llm.pop(key, None)


def _durations(schedule, ops: dict, host, solo_work) -> dict:
    """Each op's measured duration, or its solo work on a contended host."""
    keys = [op for order in schedule.orders for op in order]
    device = [d for d, order in enumerate(schedule.orders) for _ in order]
    start = [ops[op].start for op in keys]
    end = [ops[op].end for op in keys]
    return dict(zip(keys, solo_work(device, start, end, host, keys)))


def _group(op: Op) -> tuple:
    """Ops timed together: the inner step (`repeat`) is pooled."""
    return (op.module, op.kind, op.chunk, op.mb if base_module(op.module) != LLM else -1)


def _op_cost(module, kind, chunk, mb, values, overhead, stat=statistics.fmean) -> OpCost:
    m = stat(values)
    return OpCost(module, kind, chunk, mb, len(values), m * MS, min(values) * MS, max(values) * MS,
                  (m + overhead) * MS)


def _cost(groups, key, overhead, costs: list[OpCost], module: str, stat=statistics.fmean) -> float:
    values = groups.get(key)
    if not values:
        return 0.0
    item = _op_cost(module, key[0], key[1], None, values, overhead, stat)
    costs.append(item)
    return item.cost_ms


def _copy(doc):
    import json

    return json.loads(json.dumps(doc))


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "-"
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{steps[0]}..{steps[-1]}"
    return ",".join(str(s) for s in steps)


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for n, row in enumerate([header, *rows]):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return out


__all__ = ["Calibration", "CalibrationError", "MeasuredRun", "OpCost", "calibrate_run", "fit",
           "load_measured", "match_rows", "measured_from_rows", "format_op"]
