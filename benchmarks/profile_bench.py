"""Profile benchmark (issue 13): how well a `mpipe profile` workload predicts a
real `mpipe run` of the same model.  One command, one table:

    python -m benchmarks profile [--model hf:llava] [--model-config small] [--m 8]
                                 [--steps 4] [--repeats 10]

1. profiles the model in this process, one torch thread (as a torchrun rank
   runs), exactly as `mpipe profile` does (`executor.runtime.models.profile`);
2. evaluates each schedule on that workload (the prediction, in seconds);
3. runs every schedule in ONE torchrun launch, P=2 on gloo, `steps` steps
   each (step 0 is a warm-up), and takes the median step makespan;
4. prints predicted vs measured per schedule, and the median and worst
   absolute error.  Target: median within 15%.

The profile times compute only: transfers (the link is left free), the
runtime's per-op dispatch and the optimizer step are not in the workload, so
the prediction is expected low by about their share.  CPU timings here move
with the machine's background load, printed beside the table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

TERMS = ["1f1b(p=2, m={m})", "interleaved(p=2, m={m}, v=2)", "zbv(p=2, m={m})",
         "transpose(1f1b(p=2, m={m}), mode=prefix)", "transpose(zbv(p=2, m={m}), mode=dynamic)"]
TARGET = 0.15


def log(msg: str) -> None:
    sys.stderr.write(f"[profile-bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks profile")
    ap.add_argument("--model", default="hf:llava")
    ap.add_argument("--model-config", default="small")
    ap.add_argument("--microbatch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--images", type=int, default=1)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)

    import json
    import subprocess
    import tempfile
    from pathlib import Path

    from executor.runtime.jobs import Job
    from executor.service.launch import LaunchOptions, launch
    from mpipe_core.api import evaluate
    from mpipe_core.runs.model_spec import BatchShape, ModelSpec
    from mpipe_core.workloads.workload import load_workload

    from .executor_bench import LoadMonitor

    monitor = LoadMonitor()
    monitor.start()
    spec = ModelSpec(args.model, args.model_config, BatchShape(
        microbatch_size=args.microbatch_size, images=args.images, text_len=args.seq_len))
    t0 = time.monotonic()
    log(f"profiling {spec}: two `mpipe profile` processes at once")
    with tempfile.TemporaryDirectory() as tmp:
        outs = [str(Path(tmp) / f"profile{i}.json") for i in range(2)]
        procs = [subprocess.Popen(spec.profile_argv(out) + ["--repeats", str(args.repeats)],
                                  stderr=subprocess.DEVNULL) for out in outs]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("error: mpipe profile failed")
        docs = [json.loads(Path(out).read_text()) for out in outs]
    doc = docs[0]
    t1 = time.monotonic()
    workload = load_workload(doc)
    terms = [t.format(m=args.m) for t in TERMS]
    evals = [evaluate(t, workload) for t in terms]
    jobs = [Job.make(ev.term, ev.schedule, spec, steps=args.steps) for ev in evals]
    log(f"running {len(jobs)} schedules x {args.steps} steps in one torchrun launch (P=2, gloo)")
    results = launch(jobs, LaunchOptions(nproc=2, stall_s=300))
    t2 = time.monotonic()
    monitor.stop()

    rows, errors = [], []
    for ev, r in zip(evals, results):
        measured = statistics.median(r.makespan[1:] or r.makespan)
        predicted = ev.summary()["makespan"]
        err = (predicted - measured) / measured
        errors.append(abs(err))
        rows.append((ev.term, predicted * 1e3, measured * 1e3, err * 100))
    llm = doc["llm"]
    print(f"Profile -> prediction of a real run: {spec}, P=2 gloo, m={args.m}, "
          f"median of steps 1-{args.steps - 1}")
    print(f"  profile: {llm['layers']} layers, per layer F {llm['f'] * 1e3:.2f} B {llm['b'] * 1e3:.2f} "
          f"W {llm['w'] * 1e3:.2f} ms" + "".join(f"; encoder F {e['f'] * 1e3:.2f} ms/image"
                                                  for e in doc["encoders"])
          + f" (the concurrent second profile: layer F {docs[1]['llm']['f'] * 1e3:.2f} ms)")
    width = max(len(r[0]) for r in rows)
    print(f"  {'schedule':<{width}}  {'predicted ms':>12}  {'measured ms':>11}  {'error':>7}")
    for term, p, m, e in rows:
        print(f"  {term:<{width}}  {p:>12.1f}  {m:>11.1f}  {e:>+6.1f}%")
    median, worst = statistics.median(errors), max(errors)
    verdict = "met" if median <= TARGET else "NOT met"
    print(f"  median |error| {median * 100:.1f}%, worst {worst * 100:.1f}% "
          f"(target: median within {TARGET * 100:.0f}%: {verdict})")
    print(f"  background load (other processes, cores): profile {monitor.mean_since(t0, t1):.2f}, "
          f"run {monitor.mean_since(t1, t2):.2f} of {monitor.cpus}")


if __name__ == "__main__":
    main(sys.argv[1:])
