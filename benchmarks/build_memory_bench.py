"""Build-memory benchmark (issue 39, section 5): each rank builds only its part.

    python -m benchmarks build-memory [--d-model 768] [--layers 16] [--pp 4]

The built-in MLLM at a size where parameters dominate a process's memory
(d_model 768, 16 layers: about 0.45 GB of float32 LLM weights) runs one step
of `1f1b(p=1, m=4)` (one rank holds everything) and of `1f1b(p=PP, m=4)`
(PP torchrun ranks on gloo), one launch each.  Every rank constructs the
model on the meta device and makes real only its chunks' parameters
(`executor.runtime.models.materialise`), and measures its process's peak
resident memory after the build and how far that rose above what the process
held before it (torch's import and the process group are not the model's).

Target: the largest rank at pp=PP needs well under half the rise of pp=1
(printed as a ratio; with PP=4 an even split gives about 1/4 plus the
embedding and head).  Not part of `all`: two launches of a half-gigabyte
model take a minute or two here.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time


def log(msg: str) -> None:
    sys.stderr.write(f"[build-memory {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def run(pp: int, cfg, tmp: str) -> list[dict]:
    from executor.runtime.jobs import Job
    from executor.runtime.model_workload import workload_for
    from executor.service.launch import LaunchOptions, launch
    from mpipe_core.api import evaluate

    term = f"1f1b(p={pp}, m=4)"
    job = Job.make(term, evaluate(term, workload_for(cfg)).schedule, cfg, steps=1)
    log(f"{term}: launching {pp} rank(s)")
    (result,) = launch([job], LaunchOptions(nproc=pp, stall_s=300, run_dir=f"{tmp}/pp{pp}"))
    return [m["build"] for m in sorted(result.memory, key=lambda m: m["rank"])]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks build-memory")
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--pp", type=int, default=4)
    args = ap.parse_args(argv)
    from executor.runtime.model import ModelConfig

    cfg = ModelConfig(vocab=256, d_model=args.d_model, n_layer=args.layers, n_head=12, text_len=16)
    mb = 2 ** 20
    with tempfile.TemporaryDirectory() as tmp:
        whole = run(1, cfg, tmp)
        split = run(args.pp, cfg, tmp)
    print(f"Build memory, built-in MLLM d_model={cfg.d_model}, {cfg.n_layer} layers "
          f"(MB; peak: the process's peak resident after the build; rise: above its resident before it)")
    print(f"{'pp':>3} {'rank':>4} {'parameters':>11} {'peak':>9} {'rise':>9}")
    for pp, builds in ((1, whole), (args.pp, split)):
        for rank, b in enumerate(builds):
            print(f"{pp:>3} {rank:>4} {b['parameters'] / mb:>11.1f} {b['peak'] / mb:>9.1f} {b['growth'] / mb:>9.1f}")
    largest = max(b["growth"] for b in split)
    ratio = largest / whole[0]["growth"]
    print(f"largest rank's rise at pp={args.pp} / rise at pp=1: {ratio:.3f} "
          f"({'well under half' if ratio < 0.4 else 'NOT well under half'}; peak ratio "
          f"{max(b['peak'] for b in split) / whole[0]['peak']:.3f})")
    return {"whole": whole, "split": split, "ratio": ratio}


if __name__ == "__main__":
    main()
