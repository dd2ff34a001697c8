"""The queue worker: takes queued runs from the database and runs them.

    mpipe worker [--db URL] [--once] [--max-parallel N] [--launcher local|TEMPLATE]

A loop claims the oldest queued run it can serve (`storage.claim_next_run`,
atomic, so several workers on several machines may serve one queue), and a
supervising thread per run:

1. turns the run record into a job (`run_setup.prepare_run`); a run that
   cannot be launched as recorded fails at once with the reason;
2. launches it (`launch.launch`): the local launcher is `torchrun --standalone`,
   a template launcher fills in a team's cluster command (below);
3. while it goes, every ~0.25 s, tails the ranks' per-step timing files
   (`executor.timing_stream`) and inserts the new rows in one batch, and every
   `lease/3` seconds renews the lease (`storage.heartbeat`), which also says
   whether someone asked to cancel;
4. stops the whole process group when the run is cancelled, runs past its
   `timeout_s` option, or the worker is shutting down (SIGTERM/SIGINT), and
   records the end: status, exit code, error, the tail of the log and each
   rank's measured memory (`storage.finish_run`); on shutdown the run goes back to the queue instead
   (`storage.release_run`).  A run is never left `running` by a worker that
   exits; one that is killed outright (SIGKILL) takes its torchrun and every
   rank with it (`parent_guard`) and its run turns `lost` (or is requeued) when the lease
   runs out.  Its run directory (`run-<id>-a<attempt>-*` under the run root)
   is left behind, with the partial log: any worker on that run root removes
   it when it next starts or expires a lease, once that attempt is over
   (kept with `--keep-run-dirs`).

Template launchers
------------------
`--launcher` takes a command line with fields in braces, e.g. for Slurm::

    srun -N {nnodes} --ntasks-per-node 1 {torchrun} --nnodes {nnodes}
         --nproc-per-node {nproc_per_node} --rdzv-backend c10d
         --rdzv-endpoint {rdzv} --rdzv-id {rdzv_id} --max-restarts 0 {entry}

Fields: {nnodes} {nproc_per_node} {nproc} (all ranks) {rdzv} (HOST:PORT)
{rdzv_host} {rdzv_port} {rdzv_id} {run_id} (the database id) {run_dir}
{backend} {python} {torchrun} (`python -m torch.distributed.run`) and {entry}
(what each rank runs: `-m executor.runtime.rank ...`; required).  The line is split
like a shell would (no shell runs it: write `bash -c '...'` for one).  The
run directory (`--run-root`) must then be on a file system every node sees,
and `--rdzv-host` a name the nodes reach (the first node, or any host that
can hold the rendezvous store).
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import string
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from mpipe_core.errors import MpipeError

from ..errors import RunFailed, WorkerError
from .build_memory import build_memory_line

LOG_TAIL_BYTES = 48 * 1024
STREAM_INTERVAL_S = 0.25
# How long torchrun gets to stop its ranks after the worker died (then the guard kills them);
# below `launch.TORCHRUN_STOP_WAIT_S`, what the launcher waits for it when it stops a run itself
# (checked in `_run`: launch imports torch, this module does not).
TORCHRUN_GRACE_S = 3
LAUNCHER_FIELDS = ("nnodes", "nproc_per_node", "nproc", "rdzv", "rdzv_host", "rdzv_port", "rdzv_id",
                   "run_id", "run_dir", "backend", "python", "torchrun", "entry")


def check_template(template: str) -> str:
    """Refuse a launcher template with unknown fields or without {entry}."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        raise WorkerError(f"launcher template: {error}") from None
    unknown = sorted(n for n in names if n not in LAUNCHER_FIELDS)
    if unknown:
        raise WorkerError(f"launcher template: unknown field {{{unknown[0]}}} "
                          f"(fields: {', '.join('{' + f + '}' for f in LAUNCHER_FIELDS)})")
    if "entry" not in names:
        raise WorkerError("launcher template: it must start {entry} on every rank "
                          "(e.g. '... torchrun ... {entry}')")
    return template


def fill_template(template: str, fields: dict) -> list[str]:
    quoted = {k: (shlex.join(v) if isinstance(v, list) else shlex.quote(str(v))) for k, v in fields.items()}
    return shlex.split(template.format(**quoted))


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def available_backends() -> tuple[str, ...]:
    """The backends this machine can run (a worker claims only those runs)."""
    import importlib.util

    found = ["gloo"]
    try:
        import torch

        if torch.cuda.is_available():
            found.append("nccl")
    except ImportError:  # pragma: no cover - the executor needs torch anyway
        pass
    if importlib.util.find_spec("torch_npu") is not None:
        found.append("hccl")
    return tuple(found)


@dataclass
class WorkerOptions:
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    max_parallel: int = 1
    launcher: str = "local"  # or a template (see the module docstring)
    lease_s: float = 30.0
    heartbeat_s: float | None = None  # default: a third of the lease
    poll_s: float = 1.0  # how often an idle worker looks at the queue
    run_root: str | None = None  # where run directories go (default: $MPIPE_RUN_ROOT or /tmp)
    rdzv_host: str = "127.0.0.1"
    keep_run_dirs: bool = False
    once: bool = False  # claim up to max_parallel runs once, finish them, exit
    backends: tuple[str, ...] | None = None  # default: available_backends()
    models: str | None = None  # the model allow-list file (default: $MPIPE_MODELS), read at each claim

    def check(self) -> None:
        if self.max_parallel < 1:
            raise WorkerError(f"--max-parallel must be at least 1, not {self.max_parallel}")
        if self.lease_s <= 0:
            raise WorkerError(f"--lease must be positive, not {self.lease_s:g}")
        if self.heartbeat_s is not None and not 0 < self.heartbeat_s < self.lease_s:
            raise WorkerError(f"--heartbeat must be positive and shorter than the lease ({self.lease_s:g} s)")
        if self.launcher != "local":
            check_template(self.launcher)
        from mpipe_core.runs.model_registry import load_registry

        load_registry(self.models)  # a bad allow-list is one line now, not a failed run later


def default_run_root(db_url: str) -> str:
    """The temp folder's `mpipe-runs/<database>`: one folder per database, because a
    worker sweeps the run directories its database does not know (`sweep_run_dirs`),
    and two databases sharing one folder (two clones, the app's worker beside a
    test's) would delete each other's live runs."""
    import hashlib

    digest = hashlib.sha256(db_url.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), "mpipe-runs", digest)


class QueueWorker:
    def __init__(self, db, options: WorkerOptions, out=None):
        options.check()
        self.db, self.options = db, options
        self.out = out or sys.stdout
        self.heartbeat_s = options.heartbeat_s or options.lease_s / 3
        root = options.run_root or os.environ.get("MPIPE_RUN_ROOT") or default_run_root(db.url)
        self.run_root = Path(root)
        self.backends = options.backends or available_backends()
        self.stopping: str | None = None  # why the worker stops (a signal name)
        self._wake = threading.Event()
        self._active: list[RunSupervisor] = []
        self._lock = threading.RLock()  # log() may run in a signal handler on the same thread

    def log(self, message: str) -> None:
        with self._lock:
            self.out.write(f"[worker {self.options.worker_id}] {message}\n")
            self.out.flush()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, reason: str) -> None:
        """Ask the worker to stop: its runs are stopped and marked, then serve() returns."""
        if self.stopping is None:
            self.stopping = reason
            self.log(f"{reason}: stopping {len(self._active)} run(s)")
        self._wake.set()

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, _frame: self.stop(signal.Signals(signum).name))
        return previous

    def serve(self) -> int:
        """Claim and run until stopped (or, with `once`, until the claimed runs end)."""
        from storage import claim_next_run, expire_leases

        self.run_root.mkdir(parents=True, exist_ok=True)
        previous = self._install_signals()
        self.log(f"serving {self.db.display_url} (backends {', '.join(self.backends)}, "
                 f"max parallel {self.options.max_parallel}, launcher {self._launcher_name()})")
        claimed_once = False
        self.sweep_run_dirs()
        try:
            while self.stopping is None:
                self._active = [s for s in self._active if s.is_alive()]
                if not (self.options.once and claimed_once):
                    free = self.options.max_parallel - len(self._active)
                    if free > 0:
                        try:
                            expired = expire_leases(self.db)
                            if expired:
                                self.log(f"leases expired: runs {expired}")
                                self.sweep_run_dirs()
                            for _ in range(free):
                                claimed = claim_next_run(self.db, self.options.worker_id,
                                                         self.options.lease_s, self.backends)
                                if claimed is None:
                                    break
                                supervisor = RunSupervisor(self, claimed)
                                self._active.append(supervisor)
                                supervisor.start()
                        except Exception as error:  # noqa: BLE001 - database locked or away: try later
                            self.log(f"cannot claim now: {getattr(error, 'message', None) or error}")
                    claimed_once = True
                if self.options.once and not self._active:
                    break
                self._wake.wait(self.options.poll_s)
                self._wake.clear()
        finally:
            for supervisor in self._active:
                supervisor.join()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.log("stopped" if self.stopping else "done")
        return 0

    def sweep_run_dirs(self) -> list[str]:
        """Remove run directories left by killed workers: those of an attempt that
        died (its run lost or requeued, or retried since).  A directory of a run
        going on another worker sharing this run root is never touched, nor one
        a worker kept on purpose (`--keep-run-dirs`) for a run it finished."""
        import re
        import shutil

        from storage import get_run
        from storage.errors import NotFoundError

        if self.options.keep_run_dirs or not self.run_root.is_dir():
            return []
        mine = {s.claimed.id for s in self._active}
        removed = []
        for path in self.run_root.iterdir():
            match = re.fullmatch(r"run-(\d+)-a(\d+)-[0-9a-f]{8}", path.name)
            if not match or not path.is_dir() or int(match[1]) in mine:
                continue
            try:
                run = get_run(self.db, int(match[1]))
            except NotFoundError:
                run = None
            # A dead attempt: its run lost or requeued, or another attempt since.
            if run is None or run.status in ("lost", "queued") or run.attempts != int(match[2]):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        if removed:
            self.log(f"removed {len(removed)} run director{'y' if len(removed) == 1 else 'ies'} of attempts "
                     f"that are over: {', '.join(removed)}")
        return removed

    def _launcher_name(self) -> str:
        return "local torchrun --standalone" if self.options.launcher == "local" else "template"


class RunSupervisor(threading.Thread):
    """One run from claim to finish, in a thread of its own."""

    def __init__(self, worker: QueueWorker, claimed):
        super().__init__(name=f"run-{claimed.id}", daemon=True)
        self.worker, self.claimed = worker, claimed
        self.db = worker.db
        self.stop_kind: str | None = None  # cancelled | timeout | shutdown | lost
        self.stop_reason = ""
        self.pending_rows: list[dict] = []
        self.inserted = 0
        self.reader = None
        self.summary: list[str] = []

    # ---------------------------------------------------------------- the thread
    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # noqa: BLE001 - whatever happens, the run is marked
            detail = traceback.format_exc()
            self.worker.log(f"run {self.claimed.id}: worker error {type(error).__name__}: {error}")
            self._finish("failed", error=f"worker error: {type(error).__name__}: {error}", log=detail)
        finally:
            self.worker.wake()

    def _run(self) -> None:
        from mpipe_core.runs.model_registry import load_registry

        from ..timing_stream import StepReader
        from .launch import TORCHRUN_STOP_WAIT_S, LaunchOptions, launch, torchrun_command, worker_args
        from .run_setup import prepare_run

        if not TORCHRUN_GRACE_S < TORCHRUN_STOP_WAIT_S:
            raise WorkerError(f"the parent guard's grace ({TORCHRUN_GRACE_S} s) must be below the launcher's "
                              f"wait for torchrun ({TORCHRUN_STOP_WAIT_S} s)")

        c, w = self.claimed, self.worker
        w.log(f"run {c.id}: claimed {c.schedule}@{c.version} ({c.term}) on {c.nproc} x {c.backend}, "
              f"{c.steps} step(s), attempt {c.attempt}")
        try:
            prep = prepare_run(c, load_registry(w.options.models))  # read again: edits apply at once
        except MpipeError as error:
            w.log(f"run {c.id}: cannot launch: {error.message}")
            self._finish("failed", error=f"cannot launch: {error.message}")
            return
        if w.stopping:
            self._release()
            return
        launcher = w.options.launcher
        spec = prep.spec
        if launcher == "local" and spec.nnodes > 1:
            self._finish("failed", error=f"the run asks for {spec.nnodes} nodes but this worker's launcher "
                                         "is local (one node); start a worker with a --launcher template")
            return
        token = f"mpipe-run{c.id}-{uuid.uuid4().hex[:8]}"
        run_dir = w.run_root / f"run-{c.id}-a{c.attempt}-{token[-8:]}"
        run_dir.mkdir(parents=True)
        opts = LaunchOptions(nproc=prep.nproc_per_node, backend=spec.backend, stall_s=spec.stall_s,
                             startup_s=spec.startup_s, nnodes=spec.nnodes, run_dir=str(run_dir),
                             run_id=token, watch_pids=launcher == "local")
        # Should this worker die, the guard stops torchrun and, after a short grace, kills every
        # process the run started (ranks in sessions of their own included).
        guard = [opts.python, "-m", "executor.service.parent_guard", "--grace", str(TORCHRUN_GRACE_S),
                 str(os.getpid())]
        jobs_path = run_dir / "jobs.json"
        if launcher == "local":
            opts.command = guard + torchrun_command(opts, jobs_path, run_dir, token)
        else:
            port = free_port(w.options.rdzv_host)
            fields = {
                "nnodes": spec.nnodes, "nproc_per_node": prep.nproc_per_node, "nproc": prep.world,
                "rdzv": f"{w.options.rdzv_host}:{port}", "rdzv_host": w.options.rdzv_host,
                "rdzv_port": port, "rdzv_id": token, "run_id": c.id, "run_dir": run_dir,
                "backend": spec.backend, "python": opts.python,
                "torchrun": [opts.python, "-m", "torch.distributed.run"],
                "entry": worker_args(opts, jobs_path, run_dir, token),
            }
            opts.command = guard + fill_template(launcher, fields)
        self.reader = StepReader(run_dir, prep.world)
        self.started = time.monotonic()
        self.last_beat = time.monotonic()
        self.last_read = 0.0
        self.prep = prep
        if not self._beat():  # preparing may have taken a while: renew before launching
            self._finish_stopped(None, run_dir)
            return
        results, failure = [], None
        try:
            results = launch([prep.job], opts, should_stop=self._tick)
        except RunFailed as error:
            failure = error
            results = error.results
        self._stream(final=True)
        elapsed = time.monotonic() - self.started
        self.summary.append(self.reader.stats.summary())
        self.summary.append(f"ran {elapsed:.1f} s on {spec.nnodes} node(s) x {prep.nproc_per_node} rank(s)")
        from .run_setup import what_ran

        self.summary += what_ran(prep)  # which model, on what, and what of the workload's layout was dropped
        if failure is not None and self.stop_kind is not None:
            self._finish_stopped(failure, run_dir)
        elif failure is not None:
            w.log(f"run {c.id}: failed: {failure.message}")
            self._finish("failed", exit_code=failure.exit_code, error=failure.message,
                         log=_log_tail(run_dir))
        else:
            result = results[0] if results else None
            spans = result.makespan if result is not None else []
            if spans:
                self.summary.append("measured makespan per step (ms): "
                                    + " ".join(f"{s * 1000:.1f}" for s in spans))
            if result is not None and result.plans is not None:  # a data run: the plan each step ran
                from .data_run import plan_line

                self.summary += [f"step {p['step']}: {plan_line(p)}" for p in result.plans]
            check = result.grad_check if result is not None else None
            if check is not None:
                from executor.runtime.gradient_agreement import verdict_line

                self.summary.append(verdict_line(check))
            memory = result.memory if result is not None else None
            if memory:
                self.summary.append("measured memory per rank (bytes): " + "; ".join(
                    f"rank {m['rank']} activation peak {m['activation_peak']:,} ({m['activation_peak_op']}), "
                    f"static {m['static']:,}" for m in memory))
                built = build_memory_line(memory)
                if built is not None:
                    self.summary.append(built)
            if check is not None and not check["ok"]:
                self._finish("failed", exit_code=0, error=grad_check_failure(check), log=_log_tail(run_dir),
                             memory=memory)
            else:
                w.log(f"run {c.id}: succeeded in {elapsed:.1f} s; {self.reader.stats.summary()}")
                self._finish("succeeded", exit_code=0, log=_log_tail(run_dir), memory=memory,
                             step_plans=result.plans if result is not None else None)
        if not w.options.keep_run_dirs:
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)

    # ---------------------------------------------------------------- while it runs
    def _tick(self) -> str | None:
        """Called by the launcher's watch loop about every 50 ms."""
        now = time.monotonic()
        if now - self.last_read >= STREAM_INTERVAL_S:
            self.last_read = now
            self._stream()
        if now - self.last_beat >= self.worker.heartbeat_s:
            self.last_beat = now
            if not self._beat():
                return self.stop_reason
        if self.stop_kind is None and now - self.started > self.prep.spec.timeout_s:
            self.stop_kind = "timeout"
            self.stop_reason = (f"timed out: still running after {self.prep.spec.timeout_s:g} s "
                                "(run option timeout_s); stopped")
        if self.stop_kind is None and self.worker.stopping:
            self.stop_kind = "shutdown"
            self.stop_reason = (f"worker {self.worker.options.worker_id} shut down "
                                f"({self.worker.stopping}) while the run was going; stopped")
        return self.stop_reason or None

    def _beat(self) -> bool:
        """Renew the lease; False (and a stop reason) once the run must stop."""
        from storage import heartbeat
        from storage.errors import LeaseLostError

        try:
            cancel = heartbeat(self.db, self.claimed.id, self.worker.options.worker_id,
                               self.worker.options.lease_s)
        except LeaseLostError as error:
            self.stop_kind, self.stop_reason = "lost", f"lease lost: {error.message}"
            return False
        except Exception as error:  # noqa: BLE001 - database away: try again next beat
            self.worker.log(f"run {self.claimed.id}: heartbeat failed ({type(error).__name__}: {error}); "
                            "will retry")
            return True
        if cancel and self.stop_kind is None:
            self.stop_kind, self.stop_reason = "cancelled", "cancelled on request; stopped"
            return False
        return True

    def _stream(self, final: bool = False) -> None:
        from storage import add_timings
        from storage.errors import LeaseLostError

        self.pending_rows += self.reader.poll(final=final)
        if not self.pending_rows or self.stop_kind == "lost":
            return
        tries = 5 if final else 1
        for attempt in range(tries):
            try:
                add_timings(self.db, self.claimed.id, self.pending_rows,
                            worker_id=self.worker.options.worker_id, attempt=self.claimed.attempt)
            except LeaseLostError as error:  # the run is someone else's now: its rows would mislead
                self.worker.log(f"run {self.claimed.id}: {len(self.pending_rows)} timing rows refused: "
                                f"{error.message}")
                self.stop_kind, self.stop_reason = "lost", f"lease lost: {error.message}"
                self.pending_rows = []
                return
            except Exception as error:  # noqa: BLE001 - keep the rows, try again
                if attempt == tries - 1:
                    self.worker.log(f"run {self.claimed.id}: could not store {len(self.pending_rows)} timing "
                                    f"rows yet ({type(error).__name__}: {error})")
                    return
                time.sleep(0.5)
                continue
            self.inserted += len(self.pending_rows)
            self.pending_rows = []
            self.reader.committed()
            return

    # ---------------------------------------------------------------- the end
    def _finish_stopped(self, failure, run_dir: Path) -> None:
        c, w = self.claimed, self.worker
        log = _log_tail(run_dir)
        if self.stop_kind == "lost":
            w.log(f"run {c.id}: {self.stop_reason}; another worker or expire_leases owns its fate now")
            return
        if self.stop_kind == "shutdown":
            self._release()
            return
        w.log(f"run {c.id}: {self.stop_reason}")
        status = "cancelled" if self.stop_kind == "cancelled" else "failed"
        self._finish(status, exit_code=None if failure is None else failure.exit_code,
                     error=self.stop_reason, log=log)

    def _release(self) -> None:
        """Hand the run back to the queue: the worker shuts down, the run is not at fault."""
        from storage import release_run
        from storage.errors import LeaseLostError

        reason = f"worker {self.worker.options.worker_id} shut down ({self.worker.stopping})"
        try:
            release_run(self.db, self.claimed.id, self.worker.options.worker_id, reason=self.worker.stopping)
        except LeaseLostError as lost:
            self.worker.log(f"run {self.claimed.id}: could not release it: {lost.message}")
            return
        self.worker.log(f"run {self.claimed.id}: {reason}; released back to the queue")

    def _finish(self, status: str, *, exit_code: int | None = None, error: str | None = None,
                log: str = "", memory: list | None = None, step_plans: list | None = None) -> None:
        from storage import finish_run
        from storage.errors import LeaseLostError

        tail = log
        if self.summary:
            tail = (tail.rstrip("\n") + "\n" if tail else "") + "--- worker ---\n" + "\n".join(self.summary) + "\n"
        for attempt in range(6):
            try:
                finish_run(self.db, self.claimed.id, self.worker.options.worker_id, status,
                           exit_code=exit_code, error=error, log_tail=tail or None, memory=memory,
                           step_plans=step_plans)
                return
            except LeaseLostError as lost:
                self.worker.log(f"run {self.claimed.id}: could not record '{status}': {lost.message}")
                return
            except Exception as problem:  # noqa: BLE001 - database busy or away: retry a little
                if attempt == 5:
                    self.worker.log(f"run {self.claimed.id}: could not record '{status}': {problem}")
                    return
                time.sleep(0.5 * (attempt + 1))


def grad_check_failure(check: dict) -> str:
    """A failed gradient check as a run's error: the run completed, its gradients
    differ; the worst tensor, then the first failures of the first failing step,
    each naming its parameter, rank and worst element."""
    from executor.runtime.gradient_agreement import worst_line
    from storage.runs import GRADIENTS_DIFFER

    step, failures = next(((i, s["failures"]) for i, s in enumerate(check.get("steps", [])) if s["failures"]),
                          (0, []))
    head = f"{GRADIENTS_DIFFER}: worst tensor {worst_line(check.get('worst'))}"
    return head + "".join(f"; step {step}: {line}" for line in failures[:3])


def _log_tail(run_dir: Path) -> str:
    path = Path(run_dir) / "torchrun.log"
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - LOG_TAIL_BYTES))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
