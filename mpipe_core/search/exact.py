"""The exact encoder placement for a fixed LLM order (OR-Tools CP-SAT).

The instance: one LLM body (a generator's per-device order, kept as is) and
one encoder whose work for each microbatch (split into `shards`) is placed
freely: each shard's ops (F, and for a trainable encoder its backward, on the
same device: the owner) go on any device, at any time that leaves no two ops
of a device overlapping.  Dependencies and transfer times are the
simulator's.  A trainable encoder placed anywhere but the first stage's
device costs what `transpose(backward=owner)` pays: a parameter broadcast
opening every device and a gradient all-reduce closing it.  That is the family
the dynamic and prefix transposes (owner backward, same shards) and the fused
baseline belong to, so the optimum is <= each of them.

CP-SAT, not a MILP: the problem is disjunctive scheduling (optional
intervals, one no-overlap constraint per device), which CP-SAT states
directly and prunes well; a MILP needs big-M pairs per op pair.  Times are
scaled to integers rounding durations down, so the solver's bound is a true
lower bound; the placement it finds is re-simulated by our own simulator,
whose makespan is what we report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from mpipe_core.api import evaluate
from mpipe_core.errors import MpipeError
from mpipe_core.ir.ops import ALLREDUCE, BCAST, LLM, Op, R
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.costs import CostModel
from mpipe_core.simulation.dataflow import collect_facts, predecessors
from mpipe_core.simulation.simulator import simulate
from mpipe_core.workloads.workload import Workload, load_workload

MAX_OPS = 600  # LLM + encoder ops CP-SAT proves optimal within seconds here
RESOLUTION = 1e-6  # of the horizon: the integer time grid


@dataclass
class ExactResult:
    makespan: float  # of the best placement found, simulated
    proved: bool
    gap: float  # (makespan - proven lower bound) / makespan
    term: str  # the heuristic term whose family was solved (its body, shards, backward)
    heuristic: float  # that term's makespan
    schedule: Schedule

    def as_dict(self) -> dict:
        return {"makespan": self.makespan, "proved": self.proved, "gap": self.gap}


def _instance_ops(wl: Workload, devices: int, microbatches: int, shards: int = 4) -> int:
    """Most ops an instance of this size can have (V bodies, split backward)."""
    enc = (3 if any(e.trainable for e in wl.encoders) else 1) * microbatches * shards * len(wl.encoders)
    return 2 * devices * microbatches * 3 + enc


def check_size(wl: Workload, devices: int, microbatches: int) -> None:
    if wl.host.contends:
        raise MpipeError("--exact models no host contention (this workload sets host.contention)")
    if len(wl.encoders) != 1:
        raise MpipeError(f"--exact places one encoder (this workload has {len(wl.encoders)})")
    ops = _instance_ops(wl, devices, microbatches)
    if ops > MAX_OPS:
        raise MpipeError(f"--exact handles instances of up to {MAX_OPS} ops; P={devices}, M={microbatches} "
                         f"has up to {ops:,} (use fewer --devices or --microbatches)")


def family_term(body: str, shards: int, trainable: bool) -> str:
    backward = ", backward=owner" if trainable else ""
    extra = f", shards={shards}" if shards != 1 else ""
    return f"transpose({body}, mode=dynamic{backward}{extra})"


def solve(body: str, workload, shards: int = 1, time_limit: float = 30.0,
          hint_terms: tuple[str, ...] = ()) -> ExactResult:
    """Place the encoder's ops optimally around `body`'s LLM order.

    The best of `hint_terms` (terms of the same family) and the dynamic
    transpose seeds the solver; the result is never worse than that seed."""
    try:
        from ortools.sat.python import cp_model
    except ImportError:  # pragma: no cover - the extra is not installed
        raise MpipeError("--exact needs OR-Tools: pip install 'mpipe[tune]'") from None
    wl = load_workload(workload)
    if wl.host.contends:
        raise MpipeError("the exact placement models no host contention (this workload sets host.contention)")
    if len(wl.encoders) != 1:
        raise MpipeError(f"the exact placement handles one encoder (this workload has {len(wl.encoders)})")
    enc = wl.encoders[0]
    seeds = [evaluate(t, wl) for t in (family_term(body, shards, enc.trainable),) + tuple(hint_terms)]
    seed = min(seeds, key=lambda ev: ev.timeline.makespan)
    sched = seed.schedule
    if any(op.kind == R for op in sched.ops()) or len(sched.pipelines) != 1 or sched.pipelines[0].steps != 1:
        raise MpipeError(f"{seed.term}: the exact placement covers one step, owner backward, one pipeline")
    if sched.num_ops > MAX_OPS:
        raise MpipeError(f"--exact handles instances of up to {MAX_OPS} ops; {seed.term} has {sched.num_ops:,}")
    P = sched.devices
    facts = collect_facts(sched)
    costs = CostModel(sched, wl, facts)
    index = sched.placement()
    d0 = next(d for d, o in enumerate(sched.orders) for op in o if op.module == LLM and op.chunk == 0)
    llm_orders = [[op for op in order if op.module == LLM] for order in sched.orders]
    enc_ops = [op for op in sched.ops() if op.module != LLM and op.kind not in (BCAST, ALLREDUCE)]
    groups = sorted({(op.chunk, op.mb) for op in enc_ops})
    replicated = enc.trainable and P > 1
    bcast = costs.duration(Op(enc.name, BCAST, 0, -1, 0)) if replicated else 0.0
    allreduce = costs.duration(Op(enc.name, ALLREDUCE, 0, -1, 0)) if replicated else 0.0

    horizon = seed.timeline.makespan
    scale = 1.0 / (RESOLUTION * max(horizon, 1e-12))

    def down(x: float) -> int:
        return int(math.floor(x * scale + 1e-9))

    model = cp_model.CpModel()
    H = down(horizon) + 1
    start, end, dur = {}, {}, {}
    for order in llm_orders:
        for op in order:
            dur[op] = down(costs.duration(op))
    for op in enc_ops:
        dur[op] = down(costs.duration(op))
    for op in dur:
        start[op] = model.NewIntVar(0, H, "s")
        end[op] = model.NewIntVar(0, H, "e")
        model.Add(end[op] == start[op] + dur[op])
    # The owner of each shard group: one device.
    where = {g: [model.NewBoolVar("x") for _ in range(P)] for g in groups}
    for g in groups:
        model.AddExactlyOne(where[g])
    use = model.NewBoolVar("replicated")  # broadcast + all-reduce paid
    if replicated:
        for g in groups:
            for d in range(P):
                if d != d0:
                    model.AddImplication(where[g][d], use)
    else:
        model.Add(use == 0)
    opening = down(bcast)
    lanes: list[list] = [[] for _ in range(P)]
    for d, order in enumerate(llm_orders):
        for a, b in zip(order, order[1:]):
            model.Add(start[b] >= end[a])
        for op in order:
            lanes[d].append(model.NewIntervalVar(start[op], dur[op], end[op], "i"))
            if opening:
                model.Add(start[op] >= opening).OnlyEnforceIf(use)
    for op in enc_ops:
        for d in range(P):
            lanes[d].append(model.NewOptionalIntervalVar(start[op], dur[op], end[op], where[(op.chunk, op.mb)][d], "o"))
        if opening:
            model.Add(start[op] >= opening).OnlyEnforceIf(use)
    for lane in lanes:
        model.AddNoOverlap(lane)
    # Dependencies with the simulator's transfer times (paid across devices).
    for op in dur:
        device = index[op] if op.module == LLM else None
        for producer, edge in predecessors(op, device if device is not None else d0, facts, index):
            if producer[1] in (BCAST, ALLREDUCE):
                continue
            producer = Op(*producer)
            cost = down(costs.transfer(producer, op, edge))
            p_llm, c_llm = producer.module == LLM, op.module == LLM
            if p_llm and c_llm:
                model.Add(start[op] >= end[producer] + (cost if index[producer] != index[op] else 0))
            elif not p_llm and not c_llm:
                model.Add(start[op] >= end[producer])  # same group, same device
            else:
                llm_op, enc_op = (producer, op) if p_llm else (op, producer)
                apart = where[(enc_op.chunk, enc_op.mb)][index[llm_op]].Not()
                model.Add(start[op] >= end[producer] + cost).OnlyEnforceIf(apart)
                model.Add(start[op] >= end[producer])
    makespan = model.NewIntVar(0, H + down(allreduce) + 1, "T")
    for op in dur:
        model.Add(makespan >= end[op])
    if replicated:
        closing, latency = down(allreduce), down(wl.link_for(P).latency)
        weights = [op for op in enc_ops if op.kind in ("W", "BW")]
        for d in range(P):
            ar = model.NewIntVar(0, H + closing + 1, "ar")
            for op in llm_orders[d]:
                model.Add(ar >= end[op]).OnlyEnforceIf(use)
            for op in weights:
                model.Add(ar >= end[op] + latency).OnlyEnforceIf([use, where[(op.chunk, op.mb)][d].Not()])
                model.Add(ar >= end[op]).OnlyEnforceIf(use)
            model.Add(makespan >= ar + closing).OnlyEnforceIf(use)
    model.Minimize(makespan)
    # Seed with the heuristic's placement (feasible: times rounded down keep every inequality).
    for op, d, s, _ in seed.timeline.rows():
        if op in start:
            model.AddHint(start[op], down(s))
        if op.module != LLM and op.kind == "F":
            for dd in range(P):
                model.AddHint(where[(op.chunk, op.mb)][dd], int(dd == d))
    model.AddHint(use, int(any(op.kind == BCAST for op in sched.ops())))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = 2
    status = solver.Solve(model)
    bound = solver.BestObjectiveBound() / scale
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found, best = seed.timeline.makespan, sched
    else:
        best = _placed(sched, llm_orders, enc_ops, groups, where, start, end, solver, d0, P,
                       solver.Value(use) == 1, enc.name)
        found = simulate(best, wl).makespan
        if found > seed.timeline.makespan:
            found, best = seed.timeline.makespan, sched
    proved = status == cp_model.OPTIMAL
    gap = max(0.0, found - bound) / found if found else 0.0
    return ExactResult(found, proved, gap, seed.term, seed.timeline.makespan, best)


def _placed(sched: Schedule, llm_orders, enc_ops, groups, where, start, end, solver, d0, P, replicated,
            name) -> Schedule:
    """The solver's placement as a schedule: each device's ops by solved start
    time (LLM ops keep their order), broadcast first and all-reduce last."""
    rank = {op: i for order in llm_orders for i, op in enumerate(order)}
    owner = {g: next(d for d in range(P) if solver.Value(where[g][d])) for g in groups}
    lanes: list[list] = [[(solver.Value(start[op]), solver.Value(end[op]), 0, rank[op], op) for op in order]
                         for order in llm_orders]
    for i, op in enumerate(enc_ops):
        lanes[owner[(op.chunk, op.mb)]].append((solver.Value(start[op]), solver.Value(end[op]), -1, i, op))
    orders = []
    for d, lane in enumerate(lanes):
        lane.sort(key=lambda x: x[:4])
        ops = [x[4] for x in lane]
        if replicated:
            ops = [Op(name, BCAST, d, -1, 0)] + ops + [Op(name, ALLREDUCE, d, -1, 0)]
        orders.append(ops)
    return sched.with_orders(orders)


def solve_for(result, wl: Workload, devices: int, microbatches: int, time_limit: float,
              progress: Callable[[str], None] | None = None) -> dict:
    """`mpipe tune --exact`: the exact placement for the family of the best
    transpose candidate it can express (its body and shards; owner backward
    for a trainable encoder), seeded with every candidate of that family."""
    from mpipe_core.algebra.terms import parse

    say = progress or (lambda _: None)
    trainable = wl.encoders[0].trainable
    family: dict[tuple[str, int], list] = {}
    for c in result.candidates:
        ast = parse(c.term)
        if ast.name != "transpose" or ast.kw("memory_cap") is not None:
            continue
        backward = ast.kw("backward")
        if trainable and (backward is None or backward.name != "owner"):
            continue
        inner = ast.kw("term")
        if inner.name not in ("gpipe", "1f1b", "interleaved", "looped_bfs", "zb_h1", "zb_h2", "zbv", "dualpipev"):
            continue
        family.setdefault((str(inner), ast.kw("shards", 1)), []).append(c)
    if not family:
        raise MpipeError("--exact: no transpose candidate of the exact placement's family was found")
    (body, shards), members = min(family.items(), key=lambda kv: min(c.makespan for c in kv[1]))
    say(f"exact: placing the encoder around {body} (shards={shards}) with CP-SAT, {time_limit:g}s limit")
    exact = solve(body, wl, shards, time_limit, tuple(c.term for c in members))
    say(f"exact: makespan {exact.makespan:.6g}, {'proved optimal' if exact.proved else 'not proved'}, "
        f"gap {exact.gap:.3%}; best heuristic of that family {exact.heuristic:.6g} ({exact.term})")
    result.exact = exact
    return exact.as_dict()
