"""Gantt figure build time in the app: timeline -> column arrays -> Plotly figure -> JSON.

    .venv/bin/python -m benchmarks.app_bench

Target: a 20k-op schedule's figure ready in under 1 s (drawn op by op); bigger
ones are aggregated into time bins.  Evaluation by the core is shown for scale
but is not part of the figure time.
"""
from __future__ import annotations

import statistics
import sys
import time

from mpipe_core.api import evaluate

# A trainable encoder, so transposed schedules carry F/B/W, recompute, broadcast and all-reduce ops.
WORKLOAD = {
    "llm": {"layers": None, "f": 1.0, "b": 1.0, "w": 1.0},
    "encoders": [{"name": "vision", "f": 3.0, "b": 3.0, "w": 3.0, "trainable": True, "activation": 1.0,
                  "param_bytes": 2.0, "images": {"min": 1, "max": 4, "seed": 0}}],
    "link": {"latency": 0.01},
}
CASES = [
    "transpose(1f1b(p=4, m=16))",
    "transpose(zb_h1(p=8, m=128))",
    "transpose(zb_h1(p=16, m=400))",  # ~20.8k ops
    "interleaved(p=16, m=160, v=4)",  # ~20.5k ops
    "zb_h1(p=64, m=1024)",  # ~200k ops: aggregated
]
REPEATS = 3


def _median_time(fn) -> tuple[float, object]:
    times, result = [], None
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def run(progress=print) -> list[dict]:
    from app.bars import from_timeline
    from app.figures import gantt_figure

    rows = []
    for term in CASES:
        progress(f"  {term} ...")
        t0 = time.perf_counter()
        ev = evaluate(term, WORKLOAD)
        eval_s = time.perf_counter() - t0
        bars_s, bars = _median_time(lambda: from_timeline(ev.timeline))
        fig_s, (fig, notice) = _median_time(lambda: gantt_figure(bars))
        json_s, text = _median_time(fig.to_json)
        rows.append({"term": term, "ops": len(bars), "evaluate_s": eval_s, "bars_s": bars_s, "figure_s": fig_s,
                     "json_s": json_s, "total_s": bars_s + fig_s + json_s, "json_mb": len(text) / 1e6,
                     "traces": len(fig.data), "aggregated": notice is not None})
    return rows


def main(argv: list[str] | None = None) -> None:
    print("App Gantt figure build (median of 3; seconds; total = bars + figure + JSON)")
    rows = run(progress=lambda msg: print(msg, file=sys.stderr))
    header = f"{'term':34} {'ops':>8} {'evaluate':>9} {'bars':>7} {'figure':>7} {'json':>7} {'total':>7} " \
             f"{'JSON MB':>8} {'traces':>6}  drawn as"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['term']:34} {r['ops']:>8,} {r['evaluate_s']:>9.3f} {r['bars_s']:>7.3f} {r['figure_s']:>7.3f} "
              f"{r['json_s']:>7.3f} {r['total_s']:>7.3f} {r['json_mb']:>8.2f} {r['traces']:>6}  "
              f"{'time bins' if r['aggregated'] else 'one bar per op'}")
    worst = max((r for r in rows if 20_000 <= r["ops"] <= 25_000), key=lambda r: r["total_s"], default=None)
    if worst:
        verdict = "meets" if worst["total_s"] < 1.0 else "MISSES"
        print(f"\n20k-op figure: {worst['total_s']:.3f} s ({verdict} the < 1 s target)")


if __name__ == "__main__":
    main(sys.argv[1:])
