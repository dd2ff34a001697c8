"""How much ranks on one host slow each other down: the `host.contention`
the simulator needs (see `mpipe_core.contention`).

A fused baseline cannot tell: in it the encoder runs while the other ranks
mostly wait, so its fitted costs are solo costs, and a transposed schedule,
which runs encoder work on every rank at once, then takes longer than
predicted.  The probe times the model's own encoder forward on one
microbatch in `devices` processes (one thread each, like the executor's
ranks): each process alone while the others wait at a barrier, then all of
them at once (each process in a session of its own, like a torchrun rank),
alternating round by round so that drifting background load
falls on both.  With k processes busy each runs at 1 / (1 + c (k - 1)) of its
solo speed, so c = (together / alone - 1) / (k - 1), taken as the median over
rounds of each round's ratio (a round is a few hundred ms: background load
that comes and goes between rounds moves single rounds, not the median).

It also times the forward on half the microbatch's images alone: an encoder op
costs a fixed part plus a part per image, T(n) = fixed + n x per-image, so
fixed = 2 T(n/2) - T(n).  A microbatch split into shards pays the fixed part
once per shard (layer launches, Python per block): the workload's
`host.dispatch`.
"""
from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time
from dataclasses import dataclass, field

from .model import ModelConfig


@dataclass
class ContentionProbe:
    devices: int
    alone_ms: list[list[float]]  # per round, every process's solo times
    together_ms: list[list[float]]  # per round, every process's times with all running
    half_ms: list[list[float]] = field(default_factory=list)  # per round, solo on half the images

    @property
    def ratios(self) -> list[float]:
        return [statistics.fmean(b) / statistics.fmean(a) for a, b in zip(self.alone_ms, self.together_ms)]

    @property
    def contention(self) -> float:
        return max(0.0, (statistics.median(self.ratios) - 1.0) / max(1, self.devices - 1))

    @property
    def fixed_ms(self) -> float:
        """The encoder op's fixed part (paired by round, median): what each extra shard pays."""
        if not self.half_ms:
            return 0.0
        parts = [2 * statistics.fmean(h) - statistics.fmean(a) for a, h in zip(self.alone_ms, self.half_ms)]
        return max(0.0, statistics.median(parts))

    def host(self) -> dict:
        """The workload's `host` section (every probed device on one host)."""
        return {"devices": None, "contention": round(self.contention, 4), "dispatch": round(self.fixed_ms, 4)}

    def format(self) -> str:
        alone = statistics.fmean(t for r in self.alone_ms for t in r)
        together = statistics.fmean(t for r in self.together_ms for t in r)
        ratios = sorted(self.ratios)
        return (f"encoder forward alone {alone:.1f} ms, {self.devices} at once {together:.1f} ms; per-round "
                f"ratio {ratios[0]:.2f}..{ratios[-1]:.2f}, median {statistics.median(ratios):.2f} "
                f"-> host contention {self.contention:.2f}; fixed part of one encoder op {self.fixed_ms:.1f} ms")


def _child(rank: int, devices: int, cfg_doc: dict, rounds: int, reps: int, barrier, out) -> None:
    import os

    # A session of its own, as torchrun gives every rank: with Linux's scheduler
    # autogroups each session gets a fair share of a loaded machine, so two ranks
    # in one session would compete for one share and look far more contended.
    os.setsid()
    import torch

    from .model import VisionEncoder, make_microbatch

    torch.set_num_threads(1)
    cfg = ModelConfig.from_dict(cfg_doc)
    encoder = VisionEncoder(cfg)
    images = make_microbatch(cfg, 0, 0, 1).images
    half = images[: max(1, len(images) // 2)]

    def timed(batch=images) -> list[float]:
        times = []
        with torch.no_grad():
            for _ in range(reps):
                t = time.perf_counter()
                encoder(batch)
                times.append((time.perf_counter() - t) * 1000)
        return times

    timed()  # warm-up (allocations, first-call costs)
    timed(half)
    alone, together, halves = [], [], []
    for _ in range(rounds):
        for turn in range(devices):
            barrier.wait()
            if turn == rank:
                alone.append(timed())
                halves.append(timed(half))
            barrier.wait()
        barrier.wait()
        together.append(timed())
        barrier.wait()
    out.put((rank, alone, together, halves))


def probe_contention(cfg: ModelConfig, devices: int = 2, rounds: int = 8, reps: int = 1,
                     timeout_s: float = 300.0) -> ContentionProbe:
    """Time the encoder alone and `devices` at once (separate processes, one thread each)."""
    if cfg.encoder is None or cfg.enc_layers <= 0:
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
    alone = [[t for r in results for t in r[1][k]] for k in range(rounds)]
    together = [[t for r in results for t in r[2][k]] for k in range(rounds)]
    half = [[t for r in results for t in r[3][k]] for k in range(rounds)]
    return ContentionProbe(devices, alone, together, half)


def main(argv: list[str] | None = None) -> None:
    """`python -m executor.runtime.contention_probe [--model NAME] [--devices N]`: print the host's contention."""
    import argparse

    from .model import MODEL_PRESETS

    ap = argparse.ArgumentParser(prog="python -m executor.runtime.contention_probe")
    ap.add_argument("--model", default="tiny", choices=sorted(MODEL_PRESETS))
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args(argv)
    if args.devices < 2 or args.rounds < 1:
        print("error: --devices must be >= 2 and --rounds >= 1", file=sys.stderr)
        sys.exit(2)
    try:
        result = probe_contention(MODEL_PRESETS[args.model], devices=args.devices, rounds=args.rounds)
    except ValueError as error:
        print(f"error: model '{args.model}': {error}", file=sys.stderr)
        sys.exit(2)
    print(result.format())
    print(f"use: mpipe compare-run RUN --contention {result.contention:.2f}")


if __name__ == "__main__":
    main()
