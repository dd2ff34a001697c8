"""Executor benchmark (issues 5 and 15): measured step times on CPU/gloo vs the simulator.

    python -m benchmarks executor [--launches 3] [--rounds 6] [--steps 2] [--p 2] [--m 8]
                                  [--no-runtime] [--no-contention] [--wait-quiet SECONDS] [--raw FILE]
                                  [--statistic median|mean]
                                  [--runtime-builds 5] [--runtime-steps 5]

torchrun launches of 2 ranks (gloo, one thread per rank), progress on stderr:

1. **Runtime overhead** (last; `--no-runtime` leaves it out) — our runtime vs
   PyTorch's own `_PipelineScheduleRuntime` executing our exported torch CSV
   on a text-only LLM, steps alternating in one process group
   (`benchmarks.torch_runtime_bench`).  Target ours/torch <= 1.05.
2. **Transpose** — the fused baseline (frozen ViT on stage 0) vs transpose
   (prefix, dynamic, dynamic with shards, on 1F1B and ZB-H1 bodies) on an
   encoder-heavy model.  Each of `--launches` timed launches runs every
   schedule in rounds (A B C ... A B C ...) so background load falls on all of
   them; step 0 of each job is a warm-up; the figure is the median step
   makespan.  Target speedup >= 1.3.
3. **Simulator vs measured** (issue 15) — a profiling launch first fits fused
   `1f1b` and `zb_h1` (`executor.analysis.calibrate.fit`), and every term is
   evaluated on those costs, so `mode=dynamic` places encoder work by them.
   Before the profile, and before and after each timed launch, the host is
   probed (`executor.runtime.contention_probe`: how much the two ranks slow
   each other down, and the fixed part of one encoder op that each shard pays
   again).  In each launch the fused baselines' steps are fitted with that
   host section and every schedule, exactly as run, is simulated on the fit:
   simulated / measured per schedule, predicted vs measured speedup, the same
   with costs from another launch (cross-launch), and for each transposed
   schedule the gap split by cause (`compare-run --explain`'s analysis).  Op
   times are fitted and step times compared by one statistic (`--statistic`,
   median by default).  Last, the two causes measured to move the transposed
   rows that the model leaves out or mis-measures, with their sizes: LLM ops on
   a device that idles between ops (the baseline's) against the same ops on a
   busy one, and the contention the run showed against the probe's.

CPU timings on a shared 2-core machine move with whatever else runs there:
the CPU time other processes used (sampled from /proc, this benchmark's own
process tree excluded) is printed per part; `--wait-quiet S` first waits up to
S seconds for other processes to leave the CPUs before each launch.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import defaultdict

from executor.runtime.jobs import Job
from executor.runtime.model import ModelConfig
from executor.runtime.model_workload import workload_for
from executor.service.launch import LaunchOptions, launch
from mpipe_core.api import evaluate
from mpipe_core.ir.ops import LLM

from . import torch_runtime_bench

# Frozen ViT far heavier than the LLM: 24 blocks of width 256 on 8 images of
# 16 patches per microbatch, feeding an 8-block width-64 decoder.
VIT_HEAVY_FROZEN = ModelConfig(vocab=128, d_model=64, n_layer=8, n_head=4, text_len=32,
                               image_size=32, patch=8, d_enc=256, enc_layers=24, enc_heads=4,
                               images_min=8, images_max=8, batch=1, trainable_encoder=False)

TRANSPOSE_TERMS = [  # (term, baseline term)
    ("1f1b(p={p}, m={m})", None),
    ("transpose(1f1b(p={p}, m={m}), mode=prefix)", "1f1b(p={p}, m={m})"),
    ("transpose(1f1b(p={p}, m={m}), mode=dynamic)", "1f1b(p={p}, m={m})"),
    ("transpose(1f1b(p={p}, m={m}), mode=dynamic, shards=2)", "1f1b(p={p}, m={m})"),
    ("zb_h1(p={p}, m={m})", None),
    ("transpose(zb_h1(p={p}, m={m}), mode=dynamic, shards=2)", "zb_h1(p={p}, m={m})"),
]
PROFILE_TERMS = ["1f1b(p={p}, m={m})", "zb_h1(p={p}, m={m})"]
RUNTIME_TARGET, TRANSPOSE_TARGET = 1.05, 1.3
QUIET = 0.2  # CPUs used by other processes below which the machine counts as quiet


def log(msg: str) -> None:
    sys.stderr.write(f"[executor-bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


class LoadMonitor(threading.Thread):
    """CPU used by processes outside this benchmark's process tree, sampled every
    `interval` s from /proc (Linux): the background load our timings compete with."""

    def __init__(self, interval: float = 0.5):
        super().__init__(daemon=True)
        self.interval, self.samples, self._stop_evt = interval, [], threading.Event()
        self.cpus = os.cpu_count() or 1
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @staticmethod
    def _busy_total() -> int:
        with open("/proc/stat") as fh:
            vals = [int(v) for v in fh.readline().split()[1:9]]
        return sum(vals) - vals[3] - vals[4]

    @staticmethod
    def _ours() -> int:
        """CPU ticks of live processes descending from this one (this one included)."""
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                    stats[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
                except (OSError, IndexError, ValueError):
                    continue
        me, total = os.getpid(), 0
        for pid, (_, ticks) in stats.items():
            q, seen = pid, 0
            while q > 1 and q in stats and seen < 64:
                if q == me:
                    total += ticks
                    break
                q, seen = stats[q][0], seen + 1
        return total

    def run(self) -> None:
        try:
            prev = (time.monotonic(), self._busy_total(), self._ours())
            while not self._stop_evt.wait(self.interval):
                now = (time.monotonic(), self._busy_total(), self._ours())
                wall = (now[0] - prev[0]) * self.tick
                other = (now[1] - prev[1]) - max(0, now[2] - prev[2])
                self.samples.append((now[0], max(0.0, other / wall)))  # in cores
                prev = now
        except OSError:
            pass

    def mean_since(self, t0: float, t1: float | None = None) -> float:
        vals = [v for t, v in self.samples if t >= t0 and (t1 is None or t <= t1)]
        return statistics.mean(vals) if vals else float("nan")

    def stop(self) -> None:
        self._stop_evt.set()


def describe_vit(cfg: ModelConfig) -> str:
    wl = workload_for(cfg)
    enc_f = wl["encoders"][0]["f"] * cfg.images_max  # per microbatch, in LLM-layer forwards
    return (f"frozen ViT {cfg.enc_layers} blocks x width {cfg.d_enc}, {cfg.enc_heads} heads, "
            f"{cfg.images_max} images/microbatch of {cfg.channels}x{cfg.image_size}x{cfg.image_size}, "
            f"patch {cfg.patch} ({cfg.tokens_per_image} tokens/image); LLM {cfg.n_layer} blocks x width "
            f"{cfg.d_model}, {cfg.n_head} heads, vocab {cfg.vocab}, {cfg.batch}x{cfg.seq_len} tokens "
            f"({cfg.max_images_per_sample * cfg.tokens_per_image} image + {cfg.text_len} text); "
            f"encoder forward = {enc_f:.0f} LLM-layer forwards by FLOPs")


# --------------------------------------------------------------------------- part 3: calibration

def fit_profile(results: list[dict], term: str, workload: dict, host: dict | None = None,
                statistic: str = "median", fit_contention: bool = True):
    """`executor.analysis.calibrate.fit` on the timelines of jobs running `term` (pooled,
    each job's warm-up step left out): per-chunk LLM costs, per-microbatch
    encoder costs, dispatch overhead, link latency (ms), each the `statistic`
    of its measured times; solo costs on a host with `host` contention (with
    `fit_contention`, the prior of the contention these jobs' own overlaps give)."""
    from executor.analysis.calibrate import fit

    return fit(_measured(results, term, workload), name=f"profile of {term}", host=host, statistic=statistic,
               fit_contention=fit_contention and host is not None)


def _measured(results: list[dict], term: str, workload: dict):
    """The jobs' timelines as one `MeasuredRun` (steps renumbered one after another)."""
    from executor.analysis.calibrate import measured_from_rows

    rows, base = [], 0
    for k, result in enumerate(results):
        for r in result.timeline:
            if k and r.step == 0:  # fit() itself leaves out the first job's warm-up
                continue
            rows.append(r._replace(step=base + r.step))
        base += result.steps
    return measured_from_rows(term, workload, rows)


def simulated(schedule, doc: dict):
    """The simulator's timeline of this very schedule on a calibrated workload."""
    from mpipe_core.simulation.simulator import simulate
    from mpipe_core.workloads.workload import load_workload

    return simulate(schedule, load_workload(doc))


def simulated_ms(schedule, doc: dict) -> float:
    """Makespan (ms) the simulator gives this very schedule on a calibrated workload."""
    tl = simulated(schedule, doc)
    return tl.makespan - min(tl.start, default=0.0)


def has_split_backward(schedule) -> bool:
    return any(op.module == LLM and op.kind == "W" for order in schedule.orders for op in order)


# --------------------------------------------------------------------------- parts 2 and 3

def _progress(part: str, total: int):
    done = [0]

    def report(result: dict) -> None:
        done[0] += 1
        ms = ", ".join(f"{x * 1000:.0f}" for x in result.makespan)
        log(f"{part}: [{done[0]}/{total}] {result.name}: step makespans {ms} ms")
    return report


def _calibrated_schedule(term: str, docs: dict[str, dict]):
    """The term evaluated on the calibrated workload matching its backward kind."""
    ev = evaluate(term, docs["BW"])
    if has_split_backward(ev.schedule):
        ev = evaluate(term, docs["split"])
    return ev


def _kind(schedule) -> str:
    return "split" if has_split_backward(schedule) else "BW"


def probe(cfg: ModelConfig, p: int) -> dict:
    """The host's contention (`executor.runtime.contention_probe`), as the workload's host section."""
    from executor.runtime.contention_probe import probe_contention

    result = probe_contention(cfg, devices=p)
    log(f"contention probe: {result.format()}")
    return result.host()


def profile(p: int, m: int, cfg: ModelConfig, host: dict | None, statistic: str = "median"):
    """The profiling launch: fused `1f1b` and `zb_h1`, fitted; every benchmarked term
    evaluated (so `mode=dynamic` placed) on those calibrated costs."""
    wl = workload_for(cfg, name="bench")
    terms = [t.format(p=p, m=m) for t in PROFILE_TERMS]
    jobs = [Job.make(f"profile:{t}", evaluate(t, wl).schedule, cfg, steps=3) for t in terms]
    log(f"part 3: profiling launch, {p} ranks: {', '.join(terms)} (steps 1-2 of each are the profile)")
    prof = {r.name: r for r in launch(jobs, LaunchOptions(nproc=p, stall_s=120),
                                         on_result=_progress("part 3 profile", len(jobs)))}
    fits = {kind: fit_profile([prof[f"profile:{t}"]], t, wl, host, statistic)
            for kind, t in zip(("BW", "split"), terms)}
    docs = {kind: f.workload for kind, f in fits.items()}
    bench = [(t.format(p=p, m=m), b and b.format(p=p, m=m)) for t, b in TRANSPOSE_TERMS]
    evals = {t: _calibrated_schedule(t, docs) for t, _ in bench}
    return bench, evals, fits


def timed_launch(p: int, rounds: int, steps: int, cfg: ModelConfig, bench, evals, label: str) -> dict:
    """One timed launch: every schedule (as placed by the profile) in rounds."""
    wl = workload_for(cfg, name="bench")
    jobs = [Job.make(f"round{r}:{t}", evals[t].schedule, cfg, steps=steps)
            for r in range(rounds) for t, _ in bench]
    log(f"part 2 ({label}): timed launch, {p} ranks, {len(jobs)} jobs ({rounds} rounds of {len(bench)} schedules)")
    results = launch(jobs, LaunchOptions(nproc=p, stall_s=120), on_result=_progress(f"part 2 ({label})", len(jobs)))
    by_term: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_term[r.name.split(":", 1)[1]].append(r)
    losses: dict[int, list[float]] = defaultdict(list)
    for r in results:
        for s, loss in enumerate(r.loss):
            losses[s].append(loss)
    loss_spread = max((max(v) - min(v)) / abs(min(v)) for v in losses.values())
    measured = {}
    for term, _ in bench:
        steps_ms = [x for r in by_term[term] for x in r.makespan[1:]]
        measured[term] = {"median": statistics.median(steps_ms), "mean": statistics.fmean(steps_ms),
                          "best": min(steps_ms), "steps": steps_ms,
                          "by_round": [statistics.median(r.makespan[1:]) for r in by_term[term]]}
    return {"label": label, "results": by_term, "measured": measured, "loss_spread": loss_spread}


def fit_launch(run: dict, bench, cfg: ModelConfig, host: dict | None, statistic: str = "median",
               evals=None, contention_from: str = "run") -> None:
    """The launch's host and fused baselines fitted: the costs every schedule of the
    launch is predicted from.  The host's contention comes from the launch's own
    overlapping ops, every schedule of it (`executor.analysis.host_fit`, with the
    probe `host` as the prior), or with `contention_from="probe"` from the probe
    alone; then the fused baselines give solo costs on that host (op times' `statistic`)."""
    wl = workload_for(cfg, name="bench")
    run["probe_host"] = host
    run["host_fit"] = None
    if host is not None and contention_from == "run":
        from executor.analysis.host_fit import fit_host

        run["host_fit"] = fit_host([_measured(run["results"][t], t, evals[t].workload) for t, _ in bench],
                                   prior=host)
        host = dict(run["host_fit"].host)
    run["host"] = host
    run["stat"] = statistic  # the measured steps are compared by the same statistic
    run["fits"] = {}
    for term, base in bench:
        if base is None:
            fitted = fit_profile(run["results"][term], term, wl, host, statistic, fit_contention=False)
            run["fits"]["split" if "W" in {c.kind for c in fitted.costs} else "BW"] = fitted


def predict(run: dict, costs_from: dict, bench, evals) -> dict[str, float]:
    """Each schedule's makespan (s) simulated on the fused baselines' fit of `costs_from`."""
    return {t: simulated_ms(evals[t].schedule, costs_from["fits"][_kind(evals[t].schedule)].workload) / 1000
            for t, _ in bench}


def average_hosts(hosts: list[dict]) -> dict:
    """The probes' host sections averaged (contention, dispatch and every pair)."""
    out = {"devices": None, "contention": statistics.fmean(h["contention"] for h in hosts),
           "dispatch": statistics.fmean(h["dispatch"] for h in hosts)}
    if all(h.get("pairs") for h in hosts):
        first = hosts[0]["pairs"]
        out["pairs"] = {v: {o: statistics.fmean(h["pairs"][v][o] for h in hosts) for o in row}
                        for v, row in first.items()}
    return out


def cold_llm_ops(run: dict, term: str, base: str, evals) -> str:
    """The unmodelled cause this benchmark shows (see docs/simulator-assumptions.md):
    per device, the median time of the LLM ops a transposed schedule ran against
    the same ops in its fused baseline, where that device idled between them."""
    parts = []
    for d in range(len(evals[term].schedule.orders)):
        here, there = _llm_op_times(run["results"][term], d), _llm_op_times(run["results"][base], d)
        keys = sorted(set(here) & set(there))
        if not keys:
            continue
        steps = sum(r.steps - 1 for r in run["results"][term])
        per_step = sum(len(here[k]) / steps * (statistics.median(here[k]) - statistics.median(there[k])) for k in keys)
        total = sum(len(here[k]) / steps * statistics.median(there[k]) for k in keys)
        parts.append(f"device {d} {per_step:+.1f} ms per step ({per_step / total:+.0%} of its LLM time; baseline "
                     f"idle {_idle_share(run['results'][base], d):.0%})")
    return ", ".join(parts)


def encoder_slowdown(run: dict, term: str, base: str) -> float | None:
    """The contention the transposed run itself showed: the median encoder forward
    that overlapped another device's encoder forward (most of its time) over the
    median one in the fused baseline that overlapped nothing, less 1 (None if
    either is missing)."""
    beside = _encoder_times(run["results"][term], overlapped=True)
    alone = _encoder_times(run["results"][base], overlapped=False)
    if not beside or not alone:
        return None
    return statistics.median(beside) / statistics.median(alone) - 1


def _encoder_times(results, overlapped: bool) -> list[float]:
    """Durations (ms) of whole-microbatch encoder forwards of the timed steps that ran
    beside another device's encoder forward for >= 80% of their time (`overlapped`),
    or beside nothing at all (not `overlapped`)."""
    out = []
    for r in results:
        for step in range(1, r.steps):
            rows = [x for x in r.timeline if x.step == step]
            for x in rows:
                if x.module == LLM or x.kind != "F" or x.end <= x.start:
                    continue
                others = [y for y in rows if y.device != x.device]
                share = sum(max(0.0, min(y.end, x.end) - max(y.start, x.start))
                            for y in others if y.module != LLM) / (x.end - x.start)
                busy = sum(max(0.0, min(y.end, x.end) - max(y.start, x.start)) for y in others)
                if (overlapped and share >= 0.8) or (not overlapped and busy == 0.0):
                    out.append((x.end - x.start) * 1000)
    return out


def _llm_op_times(results, device: int) -> dict[tuple, list[float]]:
    """LLM op durations (ms) on `device` by (kind, chunk), timed steps only."""
    out: dict[tuple, list[float]] = defaultdict(list)
    for r in results:
        for row in r.timeline:
            if row.step > 0 and row.device == device and row.module == LLM and row.end > row.start:
                out[(row.kind, row.chunk)].append((row.end - row.start) * 1000)
    return out


def _idle_share(results, device: int) -> float:
    """The share of its timed steps `device` spent between ops (waiting)."""
    busy = total = 0.0
    for r in results:
        for step in range(1, r.steps):
            rows = [x for x in r.timeline if x.step == step]
            total += max(x.end for x in rows) - min(x.start for x in rows)
            busy += sum(x.end - x.start for x in rows if x.device == device)
    return 1 - busy / total if total else 0.0


def explain_row(run: dict, term: str, evals, top: int = 3) -> list[tuple[str, float]]:
    """The gap of `term` in this launch by cause (ms, mean over its timed steps), largest first."""
    from types import SimpleNamespace

    from executor.analysis.compare_run import explain_steps
    from mpipe_core.workloads.workload import load_workload

    fitted = run["fits"][_kind(evals[term].schedule)]
    # Evaluated on the profile's costs, the term gives back the very placement that ran.
    measured = _measured(run["results"][term], term, evals[term].workload)
    schedule = evals[term].schedule
    assert measured.evaluation.schedule == schedule
    ev = SimpleNamespace(schedule=schedule, workload=load_workload(fitted.workload),
                         timeline=simulated(schedule, fitted.workload))
    explanation = explain_steps(measured, ev, fitted.overhead_ms)
    return [(e["cause"], e["gap_ms"]) for e in explanation[:top]]


# --------------------------------------------------------------------------- the tables

FIDELITY = 0.10  # simulated / measured and predicted / measured speedup within 10%


def runtime_table(runtime_rows: list[dict]) -> list[str]:
    out = ["| part 1 runtime | measured step, ms: median (best) | torch `_PipelineScheduleRuntime` on our CSV | "
           "ours / torch | target |", "|---|---|---|---|---|"]
    for r in runtime_rows:
        ok = "met" if r["ratio"] <= RUNTIME_TARGET else "missed"
        out.append(f"| `{r['term']}`, ours | {r['ours'] * 1000:.1f} ({min(r['ours_steps']) * 1000:.1f}) | "
                   f"{r['torch'] * 1000:.1f} ({min(r['torch_steps']) * 1000:.1f}) | {r['ratio']:.3f} (paired by "
                   f"step {r['paired_ratio']:.3f}; CPU s/step {r['ours_cpu']:.3f} vs {r['torch_cpu']:.3f}) | "
                   f"<= {RUNTIME_TARGET}: {ok} |")
    return out


def _mark(ratio: float) -> str:
    return f"{ratio:.2f}" if abs(ratio - 1) <= FIDELITY else f"**{ratio:.2f}**"


def fidelity_table(runs: list[dict], preds: list[dict], bench) -> list[str]:
    """Per schedule and launch: measured (the launch's statistic of its steps), simulated
    (on that launch's fused fit of the same statistic), ratio."""
    head = "| schedule | " + " | ".join(f"{r['label']}: measured ms | simulated ms | sim / meas" for r in runs) + " |"
    out = [head, "|---|" + "---|---|---|" * len(runs)]
    for term, base in bench:
        cells = []
        for run, pred in zip(runs, preds):
            meas = run["measured"][term][run["stat"]]
            fitted = " (fitted)" if base is None else ""
            cells.append(f"{meas * 1000:.1f} | {pred[term] * 1000:.1f}{fitted} | {_mark(pred[term] / meas)}")
        out.append(f"| `{term}` | " + " | ".join(cells) + " |")
    return out


def speedup_table(runs: list[dict], preds: list[dict], bench) -> list[str]:
    """Measured vs predicted speedup of every transposed schedule over its fused baseline."""
    head = "| schedule | " + " | ".join(f"{r['label']}: measured (paired by round) | predicted | pred / meas"
                                        for r in runs) + " |"
    out = [head, "|---|" + "---|---|---|" * len(runs)]
    for term, base in bench:
        if base is None:
            continue
        cells = []
        for run, pred in zip(runs, preds):
            m = run["measured"]
            got = m[base][run["stat"]] / m[term][run["stat"]]
            paired = statistics.median(a / b for a, b in zip(m[base]["by_round"], m[term]["by_round"]))
            want = pred[base] / pred[term]
            cells.append(f"{got:.2f}x ({paired:.2f}x) | {want:.2f}x | {_mark(want / got)}")
        out.append(f"| `{term}` | " + " | ".join(cells) + " |")
    return out


def cross_table(runs: list[dict], bench, evals) -> list[str]:
    """Costs (and contention) fitted in launch A predict every schedule of launch B."""
    out = ["| costs fitted in | predict | " + " | ".join(f"`{t}`" for t, _ in bench) + " | mean |",
           "|---|---|" + "---|" * (len(bench) + 1)]
    for a in runs:
        for b in runs:
            if a is b:
                continue
            pred = predict(b, a, bench, evals)
            ratios = [pred[t] / b["measured"][t][b["stat"]] for t, _ in bench]
            out.append(f"| {a['label']} | {b['label']} | " + " | ".join(_mark(x) for x in ratios)
                       + f" | {statistics.mean(ratios):.2f} |")
    return out


def next_launch_table(runs: list[dict], other: list[dict], bench, evals, mine: str, theirs: str) -> list[str]:
    """Fit on one launch, predict the next (simulated / measured), every schedule, with
    the contention the benchmark uses (`runs`) beside the other source (`other`, the
    same launches and measurements fitted the other way)."""
    out = [f"| fitted in | predict | schedule | contention {mine} | contention {theirs} |", "|---|---|---|---|---|"]
    for k in range(len(runs) - 1):
        a, b = runs[k], runs[k + 1]
        pa, pb = predict(b, a, bench, evals), predict(b, other[k], bench, evals)
        for t, base in bench:
            meas = b["measured"][t][b["stat"]]
            out.append(f"| {a['label']} | {b['label']} | `{t}`{'' if base is None else ' (transposed)'} | "
                       f"{_mark(pa[t] / meas)} | {_mark(pb[t] / meas)} |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.executor_bench")
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6, help="rounds of the transpose schedules per launch")
    ap.add_argument("--steps", type=int, default=2, help="steps per transpose job (step 0 is a warm-up)")
    ap.add_argument("--launches", type=int, default=3, help="timed launches of the transpose schedules")
    ap.add_argument("--no-contention", action="store_true",
                    help="calibrate without the host contention probe (the simulator's old model)")
    ap.add_argument("--contention-from", choices=("run", "probe"), default="run",
                    help="host contention fitted from each launch's own overlapping ops with the probes as the "
                         "prior (run, the default), or the probes' figures as they are (probe)")
    ap.add_argument("--no-runtime", action="store_true", help="leave out part 1 (ours vs torch's runtime)")
    ap.add_argument("--raw", default=None, metavar="FILE",
                    help="also write every launch's timelines and probes as JSON (for offline analysis)")
    ap.add_argument("--runtime-builds", type=int, default=5, help="fresh builds of both runtimes in part 1")
    ap.add_argument("--runtime-steps", type=int, default=5, help="steps per build in part 1 (first a warm-up)")
    ap.add_argument("--statistic", choices=("median", "mean"), default="median",
                    help="fit op times and compare step times by this statistic (default median: robust "
                         "to a burst of background load)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help=f"before each launch wait up to S seconds for other processes to use < {QUIET} CPUs")
    args = ap.parse_args(argv)
    p, m = args.p, args.m
    if args.launches < 1 or args.rounds < 1 or args.steps < 2:
        print("error: --launches and --rounds must be >= 1 and --steps >= 2 (step 0 is a warm-up)", file=sys.stderr)
        sys.exit(2)
    monitor = LoadMonitor()
    monitor.start()
    t0 = time.monotonic()
    time.sleep(1.0)

    def wait_quiet() -> float:
        """Wait (up to --wait-quiet) for quiet; the load seen over the last 2 s."""
        start = time.monotonic()
        if args.wait_quiet > 0:
            log(f"waiting up to {args.wait_quiet:g} s for other processes to use < {QUIET} CPUs")
            while (time.monotonic() - start < args.wait_quiet
                   and monitor.mean_since(time.monotonic() - 2.0) >= QUIET):
                time.sleep(0.5)
        return monitor.mean_since(time.monotonic() - 2.0)

    before = wait_quiet()
    log(f"other processes use {before:.2f} of {monitor.cpus} CPUs before the run")
    cfg = VIT_HEAVY_FROZEN
    host = None if args.no_contention else probe(cfg, p)
    t1 = time.monotonic()
    bench, evals, profile_fits = profile(p, m, cfg, host, args.statistic)
    raw = {"bench": bench, "launches": []}
    loads = [("profile", monitor.mean_since(t1))]
    runs, quiet = [], []
    for k in range(args.launches):
        quiet.append(wait_quiet())
        probes = [] if args.no_contention else [probe(cfg, p)]
        t = time.monotonic()
        run = timed_launch(p, args.rounds, args.steps, cfg, bench, evals, f"launch {k + 1}")
        loads.append((f"launch {k + 1}", monitor.mean_since(t)))
        if probes:  # probed before and after: the launch ran in between
            probes.append(probe(cfg, p))
            probes = [dict(average_hosts(probes), probes=[x["contention"] for x in probes])]
        fit_launch(run, bench, cfg, {k: v for k, v in probes[0].items() if k != "probes"} if probes else None,
                   args.statistic, evals, args.contention_from)
        run["probes"] = probes[0]["probes"] if probes else []
        runs.append(run)
        raw["launches"].append({"label": run["label"], "probes": run["probes"],
                                "results": {t: [r.to_dict() for r in rs] for t, rs in run["results"].items()}})
        if args.raw:
            with open(args.raw, "w") as fh:
                json.dump(raw, fh)
    runtime_rows = []
    if not args.no_runtime:
        t = time.monotonic()
        log(f"part 1: ours vs torch _PipelineScheduleRuntime, torchrun {p} ranks")
        runtime_rows = torch_runtime_bench.compare(p, m, args.runtime_steps, on_progress=log,
                                                   builds=args.runtime_builds)
        loads.append(("part 1", monitor.mean_since(t)))
    t_end = time.monotonic()
    monitor.stop()
    log(f"done in {t_end - t0:.0f} s")
    preds = [predict(r, r, bench, evals) for r in runs]
    # The same launches fitted with the other contention source, for the side-by-side table.
    other_source = "probe" if args.contention_from == "run" else "run"
    others = []
    if host is not None:
        for run in runs:
            twin = {k: v for k, v in run.items() if k not in ("fits", "host", "host_fit")}
            fit_launch(twin, bench, cfg, run["probe_host"], args.statistic, evals, other_source)
            others.append(twin)

    print(f"Executor benchmark: gloo on CPU, P={p} ranks x 1 thread, M={m} microbatches, {args.launches} timed "
          f"launches, {t_end - t0:.0f} s.  Other processes' CPU use (of {monitor.cpus} CPUs): {before:.2f} before; "
          + ", ".join(f"{name} {v:.2f}" for name, v in loads)
          + (f"; just before each launch " + ", ".join(f"{q:.2f}" for q in quiet) if quiet else ""))
    if not args.no_runtime:
        print(f"- text: {torch_runtime_bench.describe(torch_runtime_bench.TEXT_MODEL)}; {args.runtime_builds} fresh "
              f"builds x {args.runtime_steps - 1} steps (after a warm-up), ours and torch alternating step by step")
    print(f"- vit: {describe_vit(cfg)}; {args.rounds} rounds x {args.steps - 1} timed steps per schedule and "
          "launch, schedules interleaved")
    if host is None:
        print("- host contention: not modelled (--no-contention)")
    else:
        print("- host contention (probe: encoder forward alone vs on both ranks at once; before the profile, "
              "and before and after each launch, averaged): " + "; ".join(
                  f"{r['label']} {r['host']['contention']:.2f} (" + ", ".join(f"{c:.2f}" for c in r["probes"]) + ")"
                  for r in runs) + f"; profile {host['contention']:.2f}.  Fixed part of one encoder op (paid "
              "again by each extra shard; probe: 2 x forward on half the images - forward on all): "
              + ", ".join(f"{r['label']} {r['host']['dispatch']:.1f} ms" for r in runs))
        if all(r["probe_host"].get("pairs") for r in runs):
            print("- contention by what runs beside what (probe: an LLM op alone, beside an encoder forward, and "
                  "on both ranks at once; the encoder beside LLM ops; c of victim|other, averaged per launch): "
                  + "; ".join(f"{r['label']} " + ", ".join(f"{v}|{o} {c:.2f}" for v, row in
                                                          r["probe_host"]["pairs"].items() for o, c in row.items())
                              for r in runs))
        if all(r["host_fit"] is not None for r in runs):
            print("- contention the predictions use: fitted from each launch's own overlapping ops, all its "
                  "schedules, the probes above as the prior (`executor.analysis.host_fit`): "
                  + "; ".join(f"{r['label']} {r['host_fit'].summary()}" for r in runs))
        else:
            print("- contention the predictions use: the probes' (--contention-from probe)")
    if runtime_rows:
        print()
        for line in runtime_table(runtime_rows):
            print(line)
    print()
    steps = args.rounds * (args.steps - 1)
    print(f"Simulated / measured (measured: the {args.statistic} of each schedule's {steps} timed steps; each "
          f"launch's fused baselines fitted from the {args.statistic} op times, the transposed schedules predicted "
          f"from them; bold: outside 1 +- {FIDELITY:.2f}):")
    print()
    for line in fidelity_table(runs, preds, bench):
        print(line)
    print()
    print(f"Transpose speedup over the fused baseline, measured vs predicted (target >= {TRANSPOSE_TARGET}x "
          f"measured; prediction within {FIDELITY:.0%}):")
    print()
    for line in speedup_table(runs, preds, bench):
        print(line)
    if len(runs) > 1:
        print()
        print("Across launches (simulated / measured; costs and contention fitted in one launch, schedules "
              "measured in another):")
        print()
        for line in cross_table(runs, bench, evals):
            print(line)
    if len(runs) > 1 and others:
        print()
        words = {"run": "from the run's own ops", "probe": "from the probes"}
        print(f"Fit on one launch, predict the next (simulated / measured; the costs and contention of launch k "
              f"predict launch k+1), with host contention {words[args.contention_from]} (what the tables above "
              f"use) and, on the same measurements, {words[other_source]}:")
        print()
        for line in next_launch_table(runs, others, bench, evals, words[args.contention_from],
                                      words[other_source]):
            print(line)
    print()
    print("Where each transposed schedule's gap goes (`compare-run --explain` on its steps: the three largest "
          "causes, ms, measured - predicted along the measured critical path):")
    for term, base in bench:
        if base is None:
            continue
        parts = []
        for run, pred in zip(runs, preds):
            gap = (run["measured"][term][run["stat"]] - pred[term]) * 1000
            causes = ", ".join(f"{c} {g:+.1f}" for c, g in explain_row(run, term, evals))
            parts.append(f"{run['label']} (gap {gap:+.1f}): {causes}")
        print(f"- `{term}`: " + "; ".join(parts))
    print()
    print("Not modelled: an LLM op on a device that idles between ops (the fused baseline's last stage waits for "
          "each encoder forward) runs slower than the same op on a busy device, and the costs are fitted there. "
          "Each device's LLM time per step in each transposed schedule minus the same ops' time in its fused "
          "baseline (median op times; baseline: the device's idle share of the step):")
    for term, base in bench:
        if base is not None:
            print(f"- `{term}`: " + "; ".join(f"{run['label']}: {cold_llm_ops(run, term, base, evals)}"
                                              for run in runs))
    print()
    print("Mis-measured: the host's contention moves between the probe and the run (other tenants, clock boost). "
          "Encoder forward beside another encoder forward in each transposed schedule over one beside nothing in "
          "its fused baseline (medians), as c, against the probe's encoder|encoder c and the one the prediction "
          "used:")

    def enc_enc(host):
        host = host or {}
        return host.get("pairs", {}).get("encoder", {}).get("encoder", host.get("contention", 0.0))

    for term, base in bench:
        if base is not None:
            cells = []
            for run in runs:
                c = encoder_slowdown(run, term, base)
                cells.append(f"{run['label']}: run {'-' if c is None else f'{c:.2f}'}, probe "
                             f"{enc_enc(run['probe_host']):.2f}, used {enc_enc(run['host']):.2f}")
            print(f"- `{term}`: " + "; ".join(cells))
    print()
    for r in runtime_rows:
        print(f"- part 1 sanity, `{r['term']}`: loss ours vs torch max relative difference "
              f"{r['loss_rel_error']:.1e} over {len(r['ours_loss'])} steps; step-0 gradients (each build) of "
              f"{r['params']} parameters max relative error {r['grad_rel_error']:.1e} "
              f"({'within' if r['grad_ok'] else 'OUTSIDE'} the executor's tolerance)")
    print(f"- part 2 sanity: the schedules' losses agree step by step within "
          f"{max(r['loss_spread'] for r in runs):.1e} (relative)")
    for term, _ in bench:
        if "shards" in term:
            sharded = sum(1 for order in evals[term].schedule.orders for op in order
                          if op.module != LLM and op.kind == "F" and op.chunk > 0)
            print(f"- `{term}` as placed on the profile's costs: {sharded} encoder ops run as extra shards")
    for run in runs:
        for kind, f in run["fits"].items():
            costs = ", ".join(f"{c.label} {c.cost_ms:.1f}" for c in f.costs if c.module == LLM)
            enc = [c.cost_ms for c in f.costs if c.module != LLM and c.kind == "F"]
            print(f"- {run['label']} fit of `{f.term}` (ms, solo, dispatch included): {costs}; encoder F "
                  f"{statistics.fmean(enc):.1f} per microbatch; dispatch {f.overhead_ms:.2f} per op; link latency "
                  f"{f.latency_ms:.2f}")
    first = runs[0]
    prof = {t: simulated_ms(evals[t].schedule, profile_fits[_kind(evals[t].schedule)].workload) / 1000
            for t, _ in bench}
    print("- the separate profiling launch's costs (the ones `mode=dynamic` placed by) predict "
          f"{first['label']}: simulated / measured mean "
          f"{statistics.mean(prof[t] / first['measured'][t]['median'] for t, _ in bench):.2f}")


if __name__ == "__main__":
    main()
