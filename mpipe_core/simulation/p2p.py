"""What a pipeline exchange adds to the ops at its two ends, beyond the
transfer the dataflow charges on the edge (analytic workloads with a cluster).

* Megatron-LM's scatter/gather optimization: each tp rank sends 1/t of the
  hidden state and the receiving stage all-gathers it over its tp group
  (`gather_split_1d_tensor`) before the op can start: that all-gather is part
  of the receiving op (F of a chunk whose predecessor sits elsewhere, the
  backward of a chunk whose successor does).  Not with sequence parallelism,
  where the tensor stays split.
* `parallel.p2p_overlap: false` (Megatron-LM 2021: `batch_isend_irecv`, a
  wait on every request and `torch.cuda.synchronize()` after each exchange):
  the sender holds its device until its send is done, so the send's time is
  part of the sending op and the receiver has the data when that op ends (the
  edge then costs nothing more).

In a drawn batch (`LLM.token_ratio`) both follow each microbatch's hidden
state: `p2p_extras_per_microbatch`.
"""
from __future__ import annotations

from mpipe_core.workloads.workload import Workload


def blocking_sends(workload: Workload) -> bool:
    step = workload.step
    return step is not None and step.cluster is not None and not step.p2p_overlap


def p2p_extras(chunks: int, chunk_device: list[int | None], workload: Workload,
               devices: int, mb: int | None = None) -> dict[str, list[float]] | None:
    """Per kind ("F", "B", "BW", "W") and chunk: the time (workload units) the
    exchange adds to that op, or None when nothing is added; `mb`: for that
    microbatch of a drawn batch (its own hidden state), else the nominal one."""
    step = workload.step
    if step is None or step.cluster is None:
        return None
    ratio = workload.llm.token_ratio
    scaled = mb is not None and ratio is not None
    gather = step.boundary_gather_s
    if scaled and step.boundary_gather is not None:
        gather = step.boundary_gather_at(ratio[mb]).seconds
    gather = gather / step.seconds_per_unit
    nbytes = workload.llm.boundary_bytes_of(mb) if scaled else None
    if step.p2p_overlap and gather == 0.0:
        return None

    def apart(a: int, b: int) -> bool:
        return 0 <= b < chunks and chunk_device[a] is not None and chunk_device[b] is not None \
            and chunk_device[a] != chunk_device[b]

    def send(a: int, b: int) -> float:  # a blocking send, on the link between the two stages
        if step.p2p_overlap or not apart(a, b):
            return 0.0
        return workload.boundary_transfer_between(devices, chunk_device[a], chunk_device[b], nbytes)

    f = [send(c, c + 1) + (gather if apart(c, c - 1) else 0.0) for c in range(chunks)]
    b = [send(c, c - 1) + (gather if apart(c, c + 1) else 0.0) for c in range(chunks)]
    if not any(f) and not any(b):
        return None
    return {"F": f, "B": b, "BW": list(b), "W": [0.0] * chunks}


def p2p_extras_per_microbatch(chunks: int, chunk_device: list[int | None], workload: Workload, devices: int,
                              microbatches: int) -> dict[str, list[list[float]]] | None:
    """Per kind, chunk and microbatch of a drawn batch (`LLM.token_ratio`): what
    `p2p_extras` adds for that microbatch's own hidden state; None when nothing is added."""
    per = [p2p_extras(chunks, chunk_device, workload, devices, m) for m in range(microbatches)]
    if all(x is None for x in per):
        return None
    zero = {k: [0.0] * chunks for k in ("F", "B", "BW", "W")}
    per = [zero if x is None else x for x in per]
    return {k: [[x[k][c] for x in per] for c in range(chunks)] for k in ("F", "B", "BW", "W")}


def chunk_devices(schedule, module: str, chunks: int) -> list[int | None]:
    """The device each chunk of `module` runs its forward on (None: nowhere)."""
    where: list[int | None] = [None] * chunks
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op[0] == module and op[1] == "F" and 0 <= op[2] < chunks and where[op[2]] is None:
                where[op[2]] = d
    return where
