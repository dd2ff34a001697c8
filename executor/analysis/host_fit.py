"""The host-contention model (`host.contention`, `host.pairs`) fitted from a
run's own overlapping ops; a probe's figures, when there are any, are only the
prior.

Model (`mpipe_core.simulation.contention`): an op of class A (llm or encoder) that runs
while other devices of its host are busy advances at 1 / (1 + sum of c(A, B))
over those devices' op classes B; so an op's solo work is the sum, over the
stretches of its life, of stretch length / (1 + sum c).  Ops of one group (an
LLM op kind and chunk, every microbatch pooled; an encoder op kind, each
microbatch scaled by its cost in the run's workload) cost the same solo; what
differs between them is what ran beside them.  So the c under which one solo
cost per group best explains its ops' measured times are the run's own
contention:

    minimise  sum_i ((d_i - k_g a_i) / mean_g)^2 / (2 s^2)  +  sum_pairs (c - prior)^2 / (2 tau^2)

over c >= 0, d_i an op's measured time (scaled), a_i the slowdown it ran under
(its time over its solo work), k_g its group's solo cost (least squares for
each c), mean_g the group's mean measured time, s^2
the relative variance the fit leaves (re-estimated over three rounds, at
least (0.1%)^2: so the data weigh as many ops as there are),
tau = 0.15 around a probe's c (probes drift by about that between launches,
docs/simulator-assumptions.md) and 0.5 around 0 without one.  A pair whose
victims spent under 2% of their time beside that class (or fewer than 3 ops)
keeps its prior: the run says nothing about it.  Each victim class is fitted
on its own (its c(A, .) move only its ops' solo times), by coordinate descent
with a golden-section search per coordinate, the prior and 0 also tried.

Confounded with it, and left there: anything else that makes an op slower
when others run, or faster when it ran after a wait (docs/simulator-assumptions.md).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from mpipe_core.ir.ops import LLM, base_module
from mpipe_core.simulation.contention import op_class
from mpipe_core.workloads.hardware import OP_CLASSES, Host, parse_host

PRIOR_TAU, NO_PRIOR_TAU = 0.15, 0.5
MIN_SHARE, MIN_OPS = 0.02, 3
C_MAX = 3.0
ROUNDS = 3
NOISE_FLOOR = 1e-6  # (0.1% relative scatter of solo times, squared) below this the data are taken as exact
GROUP_KINDS = ("F", "B", "W", "BW")


@dataclass
class PairFit:
    victim: str
    other: str
    c: float
    prior: float
    beside_ms: float  # victim op time spent beside a busy device of `other`
    ops: int  # victim ops that had any of it
    fitted: bool  # False: too little exposure, the prior kept


@dataclass
class HostFit:
    host: dict[str, Any]  # the workload's host section
    pairs: list[PairFit] = field(default_factory=list)
    scalar: bool = False  # one c for every pair (`host.contention`) rather than `host.pairs`
    prior_given: bool = False

    def summary(self) -> str:
        parts = []
        for p in self.pairs:
            where = "all pairs" if self.scalar else f"{p.victim}|{p.other}"
            state = (f"{p.c:.2f} (fitted from {p.ops} ops, {p.beside_ms:.0f} ms beside; prior {p.prior:.2f})"
                     if p.fitted else f"{p.c:.2f} (prior kept: {p.beside_ms:.0f} ms beside)")
            parts.append(f"{where} {state}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "scalar": self.scalar, "prior_given": self.prior_given,
                "pairs": [p.__dict__ for p in self.pairs]}


def _exposure(measured_runs: list, host: Host):
    """Per op of every used step: (group, scale, class) and its life's stretches
    as (op index, length, busy llm others, busy encoder others)."""
    ops: list[tuple[Any, float, str]] = []
    segs: list[tuple[int, float, int, int]] = []
    for k, m in enumerate(measured_runs):
        schedule = m.evaluation.schedule
        wl = m.evaluation.workload
        placement = {op: d for d, order in enumerate(schedule.orders) for op in order}
        shards: dict[tuple, int] = defaultdict(int)
        for op in placement:
            if base_module(op.module) != LLM and op.kind == "F":
                shards[(op.module, op.mb, op.step)] += 1
        micro = max((p.microbatches for p in schedule.pipelines), default=1)
        enc_costs: dict[tuple, list[float]] = {}
        for step in m.used_steps:
            rows = []
            for op, row in m.steps[step].items():
                d = placement[op]
                cls = op_class(op)
                group, scale = None, 1.0
                if op.kind in GROUP_KINDS and row.end > row.start:
                    if cls == "llm":
                        group = (k, op.module, op.kind, op.chunk)
                    else:
                        name = base_module(op.module)
                        key = (name, op.kind)
                        if key not in enc_costs:
                            try:
                                enc_costs[key] = wl.encoder(name).costs(op.kind, micro)
                            except Exception:  # noqa: BLE001 - an encoder the workload lacks: no scale
                                enc_costs[key] = [1.0] * micro
                        costs = enc_costs[key]
                        mean = statistics.fmean(costs) if costs else 0.0
                        if mean > 0 and 0 <= op.mb < len(costs) and costs[op.mb] > 0:
                            n = shards.get((op.module, op.mb, op.step), 1)
                            # pooled over the runs given: an encoder op costs the same in any schedule
                            group, scale = ("encoder", name, op.kind, n), costs[op.mb] / mean
                rows.append((len(ops), d, row.start, row.end, cls))
                ops.append((group, scale, cls))
            by_host: dict[int, list] = defaultdict(list)
            for item in rows:
                by_host[host.host_of(item[1])].append(item)
            for members in by_host.values():
                events = sorted([(s, 1, i) for i, _, s, _, _ in members] + [(e, 0, i) for i, _, _, e, _ in members])
                cls_of = {i: c for i, _, _, _, c in members}
                active: set[int] = set()
                last = None
                for t, opening, i in events:
                    if active and last is not None and t > last:
                        n_llm = sum(1 for j in active if cls_of[j] == "llm")
                        n_enc = len(active) - n_llm
                        for j in active:
                            mine = cls_of[j] == "llm"
                            segs.append((j, t - last, n_llm - (1 if mine else 0), n_enc - (0 if mine else 1)))
                    last = t
                    if opening:
                        active.add(i)
                    else:
                        active.discard(i)
    return ops, segs


def golden_minimum(f, lo: float, hi: float, tries: Iterable[float] = (), iters: int = 40) -> float:
    """The x in [lo, hi] minimising a unimodal f (golden-section search, `iters`
    narrowing steps), or one of `tries` where f is lower there."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = f(x1), f(x2)
    for _ in range(iters):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = f(x2)
    best = min([(f1, x1), (f2, x2)] + [(f(t), t) for t in tries if lo <= t <= hi])
    return best[1]


class _Victims:
    """The ops of one victim class (or all, for one scalar c) as arrays."""

    def __init__(self, ops, segs, classes: tuple[str, ...]):
        keep = [i for i, (g, _, c) in enumerate(ops) if c in classes]
        index = {i: n for n, i in enumerate(keep)}
        sel = [s for s in segs if s[0] in index]
        self.n = len(keep)
        self.seg_op = np.array([index[s[0]] for s in sel], dtype=np.int64)
        self.seg_t = np.array([s[1] for s in sel], dtype=float)
        self.seg_l = np.array([s[2] for s in sel], dtype=float)
        self.seg_e = np.array([s[3] for s in sel], dtype=float)
        groups = [ops[i][0] for i in keep]
        self.scale = np.array([ops[i][1] for i in keep], dtype=float)
        names = {g for g in groups if g is not None}
        counts = defaultdict(int)
        for g in groups:
            counts[g] += 1
        ids = {g: n for n, g in enumerate(sorted(names, key=repr)) if counts[g] >= 2}
        self.group = np.array([ids.get(g, -1) for g in groups], dtype=np.int64)
        self.used = self.group >= 0
        self.groups = len(ids)
        self.total = float(self.seg_t.sum())
        self.measured = np.bincount(self.seg_op, self.seg_t, minlength=self.n)  # each op's duration

    def exposure(self, which: str) -> tuple[float, int]:
        """(time, ops) of these victims beside at least one busy `which` device."""
        mask = (self.seg_l if which == "llm" else self.seg_e) > 0
        ops = len(set(self.seg_op[mask & self.used[self.seg_op]].tolist())) if self.n else 0
        return float(self.seg_t[mask].sum()), ops

    def scatter(self, c_llm: float, c_enc: float) -> float:
        """How far the measured op times are from the model's: each op's time is
        its group's solo cost times the slowdown it ran under, so for given c the
        group's cost is the least-squares one and this is the sum of squared
        residuals, relative to the group's mean measured time.  Residuals of
        measured times, as a step adds them up: the c that predicts steps is the
        mean slowdown (a background process that shares a rank's core now and
        then slows a few ops a lot and most not at all; a median fit saw none of
        it, and one of solo times drifted high, shrinking the slowed ops' spread)."""
        if not self.groups:
            return 0.0
        solo = np.bincount(self.seg_op, self.seg_t / (1.0 + self.seg_l * c_llm + self.seg_e * c_enc),
                           minlength=self.n)
        g = self.group[self.used]
        y = self.measured[self.used] / self.scale[self.used]  # measured time, in units of the group's cost
        a = self.measured[self.used] / np.maximum(solo[self.used], 1e-300)  # the slowdown it ran under
        cost = np.bincount(g, y * a, minlength=self.groups) / np.maximum(np.bincount(g, a * a, minlength=self.groups),
                                                                        1e-300)
        mean = np.bincount(g, y, minlength=self.groups) / np.maximum(np.bincount(g, minlength=self.groups), 1)
        return float(np.sum(((y - cost[g] * a) / np.maximum(mean[g], 1e-12)) ** 2))


def fit_host(measured_runs: list, prior: dict | None = None) -> HostFit:
    """The host section fitted from the runs' own overlapping ops (all of them
    on one host model); `prior`: a probe's host section (or a workload's)."""
    prior_host = parse_host(prior) if prior else Host()
    devices = (prior or {}).get("devices")
    classes_seen = {op_class(op) for m in measured_runs for order in m.evaluation.schedule.orders
                    for op in order}
    scalar = bool(prior) and not prior.get("pairs")
    if not prior and classes_seen == {"llm"}:
        scalar = True
    tau = PRIOR_TAU if prior else NO_PRIOR_TAU
    ops, segs = _exposure(measured_runs, prior_host)
    out = HostFit({}, scalar=scalar, prior_given=bool(prior))
    if scalar:
        victims = _Victims(ops, segs, OP_CLASSES)
        c0 = prior_host.contention
        beside = victims.exposure("llm")[0] + victims.exposure("encoder")[0]
        n_ops = max(victims.exposure("llm")[1], victims.exposure("encoder")[1])
        fitted = victims.total > 0 and beside >= MIN_SHARE * victims.total and n_ops >= MIN_OPS
        c = c0
        if fitted:
            n = max(1, int(victims.used.sum()))
            for _ in range(ROUNDS):  # the scatter left at the last fit: the noise the data carry
                b = max(NOISE_FLOOR, victims.scatter(c, c) / n)
                c = golden_minimum(lambda x: victims.scatter(x, x) / (2 * b) + (x - c0) ** 2 / (2 * tau ** 2), 0.0, C_MAX,
                            (0.0, c0, c))
        out.pairs.append(PairFit("all", "all", c, c0, beside * 1000, n_ops, fitted))
        out.host = {"devices": devices, "contention": c, "dispatch": prior_host.dispatch}
        return out
    pairs: dict[str, dict[str, float]] = {}
    for victim in OP_CLASSES:
        victims = _Victims(ops, segs, (victim,))
        c0 = {other: prior_host.slowdown(victim, other) for other in OP_CLASSES}
        exposure = {other: victims.exposure(other) for other in OP_CLASSES}
        free = [other for other in OP_CLASSES if victims.total > 0
                and exposure[other][0] >= MIN_SHARE * victims.total and exposure[other][1] >= MIN_OPS]
        c = dict(c0)
        if free:
            n = max(1, int(victims.used.sum()))
            for _ in range(ROUNDS):  # the scatter left at the last fit: the noise the data carry
                b = max(NOISE_FLOOR, victims.scatter(c["llm"], c["encoder"]) / n)

                def cost(cs: dict[str, float]) -> float:
                    return (victims.scatter(cs["llm"], cs["encoder"]) / (2 * b)
                            + sum((cs[o] - c0[o]) ** 2 for o in free) / (2 * tau ** 2))

                for _ in range(3):  # coordinate descent
                    for other in free:
                        c[other] = golden_minimum(lambda x: cost(dict(c, **{other: x})), 0.0, C_MAX,
                                           (0.0, c0[other], c[other]))
        for other in OP_CLASSES:
            out.pairs.append(PairFit(victim, other, c[other], c0[other], exposure[other][0] * 1000,
                                     exposure[other][1], other in free))
        pairs[victim] = {other: c[other] for other in OP_CLASSES}
    out.host = {"devices": devices, "contention": prior_host.contention, "dispatch": prior_host.dispatch,
                "pairs": pairs}
    return out
