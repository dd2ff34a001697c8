"""`mpipe import-trace`: another stack's run (per-rank profiler traces, or
Megatron's simulator output) stored as a run record (`storage.imported_runs`)."""
from __future__ import annotations

import json
import sys

from .arg_types import add_db_argument
from .storage_commands import _plain


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import-trace", help="store per-rank profiler traces (or Megatron's simulator output) as a run",
        description="Read per-rank Chrome/Kineto traces (torch.profiler, torchtitan's "
                    "iteration_N/rank{R}_trace.json; .json or .json.gz, files or folders) or Megatron's "
                    "task_durations.json + pp_task_orders.json, or an Ascend job's *_ascend_pt / *_ascend_ms "
                    "profiler folders (trace_view.json, step_trace_time.csv) and msprof-analyze's "
                    "cluster_step_trace_time.csv, and store them as a run: `runs show`, "
                    "`compare-run`, `calibrate` and the app then treat it as any run.  The rules (which "
                    "ranges are ops, when an op starts, clocks, steps): docs/trace-import.md.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="trace files or folders (a folder of Ascend *_ascend_pt / *_ascend_ms profiler folders "
                        "too), or step summaries alone: step_trace_time.csv files, msprof-analyze's "
                        "cluster_step_trace_time.csv (a run summary; --term required)")
    p.add_argument("--label-pattern", default=None, metavar="REGEX",
                   help="read other ranges as ops: a regex with named groups kind and microbatch "
                        "(optional chunk, module), e.g. 'fwd_mb(?P<microbatch>\\d+)_(?P<kind>F)'; "
                        "mpipe:<module>:<kind>:<microbatch>[:<chunk>] labels are always read")
    p.add_argument("--term", default=None,
                   help="the schedule that ran (default: inferred from the ranks' op orders); checked "
                        "against the traces")
    p.add_argument("--workload", "-w", default=None,
                   help="workload to store the schedule with: saved:NAME[@N], preset or file "
                        "(default: unit costs, with the encoders the traces timed)")
    p.add_argument("--name", default=None,
                   help="schedule name the run is filed under (default imported-<digest>)")
    p.add_argument("--align-on", default=None, metavar="EVENT",
                   help="put the ranks on one clock by the end of the first event of this name "
                        "(a barrier or collective) instead of the recorded timestamps")
    p.add_argument("--layout", default=None, metavar="tp=N,dp=N,pp=N",
                   help="the files' ranks are global ranks of this world (any of tp, cp, dp, pp: tp and cp "
                        "left out are 1, the one of dp and pp left out is the rest of the world size); the "
                        "lowest rank's pipeline is kept, other pipelines' files are ignored with a note "
                        "(default: the workload's parallel section); docs/trace-import.md")
    p.add_argument("--order", default=None, metavar="tp-cp-dp-pp",
                   help="the rank order of --layout, fastest-varying first (Megatron's default tp-cp-dp-pp)")
    add_db_argument(p)
    p.add_argument("--json", action="store_true", help="one JSON object: id, ops per rank, steps, ...")
    p.set_defaults(handler=cmd_import_trace)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_import_trace(args) -> int:
    from mpipe_core.formats.label_pattern import LabelPattern
    from storage import open_database
    from storage.imported_runs import import_traces, is_step_summary_import, world_layout

    if args.label_pattern is not None:
        LabelPattern(args.label_pattern)  # a bad pattern is refused before any file is read
    if args.layout is not None:
        world_layout(args.layout, args.order, None)  # so are a bad layout and order
    if args.term is not None:
        from mpipe_core.algebra.terms import parse

        parse(args.term)
    db = open_database(args.db)
    if is_step_summary_import(args.paths):
        return _import_summary(db, args)
    run, trace, inferred = import_traces(db, args.paths, term=args.term, workload=args.workload, name=args.name,
                                         label_pattern=args.label_pattern, align_on=args.align_on,
                                         layout=args.layout, order=args.order, progress=_progress)
    doc = {"id": run.id, "schedule": run.ref, "term": run_term(db, run), "term_inferred": inferred,
           "source": run.source, "digest": trace.digest, **trace.summary()}
    if args.json:
        json.dump(_plain(doc), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"imported run {run.id}: {doc['term']} ({'inferred' if inferred else 'given'}) as {run.ref}, "
          f"{trace.ranks} ranks, {len(trace.steps)} step(s)")
    print(f"ops per rank {trace.ops_per_rank}; transfers per rank {trace.transfers}; "
          + (("device time (Ascend Hardware kernels)" if trace.device_side else
              "host ranges (no Ascend Hardware lane)") if trace.format == "ascend" else
             "device-side ranges" if trace.device_side else "CPU ranges (op = first child op .. end)"))
    print(f"clock: {trace.clock}")
    if trace.comm:
        kinds = sorted({k for per in trace.comm_counts() for k in per})
        print("communication rows per rank: " + "; ".join(
            f"{k} {[per.get(k, 0) for per in trace.comm_counts()]}" for k in kinds))
    for note in trace.notes:
        print(f"note: {note}")
    print(f"next: mpipe compare-run {run.id} --explain; mpipe calibrate {run.id}")
    return 0


STAGE_FIGURES = ("computing", "comm_not_overlapped", "overlapped", "communication", "free", "stage", "bubble",
                 "comm_exclude_receive", "preparing")


def _import_summary(db, args) -> int:
    """step_trace_time.csv / cluster_step_trace_time.csv given alone: a run summary."""
    from storage.imported_runs import import_step_summary

    for flag, value in (("--label-pattern", args.label_pattern), ("--align-on", args.align_on),
                        ("--layout", args.layout), ("--order", args.order)):
        if value is not None:
            from mpipe_core.errors import MpipeError

            raise MpipeError(f"{flag} applies to traces, not to a step summary (.csv)")
    run, summary, term = import_step_summary(db, args.paths, term=args.term, workload=args.workload,
                                             name=args.name, progress=_progress)
    stages = summary.stage_max()
    doc = {"id": run.id, "schedule": run.ref, "term": term, "term_inferred": False, "source": run.source,
           "format": summary.format, "ranks": len(summary.ranks), "steps": summary.steps,
           "stage_rows": summary.stage_rows,
           "stages_ms": [{"pp": pp, "step": step, **{f: getattr(m, f) * 1e3 for f in STAGE_FIGURES}}
                         for (pp, step), m in stages.items()]}
    if args.json:
        json.dump(_plain(doc), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"imported run {run.id}: a run summary ({summary.format}) of {len(summary.ranks)} ranks, "
          f"{len(summary.steps)} step(s), term {term} as {run.ref}")
    print("per stage, the maximum over its ranks (ms, mean over the steps):")
    header = ["pp", "computing", "comm not overlapped", "free", "bubble"]
    rows = []
    for pp in sorted({pp for pp, _ in stages}):
        mine = [m for (p, _), m in stages.items() if p == pp]
        rows.append(["-" if pp < 0 else str(pp)] + [f"{sum(getattr(m, f) for m in mine) / len(mine) * 1e3:.3f}"
                                                    for f in ("computing", "comm_not_overlapped", "free", "bubble")])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print(f"next: mpipe compare-run {run.id} --against '{term}' -w WORKLOAD; mpipe runs show {run.id} --stragglers")
    return 0


def run_term(db, run) -> str:
    from storage import get_version

    return get_version(db, run.ref).term
