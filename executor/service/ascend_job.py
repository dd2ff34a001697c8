"""A queue worker's launcher for a Kubernetes cluster with Volcano and MindCluster:
one `AscendJob` per run (`examples/launchers/ascendjob.launcher` is the
`mpipe worker --launcher` line that starts it).

    python -m executor.service.ascend_job --manifest examples/launchers/ascendjob.yaml \\
        --run-dir DIR --nnodes N --npus-per-pod K --rdzv-id ID --name NAME [--dry-run] -- ENTRY...

It fills the manifest's fields ({name}, {nnodes}, {workers} = N - 1 worker pods
beside the master, {npus_per_pod}, {run_root}, {command}: each pod's
`executor.service.pod_torchrun` line, a JSON list), writes it to
`DIR/ascendjob.yaml`, creates it with `kubectl create -f`, and stays until
the run is over: every rank's status board says finished, a rank wrote an
error file, or the job's last condition is Failed.  It then deletes the job
(also when the worker stops it with SIGTERM), so it is a command the
launcher can watch and stop like torchrun.  `--dry-run` prints the manifest.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 2.0


def pod_command(rdzv_id: str, entry: list[str]) -> list[str]:
    return ["python", "-m", "executor.service.pod_torchrun", "--rdzv-id", rdzv_id, "--", *entry]


def render(template: str, *, name: str, nnodes: int, npus_per_pod: int, run_dir: Path, rdzv_id: str,
           entry: list[str]) -> str:
    """The manifest for one run (JSON strings are YAML scalars, so any path or argument is safe)."""
    fields = {"name": name, "nnodes": nnodes, "workers": nnodes - 1, "npus_per_pod": npus_per_pod,
              "run_root": json.dumps(str(run_dir.parent)), "command": json.dumps(pod_command(rdzv_id, entry))}
    return template.format(**fields)


def _run_over(run_dir: Path, world: int) -> bool:
    from ..runtime.rank import read_status

    if any(run_dir.glob("error.*.json")):
        return True
    boards = [read_status(run_dir / f"status.{r}") for r in range(world)]
    return all(b is not None and b["phase"] == "finished" for b in boards)


def _failed(name: str) -> bool:
    out = subprocess.run(["kubectl", "get", "ascendjob", name, "-o", "jsonpath={.status.conditions[-1].type}"],
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "Failed"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m executor.service.ascend_job")
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument("--npus-per-pod", type=int, required=True)
    ap.add_argument("--rdzv-id", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("entry", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    entry = args.entry[1:] if args.entry[:1] == ["--"] else args.entry
    run_dir = Path(args.run_dir)
    try:
        text = render(Path(args.manifest).read_text(), name=args.name, nnodes=args.nnodes,
                      npus_per_pod=args.npus_per_pod, run_dir=run_dir, rdzv_id=args.rdzv_id, entry=entry)
    except (OSError, KeyError, ValueError) as error:
        print(f"error: --manifest {args.manifest}: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    path = run_dir / "ascendjob.yaml"
    path.write_text(text)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    created = subprocess.run(["kubectl", "create", "-f", str(path)])
    if created.returncode != 0:
        return created.returncode
    code = 0
    try:
        while not stopping and not _run_over(run_dir, args.nnodes * args.npus_per_pod):
            if _failed(args.name):
                code = 1
                break
            time.sleep(POLL_S)
        code = 1 if stopping or any(run_dir.glob("error.*.json")) else code
    finally:
        subprocess.run(["kubectl", "delete", "ascendjob", args.name, "--wait=false"])
    return code


if __name__ == "__main__":
    sys.exit(main())
