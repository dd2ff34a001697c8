"""Durations of ops and prices of transfers for one schedule on one workload."""
from __future__ import annotations

import math

from mpipe_core.ir.ops import ALLREDUCE, BCAST, GATHER, SCATTER, base_module, with_replica
from mpipe_core.ir.schedule import Pipeline, Schedule
from mpipe_core.simulation.chunks import chunk_costs
from mpipe_core.simulation.dataflow import EDGE_BOUNDARY, EDGE_FEATURES, EDGE_INPUT, ScheduleFacts
from mpipe_core.simulation.p2p import blocking_sends, chunk_devices, p2p_extras, p2p_extras_per_microbatch
from mpipe_core.workloads.workload import Workload


def grouped(costs: list[float], pipe: Pipeline, dispatch: float) -> list[float]:
    """Per microbatch index, the cost of the encoder op that starts a group
    there (`encoder_batch`): the sum of its microbatches' costs, the fixed
    launch part (`host.dispatch`, at most each cost) paid once instead of once
    per microbatch.  Other indices keep their own cost (no op carries them).
    A group of one costs exactly its microbatch's cost."""
    if pipe.encoder_batch == 1:
        return costs
    out = list(costs)
    for first, size in pipe.groups():
        if size == 1:
            continue
        members = costs[first:first + size]
        fixed = [min(dispatch, c) for c in members]
        out[first] = sum(members) - sum(fixed) + max(fixed)
    return out


class CostModel:
    def __init__(self, schedule: Schedule, workload: Workload, facts: ScheduleFacts):
        self.workload = workload
        self.facts = facts
        self.devices = schedule.devices
        tables = {p.module: chunk_costs(p, workload) for p in schedule.pipelines}
        # Chunks whose time is the same for every microbatch take the fast path.
        self._llm = {m: t.llm for m, t in tables.items() if t.encoder is None}
        self._folded = {m: t for m, t in tables.items() if t.encoder is not None}
        self._enc: dict[str, dict[str, list[float]]] = {}
        self._group: dict[str, list[int]] = {}  # encoder module -> microbatches of the group starting at each index
        self._spec: dict = {}  # encoder module -> its Encoder
        dispatch = workload.host.dispatch
        for p in schedule.pipelines:  # each model copy has its own microbatch count
            sizes = [1] * p.microbatches
            for first, size in p.groups():
                sizes[first] = size
            for enc in workload.encoders:
                table = {k: grouped(enc.costs(k, p.microbatches), p, dispatch) for k in ("F", "B", "W", "BW")}
                table["R"] = table["F"]
                if p.encoder_recompute is not None and enc.trainable:
                    # `recompute(..., encoders=...)`: the forward is redone before the backward
                    redo = grouped(enc.recompute_costs(p.encoder_recompute, p.microbatches), p, dispatch)
                    for kind in ("B", "BW"):
                        table[kind] = [c + r for c, r in zip(table[kind], redo)]
                self._enc[with_replica(enc.name, p.replica)] = table
                self._group[with_replica(enc.name, p.replica)] = sizes
                self._spec[with_replica(enc.name, p.replica)] = enc
        self._link = workload.link_for(schedule.devices)
        self._dispatch = dispatch
        # A blocking send is part of the sending op (p2p.py): the edge then costs nothing more.
        self._blocking = blocking_sends(workload)
        self.boundary_transfer = 0.0 if self._blocking else self._link.transfer(workload.llm.boundary_bytes)
        # Per hop (sending, receiving device) on a cluster, or per microbatch in a
        # drawn batch (`LLM.token_ratio`); False: every hop costs boundary_transfer.
        self._ratio = workload.llm.token_ratio
        self.per_hop = (workload.step is not None and workload.step.cluster is not None
                        or self._ratio is not None) and not self._blocking
        self._hops: dict[tuple, float] = {}
        self._p2p: dict[str, dict[str, list[float]]] = {}
        self._p2p_mb: dict[str, dict[str, list[list[float]]]] = {}  # a drawn batch's: kind -> chunk -> microbatch
        for p in schedule.pipelines:
            where = chunk_devices(schedule, p.module, p.chunks)
            if self._ratio is not None:
                per_mb = p2p_extras_per_microbatch(p.chunks, where, workload, schedule.devices, p.microbatches)
                if per_mb is not None:
                    self._p2p_mb[p.module] = per_mb
                    if p.module in self._llm:  # its time now differs per microbatch
                        del self._llm[p.module]
                        self._folded[p.module] = tables[p.module]
                continue
            extras = p2p_extras(p.chunks, where, workload, schedule.devices)
            if extras is None:
                continue
            if p.module in self._llm:
                table = self._llm[p.module]
                self._llm[p.module] = {k: [x + e for x, e in zip(v, extras[k])] if k in extras else v
                                       for k, v in table.items()}
            else:
                self._p2p[p.module] = extras

    def duration(self, op: tuple) -> float:
        module, kind, chunk, mb, step = op
        table = self._llm.get(module)
        if table is not None:
            return table[kind][chunk]
        folded = self._folded.get(module)
        if folded is not None:
            per_mb = self._p2p_mb.get(module)
            if per_mb is not None:
                return folded.duration(kind, chunk, mb) + (per_mb[kind][chunk][mb] if kind in per_mb else 0.0)
            extras = self._p2p.get(module)
            return folded.duration(kind, chunk, mb) + (extras[kind][chunk] if extras and kind in extras else 0.0)
        costs = self._enc.get(module)
        if costs is not None and kind in costs:  # an encoder's compute op (the common case first)
            cost = costs[kind][mb]
            shards = self.facts.shards.get((module, mb, step), 1)
            if shards == 1:
                return cost
            # Each shard is an op of its own: it pays the per-op dispatch the cost includes once.
            fixed = min(self._dispatch, cost)
            return (cost - fixed) / shards + fixed
        name = base_module(module)
        enc = self.workload.encoder(name)
        if kind == BCAST:
            return self._link.transfer(enc.param_bytes) if self.devices > 1 else 0.0
        if kind == ALLREDUCE:
            # Ring all-reduce over the devices holding an AR op of this step
            # moves 2(P-1)/P of the gradients over each link.
            p = self.facts.ring.get((module, step), self.devices)
            if p <= 1:
                return 0.0
            if enc.sharded_static is not None:
                # State sharded over the copies (ZeRO): a ring reduce-scatter of the
                # gradients, then a ring all-gather of the updated 16-bit weights.
                return (p - 1) * (self._link.transfer(enc.gradient_bytes / p) + self._link.transfer(enc.param_bytes / p))
            return 2 * (p - 1) * self._link.transfer(enc.gradient_bytes / p)
        if kind == GATHER or kind == SCATTER:
            return 0.0  # a barrier: what it waits for is priced on its edges
        return self._enc[module][kind][mb]  # (an unknown kind: KeyError, as ever)

    def boundary(self, src: int, dst: int, mb: int = 0) -> float:
        """What microbatch `mb`'s hidden state costs from device src to device dst."""
        if not self.per_hop:
            return self.boundary_transfer
        key = (src, dst) if self._ratio is None else (src, dst, mb)
        cost = self._hops.get(key)
        if cost is None:
            nbytes = self.workload.llm.boundary_bytes_of(mb)
            cost = self._hops[key] = self.workload.boundary_transfer_between(self.devices, src, dst, nbytes)
        return cost

    def transfer(self, producer: tuple, consumer: tuple, edge: int) -> float:
        """Time a dependency costs when producer and consumer sit on different devices."""
        if edge == EDGE_BOUNDARY:  # (on the pipeline's link: `boundary` prices each hop)
            if self._ratio is None or self._blocking:
                return self.boundary_transfer
            return self._link.transfer(self.workload.llm.boundary_bytes_of(consumer[3]))
        if edge == EDGE_FEATURES or edge == EDGE_INPUT:
            # Encoder features forward, their gradient backward, or the raw
            # input a recompute needs: sized by the encoder op's own shard.
            # A group's forward ships every microbatch's features at once; a
            # gradient comes back from one microbatch's backward.
            to_encoder = producer[0] in self._llm or producer[0] in self._folded
            enc_op = consumer if to_encoder else producer
            enc = self._spec.get(enc_op[0]) or self.workload.encoder(base_module(enc_op[0]))
            shards = self.facts.shards.get((enc_op[0], enc_op[3], enc_op[4]), 1)
            if enc.counts is not None:  # a drawn batch: per tile of the microbatches it carries
                return self._link.transfer(self._tile_bytes(enc, edge, producer, enc_op, to_encoder) / shards)
            nbytes = enc.output_bytes if edge == EDGE_FEATURES else enc.input_bytes
            if not to_encoder and self.facts.encoder_batch:
                size = self._group[enc_op[0]][enc_op[3]]
                if size != 1:
                    nbytes = nbytes * size
            return self._link.transfer(nbytes / shards)
        return self._link.latency

    def _tile_bytes(self, enc, edge: int, producer: tuple, enc_op: tuple, to_encoder: bool) -> float:
        """Bytes an encoder edge moves in a drawn batch: a gradient, microbatch
        producer[3]'s; features or input, those of every microbatch of the group
        the encoder op serves (`Encoder.output_bytes_of`, `input_bytes_of`)."""
        of = enc.output_bytes_of if edge == EDGE_FEATURES else enc.input_bytes_of
        if to_encoder:
            return of(producer[3])
        first = enc_op[3]
        size = self._group[enc_op[0]][first] if self.facts.encoder_batch else 1
        return math.fsum(of(m) for m in range(first, first + size)) if size != 1 else of(first)
