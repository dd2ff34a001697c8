"""python -m benchmarks stragglers: a 512-rank job's msprof-analyze summary
(`cluster_step_trace_time.csv`, generated: tp=8, dp=16, pp=4 in Megatron's
order, three steps, two slow cards) imported as a run summary and its slow
cards found, `mpipe import-trace` and `mpipe runs show --stragglers` each
timed as one whole process.  Target: both together under 5 s.

`cluster_csv` is also what the tests import (tests/mpipe_cli/test_step_summary_cli.py)."""
from __future__ import annotations

import csv
import io
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = ["Step", "Type", "Index", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication",
          "Free", "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing",
          "DP Index", "PP Index", "TP Index"]
TP, DP, PP = 8, 16, 4
SLOW = (77, 300)  # pp0/dp9/tp5 and pp2/dp5/tp4
TARGET_S = 5.0


def cluster_csv(slow: tuple[int, ...] = SLOW, slowdown: float = 1.15, steps: int = 3, seed: int = 0) -> str:
    """The summary: stage s computes (1.2 - 0.05 s) x 80 ms per step (stage 0 holds the encoder), each rank
    within +-1% of that; a slow rank computes `slowdown` x more; everyone waits for the slowest (bubble/free)."""
    rng = random.Random(seed)
    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(HEADER)
    for step in range(steps):
        rows = []
        for rank in range(TP * DP * PP):
            tp, dp, pp = rank % TP, rank // TP % DP, rank // (TP * DP)
            computing = 80_000.0 * (1.2 - 0.05 * pp) * rng.uniform(0.99, 1.01) * (slowdown if rank in slow else 1.0)
            send = 2_000.0 * rng.uniform(0.98, 1.02)
            rows.append([rank, tp, dp, pp, computing, send])
        span = max(r[4] + r[5] for r in rows) + 6_000.0
        stage_max: dict[int, list[float]] = {}
        for rank, tp, dp, pp, computing, send in rows:
            bubble = 0.6 * (span - computing - send)
            free = span - computing - send - bubble
            comm = send + bubble
            figures = [computing, comm, 500.0, comm + 500.0, free, span - bubble, bubble, send, 300.0]
            out.writerow([step, "rank", rank] + [f"{f:.3f}" for f in figures] + [dp, pp, tp])
            stage_max[pp] = [max(a, b) for a, b in zip(stage_max.get(pp, figures), figures)]
        for pp, figures in sorted(stage_max.items()):
            out.writerow([step, "stage", pp] + [f"{f:.3f}" for f in figures] + ["", "", ""])
    return buf.getvalue()


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _timed(argv: list[str]) -> tuple[tuple[float, float], str]:
    """(wall, CPU) seconds of `mpipe ARGV` as a whole process, and its output (the machine is shared:
    the CPU seconds are what the command itself cost)."""
    start, cpu = time.perf_counter(), _cpu()
    done = subprocess.run([sys.executable, "-m", "mpipe_cli.main", *argv], capture_output=True, text=True)
    took = (time.perf_counter() - start, _cpu() - cpu)
    if done.returncode != 0:
        raise SystemExit(f"mpipe {' '.join(argv)} failed: {done.stderr[-2000:]}")
    return took, done.stdout


def main(argv: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cluster_step_trace_time.csv"
        path.write_text(cluster_csv())
        db = str(Path(folder) / "m.db")
        env_db = ["--db", db]
        a, out = _timed(["import-trace", str(path), "--term", "1f1b(p=4, m=8)", *env_db])
        run = out.split()[2].rstrip(":")
        b, out = _timed(["runs", "show", run, "--stragglers", *env_db])
        flagged = [line.split()[0] for line in out.splitlines()[4:]]
        print(f"{'what':<60} {'wall s':>8} {'CPU s':>8} {'target':>8}")
        print(f"{'import 512-rank cluster_step_trace_time.csv (whole process)':<60} {a[0]:>8.2f} {a[1]:>8.2f}")
        print(f"{'runs show --stragglers (whole process)':<60} {b[0]:>8.2f} {b[1]:>8.2f}")
        print(f"{'both':<60} {a[0] + b[0]:>8.2f} {a[1] + b[1]:>8.2f} {TARGET_S:>8.1f}")
        print(f"flagged ranks: {', '.join(flagged)} (generated slow: {', '.join(map(str, SLOW))})")


if __name__ == "__main__":
    main(sys.argv[1:])
