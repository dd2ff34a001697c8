"""How much ranks on one host slow each other down: the `host.contention`
the simulator needs (see `mpipe_core.simulation.contention`).

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

Ranks slow each other down by different amounts depending on what they run
(`mpipe_core.workloads.hardware.Host.pairs`): measured here, an LLM op beside an
encoder forward ran ~1.4x its time alone, two encoders only ~1.03x each (the
encoder streams its weights through the shared last-level cache; the LLM's
small working set lived there).  So the probe also times a stand-in of one
LLM pipeline op (forward and backward through the layers one of `devices`
ranks holds, at the model's width and sequence length) alone, beside an
encoder forward on every other process, and with all processes running it;
and the encoder beside LLM ops.  Each pair's c is derived like the one above.

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


def _excess(alone: list[list[float]], beside: list[list[float]], devices: int) -> float:
    """c from per-round times alone and beside `devices - 1` busy others: the
    median over rounds of (beside / alone - 1) / (devices - 1), never negative."""
    ratios = [statistics.fmean(b) / statistics.fmean(a) for a, b in zip(alone, beside) if a and b]
    if not ratios:
        return 0.0
    return max(0.0, (statistics.median(ratios) - 1.0) / max(1, devices - 1))


@dataclass
class ContentionProbe:
    devices: int
    alone_ms: list[list[float]]  # per round, every process's solo times
    together_ms: list[list[float]]  # per round, every process's times with all running
    half_ms: list[list[float]] = field(default_factory=list)  # per round, solo on half the images
    # Per round: the LLM stand-in op alone, beside encoders, with all running it;
    # and the encoder beside LLM ops (empty: not probed).
    llm_alone_ms: list[list[float]] = field(default_factory=list)
    llm_beside_encoder_ms: list[list[float]] = field(default_factory=list)
    llm_together_ms: list[list[float]] = field(default_factory=list)
    encoder_beside_llm_ms: list[list[float]] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [statistics.fmean(b) / statistics.fmean(a) for a, b in zip(self.alone_ms, self.together_ms)]

    @property
    def contention(self) -> float:
        """c(encoder, encoder): how much each other busy encoder slows an encoder forward."""
        return _excess(self.alone_ms, self.together_ms, self.devices)

    @property
    def pairs(self) -> dict[str, dict[str, float]]:
        """`host.pairs`: {victim: {other: c}} for the pairs probed (empty without LLM timings).

        Beside one encoder the other `devices - 2` processes also run LLM ops:
        there an LLM op is stretched by 1 + c(llm, encoder) + (devices - 2) c(llm, llm)."""
        if not self.llm_alone_ms:
            return {}
        c_ll = _excess(self.llm_alone_ms, self.llm_together_ms, self.devices)
        c_le = max(0.0, _excess(self.llm_alone_ms, self.llm_beside_encoder_ms, 2) - (self.devices - 2) * c_ll)
        c_el = _excess(self.alone_ms, self.encoder_beside_llm_ms, self.devices)
        return {"llm": {"encoder": round(c_le, 4), "llm": round(c_ll, 4)},
                "encoder": {"encoder": round(self.contention, 4), "llm": round(c_el, 4)}}

    @property
    def fixed_ms(self) -> float:
        """The encoder op's fixed part (paired by round, median): what each extra shard pays."""
        if not self.half_ms:
            return 0.0
        parts = [2 * statistics.fmean(h) - statistics.fmean(a) for a, h in zip(self.alone_ms, self.half_ms)]
        return max(0.0, statistics.median(parts))

    def host(self) -> dict:
        """The workload's `host` section (every probed device on one host)."""
        doc = {"devices": None, "contention": round(self.contention, 4), "dispatch": round(self.fixed_ms, 4)}
        if self.pairs:
            doc["pairs"] = self.pairs
        return doc

    def format(self) -> str:
        alone = statistics.fmean(t for r in self.alone_ms for t in r)
        together = statistics.fmean(t for r in self.together_ms for t in r)
        ratios = sorted(self.ratios)
        text = (f"encoder forward alone {alone:.1f} ms, {self.devices} at once {together:.1f} ms; per-round "
                f"ratio {ratios[0]:.2f}..{ratios[-1]:.2f}, median {statistics.median(ratios):.2f} "
                f"-> host contention {self.contention:.2f}; fixed part of one encoder op {self.fixed_ms:.1f} ms")
        if self.pairs:
            def mean(rows: list[list[float]]) -> float:
                values = [t for r in rows for t in r]
                return statistics.fmean(values) if values else float("nan")

            text += (f"; LLM op alone {mean(self.llm_alone_ms):.1f} ms, beside encoders "
                     f"{mean(self.llm_beside_encoder_ms):.1f}, all at once {mean(self.llm_together_ms):.1f}; "
                     f"encoder beside LLM ops {mean(self.encoder_beside_llm_ms):.1f} ms -> pairs "
                     + ", ".join(f"{v}|{o} {c:.2f}" for v, row in self.pairs.items() for o, c in row.items()))
        return text


def _child(rank: int, devices: int, cfg_doc: dict, rounds: int, reps: int, llm_reps: int, barrier, done,
           timed_beside, out) -> None:
    import os

    # A session of its own, as torchrun gives every rank: with Linux's scheduler
    # autogroups each session gets a fair share of a loaded machine, so two ranks
    # in one session would compete for one share and look far more contended.
    os.setsid()
    import torch

    from .model import LanguageModel, VisionEncoder, make_microbatch

    torch.set_num_threads(1)
    cfg = ModelConfig.from_dict(cfg_doc)
    encoder = VisionEncoder(cfg)
    images = make_microbatch(cfg, 0, 0, 1).images
    half = images[: max(1, len(images) // 2)]
    # The LLM stand-in: the blocks one of `devices` ranks holds, forward and backward.
    llm = LanguageModel(cfg, layers=range(max(1, cfg.n_layer // devices)), embed=False, head=False)
    x = torch.randn(cfg.batch, cfg.seq_len, cfg.d_model)

    def timed(batch=images) -> list[float]:
        times = []
        with torch.no_grad():
            for _ in range(reps):
                t = time.perf_counter()
                encoder(batch)
                times.append((time.perf_counter() - t) * 1000)
        return times

    def llm_op() -> float:
        t = time.perf_counter()
        llm.run_layers(x.requires_grad_(), range(max(1, cfg.n_layer // devices))).sum().backward()
        return (time.perf_counter() - t) * 1000

    timed()  # warm-up (allocations, first-call costs)
    timed(half)
    llm_op()
    alone, together, halves = [], [], []
    llm_alone, llm_beside, llm_together, enc_beside = [], [], [], []
    for _ in range(rounds):
        for turn in range(devices):
            barrier.wait()
            if turn == rank:
                alone.append(timed())
                halves.append(timed(half))
                llm_alone.append([llm_op() for _ in range(llm_reps)])
            barrier.wait()
        barrier.wait()
        together.append(timed())
        barrier.wait()
        # One process runs the encoder (forwards for at least 3 LLM ops' time, so that a
        # small encoder still has LLM ops beside it, and until every other process has
        # finished one: on a loaded host a process can be descheduled for that long); every
        # other one runs LLM ops until it is done (an op still running when it ends is left out).
        beside: list[float] = []
        for turn in range(devices):
            barrier.wait()
            if turn == rank:
                times, t0 = [], time.perf_counter()
                while (not times or (time.perf_counter() - t0) * 1000 < 3 * statistics.median(llm_alone[-1])
                       or timed_beside.value < devices - 1):
                    times += timed()
                enc_beside.append(times)
                done.set()
            else:
                counted = False
                while not done.is_set():
                    t = llm_op()
                    if not done.is_set():
                        beside.append(t)
                        if not counted:
                            with timed_beside.get_lock():
                                timed_beside.value += 1
                            counted = True
            barrier.wait()
            if turn == rank:
                done.clear()
                timed_beside.value = 0
            barrier.wait()
        llm_beside.append(beside)
        barrier.wait()
        llm_together.append([llm_op() for _ in range(llm_reps)])
        barrier.wait()
    out.put((rank, alone, together, halves, llm_alone, llm_beside, llm_together, enc_beside))


def probe_contention(cfg: ModelConfig, devices: int = 2, rounds: int = 8, reps: int = 1, llm_reps: int = 3,
                     timeout_s: float = 300.0) -> ContentionProbe:
    """Time the encoder and the LLM stand-in alone, side by side and all at once
    (separate processes, one thread each)."""
    if cfg.encoder is None or cfg.enc_layers <= 0:
        raise ValueError("the contention probe times the encoder: this model has none")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(devices, timeout=timeout_s)
    done = ctx.Event()
    timed_beside = ctx.Value("i", 0)  # processes with an LLM op timed beside this turn's encoder
    out = ctx.Queue()
    args = (devices, cfg.to_dict(), rounds, reps, llm_reps, barrier, done, timed_beside, out)
    procs = [ctx.Process(target=_child, args=(r, *args), daemon=True) for r in range(devices)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=timeout_s) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()

    def per_round(field_no: int) -> list[list[float]]:
        return [[t for r in results for t in r[field_no][k]] for k in range(rounds)]

    return ContentionProbe(devices, per_round(1), per_round(2), per_round(3), llm_alone_ms=per_round(4),
                           llm_beside_encoder_ms=per_round(5), llm_together_ms=per_round(6),
                           encoder_beside_llm_ms=per_round(7))


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
