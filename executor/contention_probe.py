"""How much ranks on one host slow each other down: the `host.contention`
the simulator needs (see `mpipe_core.contention`).

A fused baseline cannot tell: in it the encoder runs while the other ranks
mostly wait, so its fitted costs are solo costs, and a transposed schedule,
which runs encoder work on every rank at once, then takes longer than
predicted.  The probe times the model's own encoder forward on one
microbatch in `devices` processes (one thread each, like the executor's
ranks): each process alone while the others wait at a barrier, then all of
them at once, alternating so that drifting background load falls on both.
With k processes busy each runs at 1 / (1 + c (k - 1)) of its solo speed, so
c = (together / alone - 1) / (k - 1).
"""
from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass

from .model import ModelConfig


@dataclass
class ContentionProbe:
    devices: int
    alone_ms: list[float]
    together_ms: list[float]

    @property
    def contention(self) -> float:
        ratio = statistics.fmean(self.together_ms) / statistics.fmean(self.alone_ms)
        return max(0.0, (ratio - 1.0) / max(1, self.devices - 1))

    def host(self) -> dict:
        """The workload's `host` section (every probed device on one host)."""
        return {"devices": None, "contention": round(self.contention, 4)}

    def format(self) -> str:
        return (f"encoder forward alone {statistics.fmean(self.alone_ms):.1f} ms, {self.devices} at once "
                f"{statistics.fmean(self.together_ms):.1f} ms -> host contention {self.contention:.2f}")


def _child(rank: int, devices: int, cfg_doc: dict, rounds: int, reps: int, barrier, out) -> None:
    import torch

    from .model import VisionEncoder, make_microbatch

    torch.set_num_threads(1)
    cfg = ModelConfig.from_dict(cfg_doc)
    encoder = VisionEncoder(cfg)
    images = make_microbatch(cfg, 0, 0, 1).images

    def timed() -> list[float]:
        times = []
        with torch.no_grad():
            for _ in range(reps):
                t = time.perf_counter()
                encoder(images)
                times.append((time.perf_counter() - t) * 1000)
        return times

    timed()  # warm-up (allocations, first-call costs)
    alone, together = [], []
    for _ in range(rounds):
        for turn in range(devices):
            barrier.wait()
            if turn == rank:
                alone += timed()
            barrier.wait()
        barrier.wait()
        together += timed()
        barrier.wait()
    out.put((rank, alone, together))


def probe_contention(cfg: ModelConfig, devices: int = 2, rounds: int = 3, reps: int = 3,
                     timeout_s: float = 300.0) -> ContentionProbe:
    """Time the encoder alone and `devices` at once (separate processes, one thread each)."""
    if cfg.enc_layers <= 0:
        raise ValueError("the contention probe times the encoder: this model has none")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(devices, timeout=timeout_s)
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(r, devices, cfg.to_dict(), rounds, reps, barrier, out), daemon=True)
             for r in range(devices)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=timeout_s) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    alone = [t for _, a, _ in results for t in a]
    together = [t for _, _, b in results for t in b]
    return ContentionProbe(devices, alone, together)
