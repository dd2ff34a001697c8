"""Memory benchmark (issue 21): a profiled workload's predicted memory against
what a real run measures.  One command, one table:

    python -m benchmarks memory [--models tiny,hf:llava] [--m 4] [--steps 2] [--repeats 3]

For each model (the built-in `tiny` MLLM and the HF LLaVA adapter by default):

1. profiles it in this process, as `mpipe profile` does
   (`executor.runtime.models.profile`): a workload whose memory is in bytes,
   measured the way a rank counts it;
2. evaluates each schedule on that workload: the simulator's peak activation
   memory and static memory per device (the prediction);
3. runs every schedule in ONE torchrun launch, P=2 on gloo, with the gradient
   check: each rank measures the peak of what autograd keeps saved for
   backward, and the bytes of its parameters, gradients and optimizer state
   (`executor.runtime.memory_meter`);
4. prints predicted against measured per rank, activation and static, as
   ratios.  Target: every rank's peak activation within 10%
   (`executor.analysis.memory_check.TOLERANCE`).

Memory does not depend on the machine's load: every figure is exact bytes of
tensors, and the schedule fixes each rank's op order.  (The schedules are
chosen so that their placement does not depend on the profiled times either:
`transpose(..., mode=dynamic)` places encoder ops by time, so which ops a rank
runs could change from one profile to the next.)
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Callable

TERMS = ["1f1b(p=2, m={m})", "zbv(p=2, m={m})", "transpose(1f1b(p=2, m={m}), mode=prefix)",
         "transpose(zbv(p=2, m={m}), backward=owner)", "recompute(1f1b(p=2, m={m}), mode=full)",
         "recompute(zbv(p=2, m={m}), layers=[1, 0, 1, 0])", "recompute(1f1b(p=2, m={m}), mode=selective)"]
MODELS = ("tiny", "hf:llava")


def log(msg: str) -> None:
    sys.stderr.write(f"[memory-bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


@dataclass
class Row:
    model: str
    term: str
    rank: int
    predicted: float  # peak activation, bytes
    measured: int
    predicted_static: float
    measured_static: int
    peak_op: str
    grads_ok: bool

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured

    @property
    def static_ratio(self) -> float:
        return self.predicted_static / self.measured_static


def profiled_workload(model: str, *, warmup: int = 1, repeats: int = 3) -> dict:
    """The model profiled in this process, one torch thread (what `mpipe profile` writes)."""
    import torch

    from executor.runtime.models.loader import load_model
    from executor.runtime.models.profile import profile_model
    from mpipe_core.runs.model_spec import ModelSpec

    torch.set_num_threads(1)
    spec = ModelSpec(model)
    return profile_model(load_model(spec), spec, warmup=warmup, repeats=repeats)


def rows_for(model: str, workload: dict, terms: list[str], run: Callable[[list], list], steps: int = 2
             ) -> list[Row]:
    """Predicted vs measured memory per rank of every term, run by `run(jobs)`."""
    from executor.analysis.memory_check import compare_memory
    from executor.runtime.jobs import Job
    from mpipe_core.api import evaluate
    from mpipe_core.runs.model_spec import ModelSpec
    from mpipe_core.workloads.workload import load_workload

    wl = load_workload(workload)
    spec = ModelSpec(model)
    evals = [evaluate(t, wl) for t in terms]
    jobs = [Job.make(ev.term, ev.schedule, spec, steps=steps, check_grads=True) for ev in evals]
    rows = []
    for ev, result in zip(evals, run(jobs)):
        cmp = compare_memory(ev.metrics, wl.memory_unit, result.memory, wl.name)
        for d in cmp.devices:
            rows.append(Row(model, ev.term, d.device, cmp.predicted_bytes(d.predicted_activation),
                            d.measured_activation, cmp.predicted_bytes(d.predicted_static), d.measured_static,
                            d.peak_op, bool(result.grad_check["ok"])))
    return rows


def print_table(rows: list[Row], tolerance: float) -> bool:
    model_w = max(len("model"), *(len(r.model) for r in rows))
    term_w = max(len("schedule"), *(len(r.term) for r in rows))
    print(f"  {'model':<{model_w}}  {'schedule':<{term_w}}  rank  {'predicted':>9}  {'measured':>9}  "
          f"{'ratio':>6}  {'static pred.':>12}  {'static meas.':>12}  {'ratio':>6}  peak in     grads")
    for r in rows:
        print(f"  {r.model:<{model_w}}  {r.term:<{term_w}}  {r.rank:>4}  {r.predicted:>9,.0f}  {r.measured:>9,}  "
              f"{r.ratio:>6.3f}  {r.predicted_static:>12,.0f}  {r.measured_static:>12,}  {r.static_ratio:>6.3f}  "
              f"{r.peak_op:<10}  {'ok' if r.grads_ok else 'FAIL'}")
    worst = max(rows, key=lambda r: abs(r.ratio - 1))
    met = all(abs(r.ratio - 1) <= tolerance for r in rows)
    print(f"  worst activation ratio {worst.ratio:.3f} ({worst.model}, {worst.term}, rank {worst.rank}); "
          f"target: every row within {tolerance:.0%}: {'met' if met else 'NOT met'}")
    statics = [abs(r.static_ratio - 1) for r in rows]
    print(f"  static memory: worst |ratio - 1| {max(statics):.3f}; gradient check "
          f"{'passed on every run' if all(r.grads_ok for r in rows) else 'FAILED on some run'}")
    return met


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks memory")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default tiny,hf:llava)")
    ap.add_argument("--m", type=int, default=4, help="microbatches")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="profile repeats (times only; memory is exact)")
    args = ap.parse_args(argv)

    from executor.analysis.memory_check import TOLERANCE
    from executor.service.launch import LaunchOptions, launch

    terms = [t.format(m=args.m) for t in TERMS]
    rows: list[Row] = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        log(f"profiling {model}")
        doc = profiled_workload(model, repeats=args.repeats)
        log(f"running {len(terms)} schedules x {args.steps} steps of {model} in one torchrun launch (P=2, gloo)")
        rows += rows_for(model, doc, terms, lambda jobs: launch(jobs, LaunchOptions(nproc=2, stall_s=300)),
                         steps=args.steps)
    print(f"Memory: predicted by the profiled workload vs measured, per rank (bytes), P=2 gloo, m={args.m}, "
          f"{args.steps} steps; activation = peak of what autograd keeps saved for backward; static = "
          "parameters + gradients + optimizer state (SGD)")
    print_table(rows, TOLERANCE)


if __name__ == "__main__":
    main(sys.argv[1:])
