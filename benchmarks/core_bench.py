"""Evaluate+simulate time of our schedules vs PyTorch constructing the same class,
and the whole-process figures a user sees (`mpipe eval --json`, `mpipe tune`)."""
from __future__ import annotations

import gc
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc

from mpipe_core.api import evaluate

CASES = [(8, 32), (32, 256), (64, 512)]
TERMS = {"1f1b": "1f1b(p={p}, m={m})", "interleaved": "interleaved(p={p}, m={m}, v=2)", "zbv": "zbv(p={p}, m={m})"}
HUGE = "zbv(p=128, m=2048)"  # ~1.57M ops


def _time(fn) -> tuple[float, object]:
    """(seconds, result) of one call, after a full collection."""
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def run(with_torch: bool = True, progress=print) -> list[dict]:
    rows = []
    for p, m in CASES:
        for name, template in TERMS.items():
            term = template.format(p=p, m=m)
            progress(f"  {term} ...")
            ours, ev = _time(lambda: evaluate(term))
            ops = ev.schedule.num_ops
            del ev
            theirs = None
            if with_torch:
                from .torch_construction import construct

                theirs, _ = _time(lambda: construct(name, p, m))
            rows.append({"term": term, "ops": ops, "ours_s": ours, "ops_per_s": ops / ours,
                         "torch_s": theirs, "ratio": (theirs / ours) if theirs else None})
    progress(f"  {HUGE} ...")
    huge, ev = _time(lambda: evaluate(HUGE))
    ops = ev.schedule.num_ops
    del ev
    rows.append({"term": HUGE, "ops": ops, "ours_s": huge, "ops_per_s": ops / huge, "torch_s": None, "ratio": None})
    return rows


def memory_per_op(progress=print) -> list[tuple[str, int, float]]:
    out = []
    for term in ("zbv(p=16, m=128)", "zbv(p=32, m=512)"):
        progress(f"  memory of {term} ...")
        gc.collect()
        tracemalloc.start()
        ev = evaluate(term)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out.append((term, ev.schedule.num_ops, peak / ev.schedule.num_ops))
        del ev
    return out


ENGINE_TERM, ENGINE_CASE = "zbv(p=64, m=512)", ("zbv", 64, 512)
# The search as it was before tune capped memory by default (the same candidates), and the
# question tune answers now: which schedule fits InternVL-26B on 8 x 64 GB with tp=8, sp.
TUNE_ARGS = ["tune", "-w", "internvl-26b", "-p", "16", "-m", "64", "--memory-cap", "none", "--json"]
FIT_ARGS = ["tune", "-w", "internvl-26b", "--parallel", "tp=8,sp", "-p", "64", "-m", "16", "--json"]  # 8 stages x tp 8


def _process(argv: list[str]) -> float:
    """Wall seconds of one whole `mpipe ...` process (start-up, imports, output),
    with Python's bytecode cache on as in any installed copy (this machine's
    shell sets PYTHONDONTWRITEBYTECODE, which recompiles every module each run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    before = _children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mpipe_cli.main", *argv], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"mpipe {' '.join(argv)} failed: {done.stderr.strip()}")
    return seconds, _children_cpu() - before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _torch_once() -> tuple[float, float]:
    from .torch_construction import construct

    gc.collect()
    cpu, t0 = time.process_time(), time.perf_counter()
    construct(*ENGINE_CASE)
    return time.perf_counter() - t0, time.process_time() - cpu


def whole_process(with_torch: bool, progress=print) -> list[tuple]:
    """(what, our (wall, cpu) seconds, torch's or None, target) rows; ours and
    torch's construction alternate so both see the same load."""
    ours, theirs = [], []
    _process(["eval", "1f1b(p=2, m=2)"])  # warm-up: writes the bytecode cache
    for i in range(3):
        progress(f"  mpipe eval {ENGINE_TERM} --json, run {i + 1} ...")
        ours.append(_process(["eval", ENGINE_TERM, "--json"]))
        if with_torch and i < 2:
            progress(f"  torch ScheduleZBVZeroBubble P64 M512, run {i + 1} ...")
            theirs.append(_torch_once())
    median = lambda runs: tuple(statistics.median(r[k] for r in runs) for k in (0, 1))  # noqa: E731
    rows = [(f"mpipe eval \"{ENGINE_TERM}\" --json", median(ours), median(theirs) if theirs else None, ">= 50x")]
    progress(f"  mpipe eval {HUGE} --json ...")
    rows.append((f"mpipe eval \"{HUGE}\" --json", _process(["eval", HUGE, "--json"]), None, "< 10 s"))
    progress("  mpipe tune -w internvl-26b -p 16 -m 64 --memory-cap none ...")
    rows.append(("mpipe tune -w internvl-26b -p 16 -m 64 --memory-cap none", _process(TUNE_ARGS), None, "< 60 s"))
    progress("  mpipe tune -w internvl-26b --parallel tp=8,sp -p 64 -m 16 ...")
    rows.append(("mpipe tune -w internvl-26b --parallel tp=8,sp -p 64 -m 16", _process(FIT_ARGS), None, "< 60 s"))
    return rows


def main(argv: list[str]) -> None:
    with_torch = "--no-torch" not in argv
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"core: whole processes (median of 3 ours / 2 torch, alternating); wall and CPU seconds; "
          f"load average {load} on {os.cpu_count()} cores", flush=True)
    print(f"{'command':<56} {'ours wall':>9} {'ours cpu':>8} {'torch wall':>10} {'torch cpu':>9} "
          f"{'ratio wall':>10} {'ratio cpu':>9} {'target':>8}")
    for what, ours, theirs, target in whole_process(with_torch, say):
        if theirs:
            cells = f"{theirs[0]:>10.2f} {theirs[1]:>9.2f} {theirs[0] / ours[0]:>9.1f}x {theirs[1] / ours[1]:>8.1f}x"
        else:
            cells = f"{'-':>10} {'-':>9} {'-':>10} {'-':>9}"
        print(f"{what:<56} {ours[0]:>9.2f} {ours[1]:>8.2f} {cells} {target:>8}", flush=True)
    if "--engine-only" in argv:
        return
    print()
    print("core: evaluate + simulate vs torch constructing the same schedule class", flush=True)
    rows = run(with_torch, progress=say)
    print(f"{'term':<34} {'ops':>9} {'ours s':>8} {'ops/s':>10} {'torch s':>8} {'torch/ours':>10}")
    for r in rows:
        torch_s = f"{r['torch_s']:.2f}" if r["torch_s"] is not None else "-"
        ratio = f"{r['ratio']:.1f}x" if r["ratio"] is not None else "-"
        print(f"{r['term']:<34} {r['ops']:>9} {r['ours_s']:>8.3f} {r['ops_per_s']:>10,.0f} {torch_s:>8} {ratio:>10}")
    print("\nmemory (tracemalloc peak during evaluate+simulate)")
    for term, ops, per_op in memory_per_op(progress=say):
        print(f"{term:<34} {ops:>9} {per_op:>8.0f} bytes/op")
