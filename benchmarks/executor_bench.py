"""Executor benchmark: measured step times on CPU/gloo, and the simulator's
prediction from costs measured in a profiling run.

    python -m benchmarks.executor_bench [--p 2] [--m 8] [--steps 4]

One torchrun launch runs every schedule (same model, same data):

1. transpose vs the fused baseline on an encoder-heavy model (`vit-heavy`:
   a frozen 6-layer ViT whose work per microbatch costs several LLM stages);
2. the simulator's predicted makespan vs the measured one: per-chunk F/B/W and
   per-image encoder costs are measured from the baseline's run (medians over
   the steps after the first) and written into a calibrated workload, then
   every schedule is simulated on it.

Not done here: issue 5's comparison with torch's own `_PipelineScheduleRuntime`
executing our exported CSV (it needs our chunks wrapped as torch
`PipelineStage`s).
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from mpipe_core.api import evaluate

from executor.jobs import Job
from executor.launch import LaunchOptions, launch
from executor.model import MODEL_PRESETS
from executor.workload import workload_for


def calibrate(result: dict, cfg, base_doc: dict) -> dict:
    """A workload whose costs are the run's measured medians (seconds)."""
    chunks = result["chunks"]
    per = defaultdict(list)
    enc = []
    counts = cfg.image_counts(result["microbatches"])
    for row in result["timeline"]:
        if row["step"] == 0:  # warm-up
            continue
        dur = row["end"] - row["start"]
        if row["module"] == "llm":
            per[(row["kind"], row["chunk"])].append(dur)
        elif row["kind"] == "F":
            enc.append(dur / max(1, counts[row["microbatch"]]))

    def med(kind, c):
        return statistics.median(per[(kind, c)]) if per[(kind, c)] else 0.0

    table = {"F": [med("F", c) for c in range(chunks)]}
    if any(per[("BW", c)] for c in range(chunks)):
        table["B"] = [med("BW", c) / 2 for c in range(chunks)]
        table["W"] = [med("BW", c) / 2 for c in range(chunks)]
    else:
        table["B"] = [med("B", c) for c in range(chunks)]
        table["W"] = [med("W", c) for c in range(chunks)]
    doc = dict(base_doc, name="calibrated")
    doc["llm"] = dict(base_doc["llm"], chunk_costs=table)
    doc.pop("link", None)
    if doc["encoders"] and enc:
        f = statistics.median(enc)
        doc["encoders"] = [dict(doc["encoders"][0], f=f, b=f, w=f)]
    return doc


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.executor_bench")
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--model", default="vit-heavy")
    args = ap.parse_args(argv)
    cfg = MODEL_PRESETS[args.model]
    wl = workload_for(cfg)
    p, m = args.p, args.m
    terms = [f"1f1b(p={p}, m={m})",
             f"transpose(1f1b(p={p}, m={m}), mode=prefix)",
             f"transpose(1f1b(p={p}, m={m}), mode=dynamic)",
             f"zb_h1(p={p}, m={m})",
             f"transpose(zb_h1(p={p}, m={m}), mode=dynamic)"]
    jobs = [Job.make(t, evaluate(t, wl).schedule, cfg, steps=args.steps) for t in terms]
    results = launch(jobs, LaunchOptions(nproc=p, timeout_s=120))
    measured = {r["name"]: statistics.median(r["makespan"][1:] or r["makespan"]) for r in results}
    calibrated = calibrate(results[0], cfg, wl)
    base = measured[terms[0]]
    print(f"model {args.model} (frozen encoder: {not cfg.trainable_encoder}), gloo on CPU, "
          f"P={p}, M={m}, median of steps 1..{args.steps - 1}")
    print(f"{'schedule':48s} {'measured ms':>12s} {'speedup':>8s} {'predicted ms':>13s} {'pred/meas':>9s}")
    for t in terms:
        pred = evaluate(t, calibrated).summary()["makespan"]
        print(f"{t:48s} {measured[t] * 1000:12.1f} {base / measured[t]:8.2f} {pred * 1000:13.1f} "
              f"{pred / measured[t]:9.2f}")


if __name__ == "__main__":
    main()
