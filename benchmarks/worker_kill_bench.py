"""python -m benchmarks worker-kill [--times N] [--burners K] [--database sqlite|postgresql]

The SIGKILL guarantee under load: the worker-kill test
(`test_sigkilled_worker_run_is_requeued_and_the_next_attempt_keeps_its_rows_apart`)
run N times in a row (default 10) while K processes (default: one per core)
spin on the CPU beside it.  Each line: pass or fail, the test's wall time, and
how long after the kill the run's processes were gone (the test's own figure).
A count, not a timed check: it says whether the guarantee held every time.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = ("tests/executor/service/test_worker_failures.py::"
        "test_sigkilled_worker_run_is_requeued_and_the_next_attempt_keeps_its_rows_apart")
GONE = re.compile(r"run's processes gone ([\d.]+) s after the kill")


def _burn() -> None:  # pragma: no cover - runs in a child until killed
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks worker-kill")
    ap.add_argument("--times", type=int, default=10, help="runs of the test in a row (default 10)")
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2,
                    help="CPU-burning processes beside it (default: one per core)")
    ap.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    args = ap.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    burners = [ctx.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    print(f"worker-kill test x{args.times} on {args.database}, beside {args.burners} CPU-burning "
          f"process(es) on {os.cpu_count()} core(s)")
    print(f"{'run':>3}  {'result':<6}  {'test s':>7}  {'processes gone after the kill (s)':>34}")
    passed = 0
    try:
        for i in range(1, args.times + 1):
            t0 = time.monotonic()
            out = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST, "-k", args.database],
                cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            took = time.monotonic() - t0
            ok = out.returncode == 0
            passed += ok
            gone = GONE.search(out.stdout)
            print(f"{i:>3}  {'pass' if ok else 'FAIL':<6}  {took:>7.1f}  {gone.group(1) if gone else '-':>34}",
                  flush=True)
            if not ok:
                print("\n".join("     | " + line for line in (out.stdout + out.stderr).splitlines()[-25:]))
    finally:
        for b in burners:
            b.kill()
            b.join()
    print(f"\n{passed} of {args.times} passed")


if __name__ == "__main__":
    main(sys.argv[1:])
