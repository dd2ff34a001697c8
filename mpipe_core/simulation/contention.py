"""One step simulated with devices sharing a host (see `workload.Host`).

The plain simulator prices every op at its own cost, as if each device were
alone on its machine.  Ranks that share cores or memory bandwidth slow each
other down: measured here (2 CPU ranks on one 2-core host) an encoder forward
that runs while the other rank computes takes ~1.4-1.8x its time alone.  This
is processor sharing: while k devices of a host compute, each op advances at
1 / (1 + contention * (k - 1)) of its solo speed, so an op's duration depends
on what the other devices do meanwhile.  With `host.pairs` the slowdown also
depends on what runs: an op of class A advances at 1 / (1 + sum of c(A, B))
over the host's other busy devices, each running an op of class B (an LLM op
beside an encoder slows far more than two encoders do).  That needs time-ordered events
rather than the plain simulator's device-by-device list scheduling; with
contention 0 both give the same timeline (a test holds them equal).
"""
from __future__ import annotations

from mpipe_core.ir.ops import LLM, base_module
from mpipe_core.simulation.dataflow import EDGE_BOUNDARY, predecessors
from mpipe_core.workloads.hardware import Host

_EPS = 1e-12


def simulate_step_shared(orders, index, facts, costs, begin: float, host: Host):
    """Per device, the start and end of each of its ops in order, or None when
    the step deadlocks (the plain simulator then names the cycle)."""
    n_dev = len(orders)
    hosts = [host.host_of(d) for d in range(n_dev)]
    pointer = [0] * n_dev
    free_at = [begin] * n_dev
    running: list[list | None] = [None] * n_dev  # [op, remaining solo work, start]
    end_of: dict = {}
    starts: list[list[float]] = [[] for _ in orders]
    ends: list[list[float]] = [[] for _ in orders]
    now = begin

    def ready_time(d: int) -> float | None:
        """When device d's next op can start (None: an input is not produced yet)."""
        op = orders[d][pointer[d]]
        at = free_at[d]
        for producer, edge in predecessors(op, d, facts, index):
            done = end_of.get(producer)
            if done is None:
                return None
            e = done[0]
            if done[1] != d:
                e += costs.boundary(done[1], d, op[3]) if edge == EDGE_BOUNDARY else costs.transfer(producer, op, edge)
            at = max(at, e)
        return at

    while True:
        # Start every op whose device is idle and whose inputs are there by `now`;
        # zero-cost ops finish at once and may release others at the same instant.
        upcoming = None
        changed = True
        while changed:
            changed = False
            upcoming = None
            for d in range(n_dev):
                if running[d] is not None or pointer[d] >= len(orders[d]):
                    continue
                at = ready_time(d)
                if at is None:
                    continue
                if at <= now + _EPS:
                    op = orders[d][pointer[d]]
                    work = costs.duration(op)
                    if work <= 0:
                        _finish(d, op, now, now, starts, ends, end_of, pointer, free_at)
                        changed = True
                    else:
                        running[d] = [op, work, now]
                elif upcoming is None or at < upcoming:
                    upcoming = at
        busy = [d for d in range(n_dev) if running[d] is not None]
        if not busy:
            if upcoming is None:
                break
            now = upcoming
            continue
        slow = _slowdowns(busy, [running[d][0] for d in busy], [hosts[d] for d in busy], host)
        step = min(running[d][1] * slow[d] for d in busy)
        if upcoming is not None and upcoming - now < step:
            step = upcoming - now
        now += step
        for d in busy:
            item = running[d]
            item[1] -= step / slow[d]
            if item[1] <= _EPS * max(1.0, abs(now)):
                running[d] = None
                _finish(d, item[0], item[2], now, starts, ends, end_of, pointer, free_at)
    if any(pointer[d] < len(orders[d]) for d in range(n_dev)):
        return None
    return starts, ends


def _finish(d, op, start, end, starts, ends, end_of, pointer, free_at) -> None:
    starts[d].append(start)
    ends[d].append(end)
    end_of[op] = (end, d)
    pointer[d] += 1
    free_at[d] = end


def op_class(op) -> str:
    """The class `Host.pairs` prices an op by: "llm" or "encoder"."""
    return "llm" if base_module(op[0]) == LLM else "encoder"


def _slowdowns(busy: list[int], ops: list, on_host: list[int], host: Host) -> dict[int, float]:
    """Per busy device (or op), the factor its op's solo time is stretched by right
    now; `ops` and `on_host` (its host) are aligned with `busy`."""
    if not host.pairs:  # the same c for every pair: count the host's busy devices
        per_host: dict[int, int] = {}
        for h in on_host:
            per_host[h] = per_host.get(h, 0) + 1
        return {d: 1.0 + host.contention * (per_host[h] - 1) for d, h in zip(busy, on_host)}
    classes = [op_class(op) for op in ops]
    return {d: 1.0 + sum(host.slowdown(classes[i], classes[j]) for j in range(len(busy))
                         if j != i and on_host[j] == on_host[i])
            for i, d in enumerate(busy)}


def solo_work(device: list[int], start: list[float], end: list[float], host: Host | None,
              ops: list | None = None) -> list[float]:
    """The inverse, for calibration: how long each measured op would have taken
    alone on its host.  Each stretch of an op during which the host's busy
    devices stretched it by a factor s (`Host`: 1 + contention (k - 1), or by
    the classes of `ops` running beside it with `host.pairs`) counts 1 / s of
    its length."""
    solo = [0.0] * len(start)
    if host is None or not host.contends:
        return [e - s for s, e in zip(start, end)]
    if host.pairs and ops is None:
        raise ValueError("solo_work: host.pairs needs the ops, to know what ran beside what")
    by_host: dict[int, list[int]] = {}
    for i, d in enumerate(device):
        by_host.setdefault(host.host_of(d), []).append(i)
    for members in by_host.values():
        events = sorted([(start[i], 1, i) for i in members] + [(end[i], 0, i) for i in members])
        active: set[int] = set()
        last = None
        for t, opening, i in events:
            if active and last is not None and t > last:
                members_now = sorted(active)
                slow = _slowdowns(members_now, [ops[j] for j in members_now] if ops is not None
                                  else [None] * len(members_now), [0] * len(members_now), host)
                for j in members_now:
                    solo[j] += (t - last) / slow[j]
            last = t
            if opening:
                active.add(i)
            else:
                active.discard(i)
    return solo
