"""Our runtime vs PyTorch's own `_PipelineScheduleRuntime` on the same schedule.

    python -m benchmarks.torch_runtime_bench [--p 2] [--m 8] [--builds 3] [--steps 6]

For each LLM-only term (default `1f1b` and `interleaved`), in one torchrun launch
(gloo, CPU, one thread per rank) every rank builds, on the same process group:

* ours: `executor.runtime.runtime.RankRuntime` executing the evaluated schedule, as
  `mpipe run` does (status board updated at every op);
* torch's: `PipelineStage`s wrapping the same chunks (`executor.runtime.partition`,
  same layers, same initial values, one stage module per chunk) and a
  `_PipelineScheduleRuntime` whose `_load_csv` reads our export
  `mpipe_core.formats.torch_csv.to_torch_csv(schedule)` (torch lowers it to
  sends/receives itself).

Same model, same microbatches (`executor.runtime.model.make_microbatch`), same loss
(summed token loss / the step's token count, `scale_grads=False`), an SGD step
after each step on each runtime's own copy of the model.  Steps alternate
(ours, torch; then torch, ours) so background load hits both alike.  A step is
timed on every rank from the release of a barrier to the return of the step
call (ours: `run_step`, including making its microbatches; torch: `step()` on
the whole batch; both wait for their own sends); the step time is the latest
rank's end minus the earliest rank's start, on clocks aligned by ping-pong.

Both runtimes are built afresh `builds` times (new model copies): on these
CPUs the ratio moves from one build to the next even on an idle machine
(0.95-1.09 over four builds in one launch, either way round; new allocations
are the likely cause), so one build alone can put it anywhere in about
0.9-1.1.  Each build's step 0 (torch's shape
inference, first-touch allocations) is left out; the figure is the median
over the other steps of all builds.  Process CPU time per step is recorded
too (less sensitive to other processes than wall time).

Sanity: the losses of both runtimes agree step by step, and after step 0 every
gradient torch computed is compared with ours (the executor's tolerance rule,
`executor.runtime.reference.compare_tensors`).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from executor.runtime.model import LanguageModel, ModelConfig, make_microbatch, tokens_per_step

ROOT = Path(__file__).resolve().parent.parent

# A text-only decoder big enough that a chunk's op is compute, not Python (a few ms).
TEXT_MODEL = ModelConfig(encoder=None, vocab=256, d_model=128, n_layer=8, n_head=4, text_len=128,
                         batch=2)
PROGRESS = "mpipe-progress:"
TERMS = ("1f1b(p={p}, m={m})", "interleaved(p={p}, m={m}, v=2)")


def describe(cfg: ModelConfig) -> str:
    return (f"text-only LLM: {cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, "
            f"vocab {cfg.vocab}, {cfg.batch}x{cfg.seq_len} tokens per microbatch")


# --------------------------------------------------------------------------- torch side

class StageModule(nn.Module):
    """One chunk as a torch pipeline stage: tokens -> hidden (first), hidden -> hidden,
    hidden -> logits (last; torch applies the loss outside the module)."""

    def __init__(self, cfg: ModelConfig, chunk):
        super().__init__()
        self.chunk = chunk
        self.lm = LanguageModel(cfg, layers=chunk.layers, embed=chunk.first, head=chunk.last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.chunk.first:
            x = self.lm.tok_emb(x) + self.lm.pos  # LanguageModel.embed without images
        x = self.lm.run_layers(x, self.chunk.layers)
        if self.chunk.last:
            x = self.lm.head(self.lm.ln_f(x))
        return x


def _torch_schedule(cfg: ModelConfig, schedule, rank: int, csv_path: Path):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from executor.runtime.partition import make_chunks

    pipe = schedule.pipelines[0]
    chunks = make_chunks(cfg, pipe.chunks)
    mine = sorted({op.chunk for op in schedule.orders[rank]})
    modules = [StageModule(cfg, chunks[c]) for c in mine]
    stages = [PipelineStage(mod, c, pipe.chunks, torch.device("cpu")) for mod, c in zip(modules, mine)]
    normalizer = tokens_per_step(cfg, pipe.microbatches)

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-1, reduction="sum") / normalizer

    sched = _PipelineScheduleRuntime(stages, pipe.microbatches, loss_fn=loss_fn, scale_grads=False)
    sched._load_csv(str(csv_path))
    named = [(n, p) for mod in modules for n, p in mod.chunk.parameters(mod.lm)]
    return sched, named


def _whole_batch(cfg: ModelConfig, step: int, microbatches: int):
    mbs = [make_microbatch(cfg, step, m, microbatches) for m in range(microbatches)]
    return torch.cat([mb.tokens for mb in mbs]), torch.cat([mb.targets for mb in mbs])


# --------------------------------------------------------------------------- worker (one rank)

def worker(spec_path: str, out_path: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from executor.runtime.model_workload import workload_for
    from executor.runtime.models.builtin import BuiltinModel
    from executor.runtime.plan import build_plan
    from executor.runtime.rank import StatusBoard
    from executor.runtime.reference import compare_tensors
    from executor.runtime.runtime import CpuClock, OptimizerSpec, RankRuntime
    from executor.runtime.transport import DistTransport
    from mpipe_core.api import evaluate
    from mpipe_core.formats.torch_csv import to_torch_csv

    spec = json.loads(Path(spec_path).read_text())
    cfg = ModelConfig.from_dict(spec["model"])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    transport = DistTransport(120.0)
    offset = transport.measure_offset()
    run_dir = Path(spec["run_dir"])
    board = StatusBoard(run_dir / f"status.{rank}")
    opt = OptimizerSpec()
    out = []
    for index, term in enumerate(spec["terms"]):
        schedule = evaluate(term, workload_for(cfg)).schedule
        csv_text, _ = to_torch_csv(schedule)
        csv_path = run_dir / f"{index}.csv"
        if rank == 0:
            csv_path.write_text(csv_text)
        transport.barrier()
        m = schedule.pipelines[0].microbatches
        times = {"ours": [], "torch": []}
        cpu = {"ours": [], "torch": []}  # process CPU seconds (compute + gloo threads)
        losses = {"ours": [], "torch": []}
        measured: list[bool] = []  # False for each build's warm-up step
        grad_rel, grad_ok = 0.0, True
        for _build in range(spec["builds"]):
            # Fresh models for both runtimes each build: the ratio moves by a few
            # percent from build to build, either way round; builds average it out.
            ours = RankRuntime(BuiltinModel(cfg), build_plan(schedule), rank, transport, device=torch.device("cpu"),
                               clock=CpuClock(), optimizer=opt, timeout_s=120.0, on_progress=board.update)
            sched, named = _torch_schedule(cfg, schedule, rank, csv_path)
            torch_opt = opt.build([p for _, p in named])
            for step in range(spec["steps"]):
                tokens, targets = _whole_batch(cfg, step, m)
                order = ("ours", "torch") if step % 2 == 0 else ("torch", "ours")
                for which in order:
                    transport.barrier()
                    c0 = time.process_time()
                    t0 = time.perf_counter()
                    if which == "ours":
                        rec = ours.run_step(step)
                        loss = None if rec.loss is None else float(rec.loss)
                    else:
                        parts: list = []
                        sched.step(tokens, target=targets, losses=parts, return_outputs=False)
                        loss = float(sum(parts)) if parts else None
                    t1 = time.perf_counter()
                    cpu[which].append(time.process_time() - c0)
                    times[which].append((t0 - offset, t1 - offset))
                    losses[which].append(loss)
                measured.append(step > 0)
                if step == 0:  # same data, same initial weights: same gradients
                    mine = ours.gradients()
                    for name, p in named:
                        _, rel, ok = compare_tensors(p.grad, mine[name])
                        grad_rel, grad_ok = max(grad_rel, rel), grad_ok and ok
                ours.optimizer_step()
                if torch_opt is not None:
                    torch_opt.step()
                    torch_opt.zero_grad(set_to_none=True)
            del ours, sched, torch_opt
        gathered = transport.gather({"times": times, "cpu": cpu, "losses": losses, "grad_rel": grad_rel,
                                     "grad_ok": grad_ok, "params": len(named)})
        if rank == 0:
            out.append({"term": term, "ranks": gathered, "measured": measured})
            ours_ms = statistics.median(b - a for (a, b), k in zip(times["ours"], measured) if k)
            torch_ms = statistics.median(b - a for (a, b), k in zip(times["torch"], measured) if k)
            sys.stderr.write(f"{PROGRESS} part 1: {term}: rank 0 step ours {ours_ms * 1000:.0f} ms, "
                             f"torch {torch_ms * 1000:.0f} ms\n")
            sys.stderr.flush()
    if rank == 0:
        Path(out_path).write_text(json.dumps(out))
    transport.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- launcher

def _summarise(raw: list[dict]) -> list[dict]:
    rows = []
    for entry in raw:
        ranks, keep = entry["ranks"], entry["measured"]
        row = {"term": entry["term"]}
        for which in ("ours", "torch"):
            spans = [max(r["times"][which][s][1] for r in ranks) - min(r["times"][which][s][0] for r in ranks)
                     for s in range(len(keep)) if keep[s]]
            row[which] = statistics.median(spans)
            row[f"{which}_steps"] = spans  # measured steps only
            row[f"{which}_cpu"] = statistics.median(sum(r["cpu"][which][s] for r in ranks)
                                                    for s in range(len(keep)) if keep[s])
            row[f"{which}_loss"] = [next((r["losses"][which][s] for r in ranks
                                          if r["losses"][which][s] is not None), None) for s in range(len(keep))]
        row["ratio"] = row["ours"] / row["torch"]
        row["paired_ratio"] = statistics.median(a / b for a, b in zip(row["ours_steps"], row["torch_steps"]))
        row["loss_rel_error"] = max(abs(a - b) / abs(b) for a, b in zip(row["ours_loss"], row["torch_loss"]))
        row["grad_rel_error"] = max(r["grad_rel"] for r in ranks)
        row["grad_ok"] = all(r["grad_ok"] for r in ranks)
        row["params"] = sum(r["params"] for r in ranks)
        row["builds"] = len(keep) - sum(keep)
        rows.append(row)
    return rows


def _wait(proc, log_path: Path, timeout_s: float, on_progress) -> int | None:
    """Wait for torchrun, relaying the workers' progress lines; kill it past `timeout_s`."""
    deadline, seen = time.monotonic() + timeout_s, 0
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            if on_progress is not None:
                lines = log_path.read_text(errors="replace").splitlines()
                for line in lines[seen:]:
                    if PROGRESS in line:
                        on_progress(line.split(PROGRESS, 1)[1].strip())
                seen = len(lines)
        return proc.poll()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def compare(p: int = 2, m: int = 8, steps: int = 6, cfg: ModelConfig = TEXT_MODEL,
            terms=TERMS, timeout_s: float = 240.0, on_progress=None, builds: int = 3) -> list[dict]:
    """Launch torchrun with `p` ranks, run both runtimes on each term (`builds` times
    `steps` steps, the first of each build a warm-up), return one row per term."""
    with tempfile.TemporaryDirectory(prefix="mpipe-torchrt-") as tmp:
        run_dir = Path(tmp)
        spec = {"model": asdict(cfg), "terms": [t.format(p=p, m=m) for t in terms], "steps": steps,
                "builds": builds, "run_dir": str(run_dir)}
        (run_dir / "spec.json").write_text(json.dumps(spec))
        out = run_dir / "out.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(p),
               "--max-restarts", "0", "-m", "benchmarks.torch_runtime_bench", "--worker",
               "--spec", str(run_dir / "spec.json"), "--out", str(out)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [v for v in [env.get("PYTHONPATH")] if v])
        log_path = run_dir / "torchrun.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            rc = _wait(proc, log_path, timeout_s, on_progress)
        if rc != 0 or not out.exists():
            tail = log_path.read_text(errors="replace")[-20000:]
            raise RuntimeError(f"torch runtime benchmark failed (rc={rc}):\n{tail}")
        return _summarise(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.torch_runtime_bench")
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="steps per build (the first a warm-up)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.spec, args.out)
        return
    rows = compare(args.p, args.m, args.steps, builds=args.builds)
    print(f"{describe(TEXT_MODEL)}; gloo on CPU, P={args.p}, M={args.m}, median of "
          f"{args.builds} builds x {args.steps - 1} steps")
    print(f"{'schedule':32s} {'ours ms':>8s} {'torch ms':>8s} {'ours/torch':>10s} {'paired':>7s} "
          f"{'CPU s ours':>10s} {'torch':>6s} {'loss rel err':>12s} {'grad rel err':>12s}")
    for r in rows:
        print(f"{r['term']:32s} {r['ours'] * 1000:8.1f} {r['torch'] * 1000:8.1f} {r['ratio']:10.3f} "
              f"{r['paired_ratio']:7.3f} {r['ours_cpu']:10.3f} {r['torch_cpu']:6.3f} "
              f"{r['loss_rel_error']:12.1e} {r['grad_rel_error']:12.1e}")


if __name__ == "__main__":
    main()
