"""A cluster preset for this host, measured: the loopback probe.

The simulator prices a collective with the alpha-beta model of
`mpipe_core.workloads.collectives` (a per-collective base latency, a latency
per ring step, the bytes each rank moves over the link's bandwidth) and the
optimizer step by the device's memory bandwidth.  This probe measures those
figures on this machine, in a run of its own (never the run they are then
compared with):

- two processes on gloo time all-reduce, reduce-scatter, all-gather and a
  ping-pong of point-to-point sends over a range of buffer sizes (the median of
  several rounds each);
- the core's own formulas for two ranks are fitted to them by least squares
  on relative error, the three figures kept non-negative: `collective_latency_us`,
  the link's `latency_us` and its `GBps` (efficiency 1: the fit is the
  achieved rate);
- one process times an in-place add over a buffer far larger than the caches
  (three 4-byte streams an element): the device's `hbm_TBps`; and a float32
  matmul: its `peak_tflops` (efficiencies 1, as measured).

`cluster_document()` is a workload's `cluster` section (every rank on one
node: `devices_per_node` is large), `device_document()` its `device` section.

    python -m executor.runtime.link_probe [-o FILE]   # a workload fragment as JSON
"""
from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

SIZES = (4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20)  # bytes per buffer
ROUNDS = 9
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "send")
DEVICES_PER_NODE = 1024  # every rank of a run on this host sits on one node


@dataclass(frozen=True)
class LinkFit:
    collective_latency_us: float
    latency_us: float
    gbps: float
    samples: list[tuple[str, int, float]]  # (kind, bytes, median seconds)
    rms_relative_error: float

    def predicted(self, kind: str, nbytes: int) -> float:
        """Seconds the fitted figures give `kind` of `nbytes` over two ranks (the core's formulas)."""
        coll, hops, moved = _terms(kind, nbytes)
        return (coll * self.collective_latency_us + hops * self.latency_us) * 1e-6 + moved / (self.gbps * 1e9)


def _terms(kind: str, nbytes: int) -> tuple[float, float, float]:
    """(collectives, ring steps, bytes moved per rank) of `kind` over two ranks, as
    `collectives._ring` and `collectives.send` count them."""
    return {"all-reduce": (1.0, 2.0, float(nbytes)), "reduce-scatter": (1.0, 1.0, nbytes / 2),
            "all-gather": (1.0, 1.0, nbytes / 2), "send": (0.0, 1.0, float(nbytes))}[kind]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, sizes, rounds: int, out) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # *_tensor's new names; gloo takes both
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    buffers = {n: (torch.ones(n // 4), torch.ones(n // 8)) for n in sizes}
    times: dict[tuple[str, int], list[float]] = {(k, n): [] for n in sizes for k in KINDS}
    try:
        # Round after round over every size and kind (the first round a warm-up), so that
        # background load that comes and goes falls on all of them alike.
        for round_ in range(rounds + 1):
            for nbytes in sizes:
                full, half = buffers[nbytes]
                for kind in KINDS:
                    dist.barrier()
                    start = time.perf_counter()
                    if kind == "all-reduce":
                        dist.all_reduce(full)
                    elif kind == "reduce-scatter":
                        dist.reduce_scatter_tensor(half, full)
                    elif kind == "all-gather":
                        dist.all_gather_into_tensor(full, half)
                    elif rank == 0:  # a ping-pong: half the round trip is one send
                        dist.send(full, 1)
                        dist.recv(full, 1)
                    else:
                        dist.recv(full, 0)
                        dist.send(full, 0)
                    elapsed = time.perf_counter() - start
                    if round_:
                        times[(kind, nbytes)].append(elapsed / 2 if kind == "send" else elapsed)
        samples = [(kind, nbytes, statistics.median(t)) for (kind, nbytes), t in times.items()]
        if rank == 0:
            out.put(samples)
    finally:
        dist.destroy_process_group()


def measure_links(sizes=SIZES, rounds: int = ROUNDS) -> list[tuple[str, int, float]]:
    """(kind, bytes, median seconds) over two gloo processes on this host."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, sizes, rounds, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        samples = out.get(timeout=600)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return samples


def fit_links(samples: list[tuple[str, int, float]]) -> LinkFit:
    """Least squares on relative error of the core's two-rank formulas; each subset of
    the three figures is tried and the best fit with none negative kept (they are few)."""
    a = np.array([_terms(kind, nbytes) for kind, nbytes, _ in samples])
    t = np.array([s for _, _, s in samples])
    weighted = a / t[:, None]  # relative error: each row divided by its own time
    best = None
    for keep in itertools.chain.from_iterable(itertools.combinations(range(3), k) for k in (3, 2, 1)):
        cols = list(keep)
        x, *_ = np.linalg.lstsq(weighted[:, cols], np.ones(len(t)), rcond=None)
        if (x < 0).any():
            continue
        full = np.zeros(3)
        full[cols] = x
        err = float(np.sqrt(np.mean((a @ full / t - 1) ** 2)))
        if best is None or err < best[1]:
            best = (full, err)
    assert best is not None and best[0][2] > 0, "no bandwidth term fits the probe's samples"
    coll, lat, inv_bw = best[0]
    return LinkFit(coll * 1e6, lat * 1e6, 1 / inv_bw / 1e9, samples, best[1])


def _median_seconds(fn, rounds: int = ROUNDS) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_device(elements: int = 32 << 20, side: int = 512) -> tuple[float, float]:
    """(memory TB/s of an in-place add, float32 matmul TFLOP/s) on one thread, as a rank runs."""
    import torch

    torch.set_num_threads(1)
    x, y = torch.ones(elements), torch.ones(elements)
    add = _median_seconds(lambda: x.add_(y))
    m = torch.ones(side, side)
    mm = _median_seconds(lambda: m @ m)
    return 3 * 4 * elements / add / 1e12, 2 * side ** 3 / mm / 1e12


def cluster_document(fit: LinkFit) -> dict:
    link = {"GBps": round(fit.gbps, 4), "latency_us": round(fit.latency_us, 2), "efficiency": 1.0}
    return {"devices_per_node": DEVICES_PER_NODE, "nodes_per_domain": 1,
            "collective_latency_us": round(fit.collective_latency_us, 2),
            "links": {"scale_up": link, "domain": link, "scale_out": link}}


def device_document(tbps: float, tflops: float, fit: LinkFit, memory_gb: float = 16.0) -> dict:
    return {"peak_tflops": round(tflops, 6), "efficiency": 1.0, "gemm_efficiency": 1.0, "hbm_TBps": round(tbps, 6),
            "hbm_efficiency": 1.0, "memory_efficiency": 1.0, "attention_efficiency": 1.0, "flash_efficiency": 1.0,
            "link_gbps": round(fit.gbps, 4), "link_latency_us": round(fit.latency_us, 2), "memory": memory_gb,
            "bytes_per_element": 4, "compute_units": 1}


def probe() -> tuple[dict, dict, LinkFit]:
    """(cluster section, device section, the link fit) measured now on this host."""
    fit = fit_links(measure_links())
    tbps, tflops = measure_device()
    return cluster_document(fit), device_document(tbps, tflops, fit), fit


def main(argv: list[str]) -> int:
    cluster, device, fit = probe()
    doc = {"cluster": cluster, "device": device}
    text = json.dumps(doc, indent=2) + "\n"
    if argv[:1] in (["-o"], ["--output"]) and len(argv) > 1:
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(f"link fit over {len(fit.samples)} samples: rms relative error {fit.rms_relative_error:.1%}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
