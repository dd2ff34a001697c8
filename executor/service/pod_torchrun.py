"""What each pod of an AscendJob runs: torchrun, with its arguments read from the
environment the Ascend Operator (MindCluster) injects.

    python -m executor.service.pod_torchrun --rdzv-id ID -- -m executor.runtime.rank ...

In an AscendJob `WORLD_SIZE` is the number of NPUs of the whole job, `RANK`
the pod's index and `LOCAL_WORLD_SIZE` the NPUs of one pod (not torchrun's
meanings: there each is per process), so torchrun gets

    --nnodes WORLD_SIZE / LOCAL_WORLD_SIZE --node-rank RANK
    --nproc-per-node LOCAL_WORLD_SIZE --rdzv-endpoint MASTER_ADDR:MASTER_PORT

and the variables are removed before it starts, so they do not reach the
ranks under those other meanings (torchrun sets its own).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping

OPERATOR_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE")


class PodEnvironmentError(Exception):
    pass


def _count(env: Mapping[str, str], name: str, low: int) -> int:
    value = env.get(name, "")
    if not value.isdigit() or int(value) < low:
        raise PodEnvironmentError(f"{name}={value!r}: expected a whole number >= {low} (set by the Ascend "
                                  f"Operator in an AscendJob's pods)")
    return int(value)


def torchrun_args(env: Mapping[str, str], rdzv_id: str) -> list[str]:
    """torchrun's node arguments from an AscendJob pod's environment."""
    world = _count(env, "WORLD_SIZE", 1)
    local = _count(env, "LOCAL_WORLD_SIZE", 1)
    node = _count(env, "RANK", 0)
    if world % local:
        raise PodEnvironmentError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local}")
    if node >= world // local:
        raise PodEnvironmentError(f"RANK={node} but the job has {world // local} pods")
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if not addr or not port.isdigit():
        raise PodEnvironmentError("MASTER_ADDR and MASTER_PORT must name the rendezvous (the master pod)")
    return ["--nnodes", str(world // local), "--node-rank", str(node), "--nproc-per-node", str(local),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:{port}", "--rdzv-id", rdzv_id,
            "--max-restarts", "0"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m executor.service.pod_torchrun")
    ap.add_argument("--rdzv-id", required=True)
    ap.add_argument("entry", nargs=argparse.REMAINDER, help="-- then what every rank runs")
    args = ap.parse_args(argv)
    entry = args.entry[1:] if args.entry[:1] == ["--"] else args.entry
    try:
        node = torchrun_args(os.environ, args.rdzv_id)
    except PodEnvironmentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if k not in OPERATOR_VARIABLES}
    cmd = [sys.executable, "-m", "torch.distributed.run", *node, *entry]
    os.execve(sys.executable, cmd, env)
    return 0  # pragma: no cover - execve does not return


if __name__ == "__main__":
    sys.exit(main())
