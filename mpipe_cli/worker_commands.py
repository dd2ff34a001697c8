"""`mpipe worker`, `mpipe calibrate`, `mpipe compare-run`: the run queue's
worker, and what the measured timings of a run say about the simulator.

Every command takes `--db URL` (default: $MPIPE_DB_URL, else the per-user
SQLite file).  torch is imported only by `mpipe worker`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .arg_types import add_db_argument, int_in, number_in, parallel_spec
from .storage_commands import RUN_ID, add_models_argument

POSITIVE_SECONDS = number_in(0, 1e7, lo_open=True)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "worker", help="run queued runs from the database (torchrun), streaming their timings back",
        description="Claim queued runs, launch each with torchrun (or a cluster launcher), keep the lease "
                    "alive, stream per-op timings into the database while it runs, record the outcome. "
                    "SIGTERM/SIGINT stop the runs in progress and hand them back to the queue. The model "
                    "allow-list (--models) is read again at every claim: a run whose model it and the installed "
                    "mpipe.models entry points do not register is failed before anything it names is imported.")
    add_db_argument(p)
    p.add_argument("--once", action="store_true",
                   help="claim up to --max-parallel queued runs once, finish them and exit")
    p.add_argument("--max-parallel", type=int_in(1, 1024), default=1, metavar="N", help="runs at the same time (default 1)")
    p.add_argument("--launcher", default=os.environ.get("MPIPE_LAUNCHER", "local"), metavar="local|TEMPLATE",
                   help="'local' (torchrun --standalone, the default; or $MPIPE_LAUNCHER) or a command "
                        "template with {nnodes} {nproc_per_node} {rdzv} {rdzv_id} {run_id} {run_dir} "
                        "{torchrun} {entry} ..., e.g. \"srun -N {nnodes} {torchrun} --nnodes {nnodes} "
                        "--nproc-per-node {nproc_per_node} --rdzv-backend c10d --rdzv-endpoint {rdzv} "
                        "--rdzv-id {rdzv_id} {entry}\"")
    p.add_argument("--lease", type=POSITIVE_SECONDS, default=30.0, metavar="S",
                   help="lease length in seconds; a worker silent this long loses its runs (default 30)")
    p.add_argument("--heartbeat", type=POSITIVE_SECONDS, default=None, metavar="S", help="default: a third of the lease")
    p.add_argument("--poll", type=POSITIVE_SECONDS, default=1.0, metavar="S", help="queue poll interval when idle")
    p.add_argument("--run-root", default=None, metavar="DIR",
                   help="where run directories go (default $MPIPE_RUN_ROOT, else mpipe-runs/<database> in the "
                        "temp dir: a worker removes the directories of attempts its database says are over, so "
                        "give each database its own); must be shared by every node for a multi-node launcher")
    p.add_argument("--rdzv-host", default="127.0.0.1",
                   help="host of the c10d rendezvous for {rdzv} (default 127.0.0.1)")
    p.add_argument("--backend", action="append", default=None, choices=["gloo", "nccl", "hccl"],
                   help="serve only runs of this backend (repeatable; default: those this machine has)")
    p.add_argument("--worker-id", default=None, help="default HOST:PID")
    p.add_argument("--keep-run-dirs", action="store_true", help="keep each run's directory (logs, timings)")
    add_models_argument(p)
    p.set_defaults(handler=cmd_worker)

    p = subparsers.add_parser(
        "calibrate", help="fit per-op costs from a run's measured timings into a workload, or a device's "
                          "efficiencies from a run, a layer profile or a training log",
        description="Fit per-op costs (LLM per chunk and kind, encoder per microbatch) from a run's "
                    "timings into an explicit workload in milliseconds, and report how well the "
                    "simulator then predicts the measured makespan.  With --device, fit the device's "
                    "efficiencies of an analytic workload to the run instead (or, with --layer-profile "
                    "FILE, to a layer profile's per-layer times); with --log FILE (no RUN), fit the "
                    "device's gemm_efficiency so that --term on --workload takes the median step time of "
                    "the log's iteration lines (Megatron-LM, MindSpeed, MindSpeed-MM FSDP, torchtitan), "
                    "the attention, HBM, memory-bound and flash fractions kept as the workload states "
                    "them (docs/cluster.md).")
    add_db_argument(p)
    p.add_argument("run", type=RUN_ID, metavar="RUN", nargs="?", default=None,
                   help="the run whose timings are fitted (not with --log or --layer-profile)")
    p.add_argument("--log", default=None, metavar="FILE",
                   help="a training log whose iteration lines give the step time (instead of RUN)")
    p.add_argument("--term", default=None, help="with --log: the schedule the job ran, e.g. '1f1b(p=4, m=8)'")
    p.add_argument("--parallel", type=parallel_spec, default=None, metavar="KEY=VALUE,...",
                   help="with --log: the job's layout, set in the workload's parallel section (tp=2,dp=4,...)")
    p.add_argument("--skip", type=int_in(0, 10**9), default=1, metavar="N",
                   help="with --log: warm-up iteration lines left out (default 1; MindSpeed's examples use 100)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--output", "-o", default=None, metavar="FILE", help="write the workload as JSON")
    out.add_argument("--save", default=None, metavar="NAME", help="save it in the library as workload NAME")
    p.add_argument("--update", action="store_true", help="with --save: add a version to workload NAME")
    p.add_argument("--statistic", choices=("mean", "median"), default="mean",
                   help="fit the mean (default) or the median of the op times and gaps; the median is not "
                        "moved by a burst of background load")
    p.add_argument("--device", action="store_true",
                   help="fit the device's achieved fractions (gemm_efficiency, and memory_efficiency where the run "
                        "tells it) of an analytic workload on a cluster instead of per-op costs; writes the "
                        "workload with the device overridden (docs/cluster.md)")
    p.add_argument("--layer-profile", default=None, metavar="FILE",
                   help="with --device: fit gemm_efficiency, attention_efficiency and memory_efficiency to a "
                        "layer profile (per-layer forward/backward ms at a stated shape and parallel setting, "
                        "JSON; e.g. examples/layer-profiles/korthikanti2022-table4.json) instead of a run; "
                        "-o/--save then need -w, the workload that takes the fitted device")
    p.add_argument("--workload", "-w", default=None,
                   help="with --device: the analytic workload the run is matched against (saved:NAME[@N], "
                        "preset or file; default: the workload the run was launched or imported with); "
                        "with --log: the job's analytic workload (required)")
    p.add_argument("--json", action="store_true", help="JSON on stdout (fit, error and workload)")
    p.set_defaults(handler=cmd_calibrate)

    p = subparsers.add_parser(
        "compare-run", help="a run's measured timeline vs the simulator's prediction, or vs another run",
        description="Measured vs predicted (or run vs run) makespan, per-device busy/idle, and the ops "
                    "whose measured time differs most.  The prediction uses the workload calibrated from "
                    "this run unless --workload names another (e.g. saved:NAME from `mpipe calibrate`).")
    add_db_argument(p)
    p.add_argument("run", type=RUN_ID, metavar="RUN")
    p.add_argument("--against", default=None, metavar="TERM|RUN",
                   help="a term to simulate, or another run's id (default: this run's own term)")
    p.add_argument("--workload", "-w", default=None,
                   help="workload of the prediction: saved:NAME[@N], preset or file "
                        "(default: calibrated from this run)")
    p.add_argument("--top", type=int_in(0, 100_000), default=10, help="how many differing ops to list")
    p.add_argument("--explain", action="store_true",
                   help="split the gap to the prediction by cause (op times, transfer waits, dispatch, "
                        "step start) along the measured critical path")
    p.add_argument("--contention", type=number_in(0, 100), default=None, metavar="C",
                   help="calibrate on a host whose busy ranks slow each other down by C "
                        "(1 + C per other busy rank; see `python -m executor.runtime.contention_probe`)")
    p.add_argument("--statistic", choices=("mean", "median"), default="mean",
                   help="reduce the measured steps and op times (and fit the calibration) by the mean "
                        "(default) or the median")
    p.add_argument("--json", action="store_true", help="JSON on stdout (with both timelines)")
    p.set_defaults(handler=cmd_compare_run)


def cmd_worker(args) -> int:
    from executor.service.queue_worker import QueueWorker, WorkerOptions
    from storage import open_database

    options = WorkerOptions(max_parallel=args.max_parallel, launcher=args.launcher, lease_s=args.lease,
                            heartbeat_s=args.heartbeat, poll_s=args.poll, run_root=args.run_root,
                            rdzv_host=args.rdzv_host, keep_run_dirs=args.keep_run_dirs, once=args.once,
                            backends=tuple(args.backend) if args.backend else None, models=args.models)
    if args.worker_id is not None:
        from storage.runs import check_worker_id

        options.worker_id = check_worker_id(args.worker_id)
    options.check()  # before opening anything
    return QueueWorker(open_database(args.db), options).serve()


def cmd_calibrate(args) -> int:
    from executor.analysis.calibrate import calibrate_run
    from storage import open_database

    from .output import check_writable

    _check_calibrate_arguments(args)
    if args.output:
        check_writable(args.output)
    if args.save:
        from storage.library import check_name

        check_name(args.save, "workload")
    if args.log is not None:
        return _calibrate_log(args)
    from mpipe_core.errors import MpipeError

    if args.workload is not None and not args.device:
        raise MpipeError("--workload applies to --device (per-op costs are fitted on the run's own workload)")
    if args.layer_profile is not None:
        if not args.device:
            raise MpipeError("--layer-profile applies to --device (it fits the device's efficiencies)")
        if args.run is not None:
            raise MpipeError(f"calibrate: give a RUN or --layer-profile, not both (got run {args.run})")
        if (args.output or args.save) and args.workload is None:
            raise MpipeError("calibrate --layer-profile: -o/--save write a workload with the fitted device; "
                             "name it with -w WORKLOAD")
        return _calibrate_layer_profile(args)
    db = open_database(args.db)
    if args.device:
        return _calibrate_device(db, args)
    cal = calibrate_run(db, args.run, name=args.save, statistic=args.statistic)
    return _write_calibrated(db, args, cal, cal.workload,
                             f"calibrated from run {args.run}: predicted {cal.predicted_ms:.2f} ms vs "
                             f"measured {cal.measured_ms:.2f} ms ({cal.error:+.1%})",
                             "the calibrated workload", "predict")


def _check_calibrate_arguments(args) -> None:
    from mpipe_core.errors import MpipeError

    if args.log is None:
        if args.run is None and args.layer_profile is None:
            raise MpipeError("calibrate needs a RUN (its stored timings), --log FILE (a training log) or "
                             "--device --layer-profile FILE (a layer profile)")
        for flag, value in (("--term", args.term), ("--parallel", args.parallel)):
            if value is not None:
                raise MpipeError(f"{flag} applies to --log (a run states its own term and layout)")
        if args.skip != 1:
            raise MpipeError("--skip applies to --log (a run's warm-up step is left out by itself)")
        return
    if args.run is not None:
        raise MpipeError("give a RUN or --log FILE, not both")
    if args.layer_profile is not None:
        raise MpipeError("give --log FILE or --layer-profile FILE, not both")
    if args.device:
        raise MpipeError("--device fits a run's ops; --log fits the device from the log's step times: give one")
    if args.statistic != "mean":
        raise MpipeError("--statistic applies to a RUN: --log always fits the median of the steady lines")
    if args.workload is None:
        raise MpipeError("calibrate --log needs --workload (-w): the job's analytic workload")
    if args.term is None:
        raise MpipeError("calibrate --log needs --term: the pipeline schedule the job ran")


def _calibrate_log(args) -> int:
    """`calibrate --log`: the device's gemm_efficiency fitted to a training log's steady step time."""
    from executor.analysis.log_fit import fit_log, read_log
    from mpipe_core.algebra.terms import parse

    from .core_commands import load_workload_arg

    parse(args.term)  # a bad term is reported before the log is read
    wl = load_workload_arg(argparse.Namespace(workload=args.workload, parallel=args.parallel, db=args.db))
    log = read_log(args.log)
    fit = fit_log(log, wl.source, args.term, skip=args.skip, name=args.log)
    db = None
    if args.save:
        from storage import open_database

        db = open_database(args.db)
    return _write_calibrated(db, args, fit, fit.workload,
                             f"device fitted from log {args.log}: gemm_efficiency {fit.fitted:.4g}",
                             "the workload with the fitted device", "evaluate")


def _calibrate_device(db, args) -> int:
    """`calibrate --device`: the device's fractions fitted, the workload written or saved."""
    from executor.analysis.device_fit import fit_device, load_for_device

    doc = None
    if args.workload is not None:
        from .core_commands import load_workload_arg

        wl = load_workload_arg(argparse.Namespace(workload=args.workload, parallel=None, db=args.db))
        doc = wl.source
    measured, doc = load_for_device(db, args.run, doc)
    fit = fit_device(measured, doc, run_id=args.run)
    return _write_calibrated(db, args, fit, fit.workload,
                             f"device fitted from run {args.run}: "
                             + ", ".join(f"{k} {v:.4g}" for k, v in fit.fitted.items()),
                             "the workload with the fitted device", "evaluate")


def _calibrate_layer_profile(args) -> int:
    """`calibrate --device --layer-profile FILE`: the device fitted to a layer profile, and (with -w)
    the workload written or saved with it."""
    import datetime
    from pathlib import Path

    from executor.analysis.layer_fit import fit_layer_profile
    from mpipe_core.errors import MpipeError
    from mpipe_core.workloads.layer_profile import load_profile

    fit = fit_layer_profile(load_profile(args.layer_profile))
    workload: dict = {}
    db = None
    if args.workload is not None:
        from .core_commands import load_workload_arg

        wl = load_workload_arg(argparse.Namespace(workload=args.workload, parallel=None, db=args.db))
        if not isinstance(wl.source, dict) or "model" not in wl.source:
            raise MpipeError("calibrate --layer-profile -w: expected an analytic workload (a model and a device)")
        # where the figures came from, which every step time computed on them names (device_source)
        calibration = {"from": "layer profile", "profile": Path(args.layer_profile).name, "cells": len(fit.cells),
                       "date": datetime.date.today().isoformat()}
        workload = {**wl.source, "device": {**fit.device_section, "calibration": calibration}}
    if args.save:
        from storage import open_database

        db = open_database(args.db)
    return _write_calibrated(db, args, fit, workload,
                             f"device fitted from layer profile {args.layer_profile}: "
                             + ", ".join(f"{k} {v:.4g}" for k, v in fit.fitted.items()),
                             "the workload with the fitted device", "evaluate")


def _write_calibrated(db, args, result, workload: dict, message: str, what: str, verb: str) -> int:
    """What both calibrations end with: the workload written (-o) or saved (--save), then the
    result as JSON or as its report."""
    from .output import write_output

    saved = None
    if args.output:
        write_output(json.dumps(workload, indent=2) + "\n", args.output, what)
    elif args.save:
        from storage import save_workload

        saved = save_workload(db, args.save, workload, update=args.update, action="calibrate", run_id=args.run,
                              message=message)
    if args.json:
        doc = result.as_dict()
        if saved is not None:
            doc["saved"] = saved.ref
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(result.format_report() if hasattr(result, "format_report") else result.format())
    if args.output:
        print(f"\nwrote {what} to {args.output}")
    elif saved is not None:
        print(f"\nsaved workload {saved.ref}; {verb} with --workload saved:{saved.name}")
    return 0


def cmd_compare_run(args) -> int:
    from executor.analysis.compare_run import compare_run
    from storage import open_database

    if args.against is not None and not args.against.strip().isdigit():
        from mpipe_core.algebra.terms import parse

        parse(args.against)  # a bad term is reported before any database work
    from executor.analysis.summary_compare import compare_summary
    from storage import timing_count
    from storage.step_figures import has_step_figures

    db = open_database(args.db)
    summary = None
    if has_step_figures(db, args.run):
        against = None if args.against is None or args.against.strip().isdigit() else args.against
        summary = compare_summary(db, args.run, against, workload=args.workload)
        if timing_count(db, args.run) == 0:  # a run summary alone: its table is the comparison
            for flag, given in (("--explain", args.explain), ("--contention", args.contention is not None)):
                if given:
                    from mpipe_core.errors import MpipeError

                    raise MpipeError(f"{flag} needs op timings; run {args.run} is a step summary only")
            if args.json:
                json.dump({"step_summary": summary.as_dict()}, sys.stdout, indent=2)
                sys.stdout.write("\n")
                return 0
            print(summary.format())
            return 0
    cmp = compare_run(db, args.run, args.against, workload=args.workload, top=args.top,
                      explain=args.explain, contention=args.contention, statistic=args.statistic)
    if args.json:
        doc = cmp.as_dict()
        if summary is not None:
            doc["step_summary"] = summary.as_dict()
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(cmp.format())
    if summary is not None:
        print("")
        print(summary.format())
    return 0
