"""Durations of ops and prices of transfers for one schedule on one workload."""
from __future__ import annotations

from .chunks import chunk_costs
from .dataflow import EDGE_BOUNDARY, EDGE_FEATURES, EDGE_INPUT, ScheduleFacts
from .ops import ALLREDUCE, BCAST, base_module, with_replica
from .schedule import Schedule
from .workload import Workload


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
        for p in schedule.pipelines:  # each model copy has its own microbatch count
            for enc in workload.encoders:
                table = {k: enc.costs(k, p.microbatches) for k in ("F", "B", "W", "BW")}
                table["R"] = table["F"]
                self._enc[with_replica(enc.name, p.replica)] = table
        self._link = workload.link
        self._dispatch = workload.host.dispatch
        self.boundary_transfer = workload.link.transfer(workload.llm.boundary_bytes)

    def duration(self, op: tuple) -> float:
        module, kind, chunk, mb, step = op
        table = self._llm.get(module)
        if table is not None:
            return table[kind][chunk]
        folded = self._folded.get(module)
        if folded is not None:
            return folded.duration(kind, chunk, mb)
        name = base_module(module)
        enc = self.workload.encoder(name)
        if kind == BCAST:
            return self._link.transfer(enc.param_bytes) if self.devices > 1 else 0.0
        if kind == ALLREDUCE:
            # Ring all-reduce moves 2(P-1)/P of the parameters over each link.
            p = self.devices
            if p <= 1:
                return 0.0
            return 2 * (p - 1) * self._link.transfer(enc.param_bytes / p)
        shards = self.facts.shards.get((module, mb, step), 1)
        if shards == 1:
            return self._enc[module][kind][mb]
        # Each shard is an op of its own: it pays the per-op dispatch the cost includes once.
        fixed = min(self._dispatch, self._enc[module][kind][mb])
        return (self._enc[module][kind][mb] - fixed) / shards + fixed

    def transfer(self, producer: tuple, consumer: tuple, edge: int) -> float:
        """Time a dependency costs when producer and consumer sit on different devices."""
        if edge == EDGE_BOUNDARY:
            return self._link.transfer(self.workload.llm.boundary_bytes)
        if edge == EDGE_FEATURES or edge == EDGE_INPUT:
            # Encoder features forward, their gradient backward, or the raw
            # input a recompute needs: sized by the encoder op's own shard.
            enc_op = consumer if producer[0] in self._llm or producer[0] in self._folded else producer
            enc = self.workload.encoder(base_module(enc_op[0]))
            shards = self.facts.shards.get((enc_op[0], enc_op[3], enc_op[4]), 1)
            nbytes = enc.output_bytes if edge == EDGE_FEATURES else enc.input_bytes
            return self._link.transfer(nbytes / shards)
        return self._link.latency
