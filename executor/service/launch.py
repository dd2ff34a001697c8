"""Start a process group with `torchrun`, run jobs on it, and watch it.

Locally::

    torchrun --standalone --nproc-per-node N -m executor.runtime.rank --jobs J --run-dir D ...

On a cluster, the same worker is started on every node by torchrun with a
rendezvous endpoint instead of `--standalone` (run this on each node, same
endpoint and job id; `mpipe run ... --nnodes 2 --node-rank K --rdzv-endpoint
host0:29400` does it for you)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint host0:29400 --rdzv-id RUN \\
             -m executor.runtime.rank --jobs jobs.json --run-dir /shared/run --backend nccl

`run_dir` must then be on a file system every node sees (results, status and
error files are written there); rank 0 writes the results.

Failure handling (bounded, no orphans):

* a rank that raises writes `error.<rank>.json` (rank, job, step, op, message)
  and exits; torchrun stops the others;
* a rank that dies (killed, crashed) leaves no error file: the launcher, which
  polls every worker's pid, names the first one gone and the op its status
  board showed (ranks torchrun stopped with SIGTERM, or blocked on a peer,
  count after one that died by itself: they are the casualties);
* a hang: every rank's status board (a memory-mapped record updated at each op)
  is older than `stall_s` -> the launcher names the rank stuck computing (or
  all ranks waiting) and kills the run;
* in every case the launcher kills torchrun's process group and every worker
  (each runs in a session of its own) by pid, then scans `/proc` for anything
  still carrying the run's id.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import ExecutorError, RunFailed
from ..runtime.jobs import Job, JobResult

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding executor/


SETUP_PHASES = ("starting", "preparing")  # status-board phases before a job's first op
# How long `cleanup` waits for torchrun to exit after SIGTERM (then SIGKILL, and as long again).
# The queue worker's parent guard gives torchrun less (`queue_worker.TORCHRUN_GRACE_S`).
TORCHRUN_STOP_WAIT_S = 5


@dataclass
class LaunchOptions:
    nproc: int
    backend: str = "gloo"
    stall_s: float = 60.0  # one op may wait this long for data; a run with no progress this long is stopped
    startup_s: float = 180.0  # until every rank has a status board, and for each set-up phase
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    run_dir: str | None = None
    python: str = sys.executable
    extra_env: dict = field(default_factory=dict)
    # Set by a caller that names the run itself (the queue worker); default: a fresh one.
    run_id: str | None = None
    # The command to start instead of the local torchrun one (a cluster launcher,
    # e.g. srun); it must start `worker_args(...)` on every rank.
    command: list[str] | None = None
    # Watch rank pids (from their pid files) for deaths.  Only meaningful when the
    # ranks run on this host; a cluster launcher turns it off.
    watch_pids: bool = True


def worker_args(opts: LaunchOptions, jobs_path: Path, run_dir: Path, run_id: str) -> list[str]:
    """What every rank runs: the module and its arguments (after torchrun's own)."""
    return ["-m", "executor.runtime.rank", "--jobs", str(jobs_path), "--run-dir", str(run_dir),
            "--backend", opts.backend, "--timeout", str(opts.stall_s + 30), "--run-id", run_id]


def torchrun_command(opts: LaunchOptions, jobs_path: Path, run_dir: Path, run_id: str) -> list[str]:
    cmd = [opts.python, "-m", "torch.distributed.run"]
    if opts.nnodes == 1 and not opts.rdzv_endpoint:
        cmd += ["--standalone"]
    else:
        if not opts.rdzv_endpoint:
            raise ExecutorError("a multi-node run needs --rdzv-endpoint HOST:PORT")
        cmd += ["--nnodes", str(opts.nnodes), "--node-rank", str(opts.node_rank),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", opts.rdzv_endpoint,
                "--rdzv-id", opts.rdzv_id or run_id]
    cmd += ["--nproc-per-node", str(opts.nproc), "--max-restarts", "0", "--monitor-interval", "1"]
    return cmd + worker_args(opts, jobs_path, run_dir, run_id)


# What one gloo rank holds before its model: the interpreter, torch and the process group
# (the build-memory lines of `mpipe run` measure 230-310 MB per rank on this CPU wheel).
GLOO_RANK_BYTES = 300 * 2**20


def available_memory_bytes() -> int | None:
    """The memory this host can still give (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_backend(backend: str, nproc: int | None = None) -> None:
    """Refuse early what cannot work here (before anything is launched): a backend this
    machine lacks, more NCCL ranks on this node than it has GPUs (NCCL wants one each), or
    more gloo ranks than its memory holds processes for (a scaled-down plan that is still
    too large for the machine)."""
    if backend == "gloo":
        available = available_memory_bytes() if nproc is not None else None
        if available is not None and nproc * GLOO_RANK_BYTES > available:
            raise ExecutorError(f"{nproc} ranks on this node need at least {nproc * GLOO_RANK_BYTES / 2**30:.1f} GiB "
                                f"(each gloo rank is a process of about {GLOO_RANK_BYTES >> 20} MiB before its "
                                f"model) but it has {available / 2**30:.1f} GiB available: scale the layout down "
                                f"(--scale dp=K) or spread it over nodes (--nnodes)")
        return
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise ExecutorError("backend nccl needs CUDA devices; none is visible (use --backend gloo on CPU)")
        if nproc is not None and nproc > torch.cuda.device_count():
            raise ExecutorError(f"{nproc} ranks on this node but it has {torch.cuda.device_count()} CUDA "
                                f"device(s) (NCCL needs one per rank): scale the layout down (--scale dp=K) "
                                f"or spread it over nodes (--nnodes)")
        return
    if backend == "hccl":
        import importlib.util

        if importlib.util.find_spec("torch_npu") is None:
            raise ExecutorError("backend hccl needs torch_npu (pip install torch-npu matching your "
                                "torch and CANN); it is not installed")
        return
    raise ExecutorError(f"unknown backend '{backend}' (gloo, nccl, hccl)")


def launch(jobs: list[Job], opts: LaunchOptions,
           on_result: Callable[[JobResult], None] | None = None,
           should_stop: Callable[[], str | None] | None = None) -> list[JobResult]:
    """Run `jobs` on a freshly launched process group; results in job order.

    `should_stop` is called about every 50 ms while the run goes; a non-empty
    reason it returns stops the run (every process) and raises RunFailed with it."""
    # (ranks on this host only: a cluster launcher's nodes are not this machine)
    check_backend(opts.backend, opts.nproc if opts.watch_pids else None)
    own_dir = opts.run_dir is None
    run_dir = Path(opts.run_dir or tempfile.mkdtemp(prefix="mpipe-run-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = opts.run_id or f"mpipe-{uuid.uuid4().hex[:12]}"
    jobs_path = run_dir / "jobs.json"
    jobs_path.write_text(json.dumps([j.to_dict() for j in jobs]))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(opts.extra_env)
    log_path = run_dir / "torchrun.log"
    cmd = opts.command or torchrun_command(opts, jobs_path, run_dir, run_id)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    watcher = _Watcher(proc, run_dir, opts, run_id, on_result, should_stop)
    try:
        watcher.watch()
    finally:
        watcher.cleanup()
    results = watcher.results
    if watcher.failure is not None:
        msg, rank, op = watcher.failure
        log_text = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
        if own_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise RunFailed(msg, rank, op, results, log_text, exit_code=proc.returncode)
    if own_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    return results


class _Watcher:
    def __init__(self, proc, run_dir: Path, opts: LaunchOptions, run_id: str, on_result,
                 should_stop=None):
        self.proc, self.run_dir, self.opts, self.run_id = proc, run_dir, opts, run_id
        self.on_result = on_result
        self.should_stop = should_stop
        self.results: list[JobResult] = []
        self.failure: tuple[str, int | None, str | None] | None = None
        self.world = opts.nproc * opts.nnodes
        self.local_ranks = range(opts.node_rank * opts.nproc, (opts.node_rank + 1) * opts.nproc)
        self.pids: dict[int, int] = {}
        self.gone: dict[int, float] = {}
        self.signals: dict[int, int] = {}  # rank -> the signal that ended it, when its zombie was seen
        self._offset = 0

    # -- reading the run directory
    def _read_results(self) -> None:
        path = self.run_dir / "results.jsonl"
        if not path.exists():
            return
        with open(path) as fh:
            fh.seek(self._offset)
            while True:
                line = fh.readline()
                if not line or not line.endswith("\n"):
                    break
                self._offset += len(line.encode())
                result = JobResult.from_dict(json.loads(line))
                self.results.append(result)
                if self.on_result is not None:
                    self.on_result(result)

    def _statuses(self) -> dict[int, dict]:
        from ..runtime.rank import read_status

        out = {}
        for r in range(self.world):
            st = read_status(self.run_dir / f"status.{r}")
            if st is not None and st["time"] > 0:
                out[r] = st
        return out

    def _errors(self) -> list[dict]:
        errs = []
        for path in sorted(self.run_dir.glob("error.*.json")):
            try:
                errs.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return errs

    def _poll_pids(self) -> None:
        if not self.opts.watch_pids:  # ranks on other hosts: their pids mean nothing here
            return
        for r in self.local_ranks:
            if r not in self.pids:
                path = self.run_dir / f"pid.{r}"
                if path.exists():
                    try:
                        self.pids[r] = int(path.read_text())
                    except ValueError:
                        continue
        now = time.monotonic()
        for r, pid in self.pids.items():
            if r not in self.gone and not _alive(pid):
                self.gone[r] = now
                sig = _killed_by(pid)
                if sig:
                    self.signals[r] = sig

    # -- the loop
    def watch(self) -> None:
        start = time.monotonic()
        first_error_at = None
        while True:
            rc = self.proc.poll()
            self._poll_pids()
            self._read_results()
            errors = self._errors()
            statuses = self._statuses()
            finished = all(statuses.get(r, {}).get("phase") == "finished" for r in range(self.world))
            if rc is not None:
                self._read_results()
                if rc != 0 or not finished:
                    self.failure = self._explain(errors, statuses, f"torchrun exited with code {rc}")
                return
            if self.should_stop is not None:
                reason = self.should_stop()
                if reason:
                    self.failure = (reason, None, None)
                    return
            if errors or (self.gone and not finished):
                if first_error_at is None:
                    first_error_at = time.monotonic()
                elif time.monotonic() - first_error_at > 15:  # torchrun did not stop in time
                    self.failure = self._explain(errors, statuses, "the run did not stop after a failure")
                    return
            now = time.time()
            if len(statuses) < self.world:
                if time.monotonic() - start > self.opts.startup_s:
                    self.failure = (f"only {len(statuses)} of {self.world} ranks started within "
                                    f"{self.opts.startup_s:g} s", None, None)
                    return
            elif not finished and not errors and not self.gone:
                newest = max(st["time"] for st in statuses.values())
                # Ranks still starting (process group, clocks) or preparing a job (model,
                # plan) have no op to progress on yet: they get the start-up limit, so a
                # loaded machine is not mistaken for a hang.
                setting_up = any(st["phase"] in SETUP_PHASES for st in statuses.values())
                limit = self.opts.startup_s if setting_up else self.opts.stall_s
                if now - newest > limit:
                    self.failure = self._hang(statuses, now - newest)
                    return
            time.sleep(0.05)

    def _explain(self, errors: list[dict], statuses: dict, fallback: str):
        """The root cause: an error a rank raised itself, else the first rank that
        died, else an error that only reports a lost peer or a timeout."""
        primary = sorted((e for e in errors if not _secondary(e.get("message", ""))),
                         key=lambda e: (e.get("time", 0), e["rank"]))
        if primary:
            e = primary[0]
            where = f" in op {e['op']} (step {e.get('step', 0)}, {e.get('phase')})" if e.get("op") else ""
            job = f" [job {e['job']}]" if e.get("job") else ""
            return (f"rank {e['rank']} failed{where}{job}: {e['message']}", e["rank"], e.get("op"))
        errored = {e["rank"] for e in errors}
        dead = {r: t for r, t in self.gone.items() if r not in errored}
        if dead:
            # torchrun stops the survivors of a death with SIGTERM, and a loaded machine can
            # let both deaths fall in one poll: a rank torchrun stopped, or one blocked on a
            # peer, is a casualty, not the cause.
            def blame(k: int):
                stopped = self.signals.get(k) == signal.SIGTERM
                blocked = statuses.get(k, {}).get("phase") in ("waiting", "receiving", "sending")
                return (stopped, dead[k], blocked, k)
            r = min(dead, key=blame)
            st = statuses.get(r, {})
            op = st.get("op") or None
            where = f" during op {op} (step {st.get('step', 0)}, {st.get('phase')})" if op else ""
            return (f"rank {r} died{where} without reporting an error (killed or crashed)", r, op)
        if errors:
            e = min(errors, key=lambda e: (e.get("time", 0), e["rank"]))
            return (f"rank {e['rank']} failed in op {e.get('op')}: {e['message']}", e["rank"], e.get("op"))
        return (fallback, None, None)

    def _hang(self, statuses: dict, idle: float):
        computing = [r for r, st in sorted(statuses.items()) if st["phase"] == "computing"]
        if computing:
            r = computing[0]
            st = statuses[r]
            others = [k for k in statuses if k != r]
            return (f"rank {r} hung in op {st['op']} (step {st['step']}): no progress for {idle:.0f} s "
                    f"(ranks {others} waiting)", r, st["op"])
        parts = ", ".join(f"rank {r} {st['phase']} at {st['op']}" for r, st in sorted(statuses.items()))
        return (f"no rank made progress for {idle:.0f} s: {parts}", None, None)

    def cleanup(self) -> None:
        """Stop torchrun and every worker, whatever state they are in."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(TORCHRUN_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(TORCHRUN_STOP_WAIT_S)
        self._poll_pids()
        for pid in list(self.pids.values()) + _pids_with(self.run_id):
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in self.pids.values()):
            time.sleep(0.05)


_SECONDARY = ("connection reset", "connection closed", "read error", "broken pipe", "timed out",
              "no data within", "socket closed", "peer", "nccl communicator was aborted")


def _secondary(message: str) -> bool:
    """An error that reports another rank's failure rather than its own."""
    low = message.lower()
    return any(s in low for s in _SECONDARY)


def _signal_group(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _killed_by(pid: int) -> int | None:
    """The signal that ended `pid`, read from its zombie's exit status (Linux 3.5+), if
    the process is still a zombie; None when it exited by itself or is already reaped."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().split(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    return (int(fields[49]) & 0x7F) or None  # field 52, exit_code, as waitpid reports it


def _pids_with(token: str) -> list[int]:
    """Processes whose command line mentions `token` (Linux /proc; empty elsewhere)."""
    found = []
    proc = Path("/proc")
    if not proc.exists():
        return found
    me = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def live_processes(run_id_token: str) -> list[int]:
    return [p for p in _pids_with(run_id_token) if _alive(p)]
