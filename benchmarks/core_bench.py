"""Evaluate+simulate time of our schedules vs PyTorch constructing the same class."""
from __future__ import annotations

import gc
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


def main(argv: list[str]) -> None:
    with_torch = "--no-torch" not in argv
    print("core: evaluate + simulate vs torch constructing the same schedule class", flush=True)
    rows = run(with_torch, progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(f"{'term':<34} {'ops':>9} {'ours s':>8} {'ops/s':>10} {'torch s':>8} {'torch/ours':>10}")
    for r in rows:
        torch_s = f"{r['torch_s']:.2f}" if r["torch_s"] is not None else "-"
        ratio = f"{r['ratio']:.1f}x" if r["ratio"] is not None else "-"
        print(f"{r['term']:<34} {r['ops']:>9} {r['ours_s']:>8.3f} {r['ops_per_s']:>10,.0f} {torch_s:>8} {ratio:>10}")
    print("\nmemory (tracemalloc peak during evaluate+simulate)")
    for term, ops, per_op in memory_per_op(progress=lambda s: print(s, file=sys.stderr, flush=True)):
        print(f"{term:<34} {ops:>9} {per_op:>8.0f} bytes/op")
