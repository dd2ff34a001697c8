"""`python local_srun.py -N n CMD ARGS...`: a stand-in for `srun -N n CMD` on one
machine, for testing the worker's cluster launcher path for real.

Starts CMD n times at once, one per "node" (SLURM_NODEID / SLURM_PROCID /
SLURM_NNODES set as srun would), forwards SIGTERM/SIGINT to every copy, and
exits with the first non-zero status (stopping the others), like srun.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "-N" or not argv[1].isdigit():
        sys.stderr.write("usage: local_srun.py -N NODES CMD [ARGS...]\n")
        return 2
    nodes, command = int(argv[1]), argv[2:]
    procs = []
    for node in range(nodes):
        env = dict(os.environ, SLURM_NODEID=str(node), SLURM_PROCID=str(node), SLURM_NNODES=str(nodes))
        procs.append(subprocess.Popen(command, env=env))

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        codes = [p.poll() for p in procs]
        bad = [c for c in codes if c not in (None, 0)]
        if bad:
            forward(signal.SIGTERM, None)
            for p in procs:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
            return bad[0] if bad[0] > 0 else 128 - bad[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
