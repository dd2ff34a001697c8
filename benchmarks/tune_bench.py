"""How long `mpipe tune` takes at the issue's scale (InternVL-26B, 32 devices,
256 microbatches: the pipeline of a 512-device job), as a whole process.

Each run is `mpipe tune ... --json` in a fresh interpreter: wall time, the CPU
time the process used, how many candidates it evaluated, how many the time
limit left out, and its best term.  With `--baseline DIR` (a checkout of an
older tree, e.g. `git worktree add /tmp/old 0bce46c`) the same command runs
there too, alternating with this tree's runs so both see the same machine
load, and the table ends with old / new ratios.  The search's own time limit
is lifted (`--time-limit 100000`) so both search their whole space; `--limit`
sets it (45 s is the command's default) to see what a user gets by default.
`--memory-cap` (this tree only: the baseline predates the memory model and
searches without a cap) is passed to `mpipe tune`; by default this tree keeps
the command's own default, the workload's device memory, except beside a
baseline, where it searches uncapped too (`none`) so the ratio compares the
same search.

python -m benchmarks tune [--baseline DIR] [--runs N] [--limit S] [--memory-cap X|none] [-w WORKLOAD] [-p P] [-m M]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def run_once(tree: Path, workload: str, p: int, m: int, limit: float, extra: list[str]) -> dict:
    """One `mpipe tune` process on `tree`'s code."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    argv = [sys.executable, "-m", "mpipe_cli.main", "tune", "-w", workload, "-p", str(p), "-m", str(m),
            "--json", "--time-limit", repr(limit), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"error: {tree}: mpipe tune failed: {done.stderr.strip().splitlines()[-1:]}")
    doc = json.loads(done.stdout)
    skipped = sum(int(n) for n in re.findall(r"reached: (\d+) .* not tried", done.stderr))
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "candidates": len(re.findall(r"^tune: \[", done.stderr, flags=re.M)), "not_tried": skipped,
            "best": doc["best"]["term"], "makespan": doc["best"]["makespan"]}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=None, help="an older checkout to run side by side")
    parser.add_argument("--runs", type=int, default=1, help="runs of each tree (alternating)")
    parser.add_argument("--limit", type=float, default=100000.0, help="mpipe tune --time-limit (default: none)")
    parser.add_argument("--memory-cap", default=None,
                        help="mpipe tune --memory-cap for this tree (default: its own; none with --baseline)")
    parser.add_argument("-w", "--workload", default="internvl-26b")
    parser.add_argument("-p", "--devices", type=int, default=32)
    parser.add_argument("-m", "--microbatches", type=int, default=256)
    args = parser.parse_args(argv)
    trees = [("this tree", HERE)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    for _, tree in trees:
        if not (tree / "mpipe_core").is_dir():
            raise SystemExit(f"error: {tree} holds no mpipe_core")
    load = os.getloadavg()[0]
    # The baseline searches uncapped (it predates the memory model): so does this tree beside it,
    # unless --memory-cap says otherwise.
    cap = args.memory_cap if args.memory_cap is not None or not args.baseline else "none"
    extra = {"this tree": [] if cap is None else ["--memory-cap", cap], "baseline": []}
    shown = f" (this tree: --memory-cap {cap})" if args.memory_cap is not None else ""
    defaulted = (f"; this tree: --memory-cap {cap} (default with --baseline: the baseline searches uncapped)"
                 if cap is not None and args.memory_cap is None else "")
    print(f"mpipe tune -w {args.workload} -p {args.devices} -m {args.microbatches} --time-limit {args.limit:g}{shown}, "
          f"whole process; {os.cpu_count()} CPUs, load average {load:.1f} at the start{defaulted}")
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for i in range(args.runs):
        for name, tree in trees:
            print(f"  run {i + 1}: {name} ({tree}) ...", file=sys.stderr, flush=True)
            results[name].append(run_once(tree, args.workload, args.devices, args.microbatches, args.limit,
                                          extra[name]))
    print(f"{'tree':<10} {'run':>3} {'wall s':>7} {'cpu s':>7} {'tried':>5} {'not tried':>9} {'best':>9}  best term")
    for name, _ in trees:
        for i, r in enumerate(results[name]):
            print(f"{name:<10} {i + 1:>3} {r['wall']:>7.1f} {r['cpu']:>7.1f} {r['candidates']:>5} {r['not_tried']:>9} "
                  f"{r['makespan']:>9.5g}  {r['best']}")
    if args.baseline:
        for what in ("wall", "cpu"):
            new = min(r[what] for r in results["this tree"])
            old = min(r[what] for r in results["baseline"])
            print(f"baseline / this tree, best {what} time of {args.runs} run(s): {old:.1f} / {new:.1f} = "
                  f"{old / new:.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.1f} (other work on the machine stretches wall time)")
