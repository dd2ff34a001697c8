"""One op on a timeline, simulated or measured: the one record type a timed op
has on its whole way, from the simulator or a rank's stream file, through the
database, to a comparison and the app's bars.

Times: simulated records are in workload time units; measured ones are in
seconds on the run's common clock (what the database stores).  Only the app's
bars turn seconds into milliseconds, for display.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from mpipe_core.ir.ops import Op

# The keys of the record as a plain dict (JSON output), in order.
RECORD_FIELDS = ("device", "module", "kind", "chunk", "microbatch", "step", "start", "end")

# A measured run's timed work besides ops, a record each (module "llm", microbatch -1, chunk
# the chunk it belongs to or -1): tensor- and context-parallel collectives inside ops, the
# data-parallel gradient reductions and ZeRO gathers, the optimizer step.
COMM_KINDS = ("tp_comm", "cp_comm", "dp_comm", "dp_gather", "optimizer")


class TimelineRecord(NamedTuple):
    device: int  # device index: the simulator's device, or a run's rank
    module: str  # "llm", "vision", "llm@1", ...
    kind: str  # F, B, W, BW, R, BCAST, AR
    chunk: int
    microbatch: int  # -1: no microbatch
    step: int
    start: float
    end: float
    host: str = ""  # a measured op's host and torch device ("node3/cuda:1"); "" when simulated
    # Which pipeline of a measured run's layout (`executor.parallel.grid`: pipelines in rank
    # order of their first stage, so pipeline i's first stage is global rank i); 0 otherwise.
    pipeline: int = 0

    @classmethod
    def of(cls, op: Op, device: int, start: float, end: float, host: str = "") -> "TimelineRecord":
        return cls(device, op.module, op.kind, op.chunk, op.mb, op.step, start, end, host)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "TimelineRecord":
        return cls(doc["device"], doc["module"], doc["kind"], doc["chunk"], doc["microbatch"],
                   doc.get("step", 0), doc["start"], doc["end"], doc.get("host", ""), doc.get("pipeline", 0))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: the fields in order, `host` and `pipeline` only when there is one."""
        doc = {key: getattr(self, key) for key in RECORD_FIELDS}
        if self.host:
            doc["host"] = self.host
        if self.pipeline:
            doc["pipeline"] = self.pipeline
        return doc

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS
