"""python -m benchmarks comm-timing

Measured communication per kind against the simulator's prediction (issue 39
section 7, Acceptance "Timing"), on this CPU, for tp2·pp2·dp2 with sequence
parallelism and ZeRO-1:

1. Calibrate first, in a run of its own: the loopback probe
   (`executor/runtime/link_probe.py`) times gloo collectives and sends between two
   processes and fits the core's alpha-beta figures (a cluster preset for this
   host), and times memory traffic and a matmul on one thread (its device).
2. Then the measured run, a different one: the built-in text model sized like the
   analytic model below, `1f1b(p=2, m=4)` on 8 gloo ranks under torchrun, AdamW,
   a few steps; its timed tp collectives (`tp_comm`: DTensor's, each waited on
   where it is issued, `executor/parallel/collective_timer.py`), reductions
   (`dp_comm`), ZeRO gathers (`dp_gather`) and optimizer steps, of its first
   pipeline, the warm-up step left out.
3. The prediction: that analytic workload on the probed cluster and device,
   compared kind by kind by `executor/analysis/comm_compare.py` (what
   `compare-run --explain` prints).  No target: the ratio is what it is.
4. What timing the tp collectives costs an op (`benchmarks/tp_timer_cost.py`).

Kinds with no rows: cp_comm (this layout has cp 1), and the pipeline's point-to-point sends, which the runtime posts without waiting (a
receive's wait includes the bubble), so they are not timed as communication;
the probe's own send fit is printed instead.
"""
from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict

TERM = "1f1b(p=2, m=4)"
LAYOUT = {"tp": 2, "sp": True, "pp": 2, "dp": 2, "distributed_optimizer": True}
STEPS = 4  # the first is the warm-up
# The executor's built-in text model and the analytic model that describes it (same widths).
HIDDEN, LAYERS, HEADS, SEQ, VOCAB = 256, 4, 4, 128, 1024


def _run(world: int):
    from executor.runtime.jobs import Job
    from executor.runtime.model import ModelConfig
    from executor.runtime.model_workload import workload_for
    from executor.runtime.runtime import OptimizerSpec
    from executor.service.launch import LaunchOptions, launch
    from mpipe_core.api import evaluate

    cfg = ModelConfig(encoder=None, d_model=HIDDEN, n_layer=LAYERS, n_head=HEADS, text_len=SEQ, vocab=VOCAB)
    job = Job.make(TERM, evaluate(TERM, workload_for(cfg)).schedule, cfg, steps=STEPS, layout=LAYOUT,
                   optimizer={**asdict(OptimizerSpec()), "name": "adamw", "lr": 1e-3})
    with tempfile.TemporaryDirectory(prefix="mpipe-comm-timing-") as run_dir:
        (result,) = launch([job], LaunchOptions(nproc=world, stall_s=180, run_dir=run_dir))
    return result


def analytic_document(cluster: dict, device: dict) -> dict:
    """The measured run's model as an analytic workload on the probed host."""
    return {"name": "executor-text-model",
            "model": {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "seq_len": SEQ, "vocab": VOCAB,
                      "ffn": 4 * HIDDEN, "microbatch_size": 1},
            "device": device, "cluster": cluster,
            "parallel": {"tp": LAYOUT["tp"], "sp": LAYOUT["sp"], "dp": LAYOUT["dp"], "distributed_optimizer": True}}


def _timer_cost() -> str:
    """What timing the tp collectives costs an op (`benchmarks/tp_timer_cost.py`, a process of its own)."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "benchmarks.tp_timer_cost"], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        return f"cost of timing tp collectives: not measured ({(done.stderr.strip().splitlines() or ['?'])[-1]})\n"
    return done.stdout


def main(argv: list[str]) -> None:
    from executor.analysis.comm_compare import compare_comm
    from executor.runtime.link_probe import (cluster_document, device_document, fit_links, measure_device,
                                             measure_links)
    from mpipe_core.api import evaluate

    t0 = time.perf_counter()
    fit = fit_links(measure_links())
    tbps, tflops = measure_device()
    cluster, device = cluster_document(fit), device_document(tbps, tflops, fit)
    print(f"loopback probe (its own run, 2 gloo processes): collective base {fit.collective_latency_us:.1f} us, "
          f"latency {fit.latency_us:.1f} us a step, {fit.gbps:.3g} GB/s; rms relative error of the fit "
          f"{fit.rms_relative_error:.0%} over {len(fit.samples)} samples ({time.perf_counter() - t0:.0f} s)")
    print(f"  device (one thread): memory {tbps * 1e3:.3g} GB/s (in-place add), matmul {tflops * 1e3:.3g} GFLOP/s")
    print("  probe samples (median us, measured / fitted):")
    for kind, nbytes, seconds in fit.samples:
        print(f"    {kind:<15} {nbytes:>9,} B  {seconds * 1e6:>9.1f}  {fit.predicted(kind, nbytes) * 1e6:>9.1f}")

    t1 = time.perf_counter()
    world = LAYOUT["tp"] * LAYOUT["pp"] * LAYOUT["dp"]
    result = _run(world)
    used = list(range(1, STEPS))
    prediction = evaluate(TERM, analytic_document(cluster, device))
    kinds = compare_comm(result.comm, used, prediction)
    print(f"\nmeasured run: {TERM}, tp2·pp2·dp2 with sp, ZeRO-1, AdamW, text model hidden {HIDDEN} x {LAYERS} layers, seq {SEQ}; "
          f"{world} gloo ranks under torchrun, steps {used[0]}-{used[-1]} after a warm-up "
          f"({time.perf_counter() - t1:.0f} s)")
    print("per step, the first pipeline's stages summed (prediction: its devices summed), ms:")
    print(f"{'kind':<22} {'group':<10} {'measured':>10} {'count':>6} {'predicted':>10} {'count':>6} "
          f"{'measured / predicted':>21}")
    for k in kinds:
        predicted = "-" if k.predicted_ms is None else f"{k.predicted_ms:.3f}"
        p_count = "-" if k.predicted_count is None else f"{k.predicted_count:g}"
        ratio = "-" if k.ratio is None else f"{k.ratio:.2f}"
        print(f"{k.kind:<22} {k.group:<10} {k.measured_ms:>10.3f} {k.measured_count:>6g} {predicted:>10} "
              f"{p_count:>6} {ratio:>21}")
    for kind, why in (("cp_comm", "no row: this layout has cp 1"),):
        if kind not in {k.kind for k in kinds}:
            print(f"{kind:<22} {why}")
    print("by collective (ms per step; predicted buffer per collective):")
    # (tp_comm rows do not say which collective they timed: its line is all of tp's, the
    # prediction's collectives named beside it.)
    tp_kinds = sorted({c.collective for c in prediction.comm if c.group == "tp"})
    for kind, group, collective in (("tp_comm", "tp", None), ("dp_comm", "dp", "reduce-scatter"),
                                    ("dp_gather", "dp", "all-gather"), ("pp p2p", "pp", "send")):
        rows = [r for r in result.comm if r.kind == kind and r.step in used]
        slices = [c for c in prediction.comm if c.group == group and collective in (None, c.collective)]
        collective = collective or " + ".join(tp_kinds) or "none priced"
        measured = (f"{sum(r.end - r.start for r in rows) * 1e3 / len(used):>10.3f} {len(rows) / len(used):>6g}"
                    if rows else f"{'-':>10} {'-':>6}")
        p_ms = sum(c.seconds for c in slices) * 1e3
        p_count = sum(c.count for c in slices)
        size = max((c.buffer_bytes for c in slices), default=0) / 2 ** 20
        ratio = f"{sum(r.end - r.start for r in rows) * 1e3 / len(used) / p_ms:.2f}" if rows and p_ms else "-"
        print(f"{kind + ' (' + collective + ')':<33} {measured} {p_ms:>10.3f} {p_count:>6g} {ratio:>8}  "
              f"{size:.2f} MiB")
    print("  pp p2p is not timed in the run: its sends are posted without a wait and a receive's wait "
          "includes the bubble")
    print()
    print(_timer_cost(), end="")
    print("notes: the measured dp rows run from a bucket's launch to its completion, beside the rest of the "
          "backward, and each bucket also reduces a small flags tensor; the prediction's ZeRO gather moves "
          "16-bit parameters (Megatron's) where this fp32 run gathers 4-byte ones; the optimizer is priced as "
          "memory traffic (46 B a parameter) at the probed memory rate.")


if __name__ == "__main__":
    main(sys.argv[1:])
