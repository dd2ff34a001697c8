"""python -m benchmarks worker [--steps N]: the queue path measured end to end.

A real `mpipe worker` on a fresh SQLite database runs two queued runs of one
schedule (P=2, gloo, the executor's `tiny` MLLM).  Printed per run: how long
each finished step took to reach the database (the worker's stream summary),
and how well a calibration predicts a run: fitted on the run itself, and fitted
on the other run (the figure that moves with background load on a shared
machine).  These were wall-clock limits inside tests once; they are figures,
not pass/fail checks.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TERM = "1f1b(p=2, m=4)"


def _setup(folder: Path, steps: int) -> tuple[str, list[int]]:
    from executor.runtime.model import MODEL_PRESETS
    from executor.runtime.model_workload import workload_for
    from storage import enqueue, open_database, save_schedule

    workload = folder / "tiny.json"
    workload.write_text(json.dumps(workload_for(MODEL_PRESETS["tiny"], name="tiny")))
    url = f"sqlite:///{folder / 'mpipe.db'}"
    db = open_database(url)
    save_schedule(db, "s", TERM, workload=str(workload), author="bench")
    runs = [enqueue(db, "s", steps=steps, launched_by="bench").id for _ in range(2)]
    db.close()
    return url, runs


def _serve(url: str, folder: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("MPIPE_DB_URL", None)
    cmd = [sys.executable, "-m", "mpipe_cli.main", "worker", "--db", url, "--once", "--poll", "0.2",
           "--run-root", str(folder / "runs")]
    # --once with the default --max-parallel 1 serves one run; two calls serve both, in order.
    for _ in range(2):
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=900)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks worker")
    ap.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    args = ap.parse_args(argv)
    from executor.analysis.calibrate import calibrate_run
    from executor.analysis.compare_run import compare_run
    from storage import get_run, open_database, save_workload

    with tempfile.TemporaryDirectory(prefix="mpipe-worker-bench-") as tmp:
        folder = Path(tmp)
        url, runs = _setup(folder, args.steps)
        t0 = time.monotonic()
        print(f"worker: 2 queued runs of {TERM}, {args.steps} steps each ...", file=sys.stderr, flush=True)
        _serve(url, folder)
        wall = time.monotonic() - t0
        db = open_database(url)
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"worker: {TERM} on the tiny MLLM, P=2 gloo, {args.steps} steps per run; two runs served "
              f"in {wall:.0f} s; load average {load} on {os.cpu_count()} cores")
        print(f"{'run':>4} {'status':>10} {'lag median s':>13} {'lag max s':>10} "
              f"{'cal. on itself':>15} {'cal. on the other run':>22}")
        cals = {}
        for run_id in runs:
            cals[run_id] = calibrate_run(db, run_id)
            save_workload(db, f"cal-{run_id}", cals[run_id].workload, message="worker benchmark")
        for run_id, other in zip(runs, reversed(runs)):
            run = get_run(db, run_id)
            lag = re.search(r"median ([\d.]+) s, max ([\d.]+) s", run.log_tail or "")
            median, worst = (lag.group(1), lag.group(2)) if lag else ("-", "-")
            cross = compare_run(db, run_id, workload=f"saved:cal-{other}")
            print(f"{run_id:>4} {run.status:>10} {median:>13} {worst:>10} {cals[run_id].error:>+15.1%} "
                  f"{cross.error:>+22.1%}")
        print("cal. = predicted / measured makespan - 1, the prediction simulated on a calibrated workload")
        db.close()
