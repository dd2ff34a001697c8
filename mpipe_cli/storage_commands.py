"""`mpipe library ...`, `mpipe runs ...`, `mpipe db ...`: the shared library and run records.

Every command takes `--db URL` (default: $MPIPE_DB_URL, else the per-user SQLite
file `$XDG_DATA_HOME/mpipe/mpipe.db`, i.e. `~/.local/share/mpipe/mpipe.db`).
SQLAlchemy and the storage package are imported only when one of these runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from datetime import datetime
from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.runs.run_options import BACKENDS, MAX_ATTEMPTS, MAX_PROCS, MAX_STEPS, parse_option_pairs

from .arg_types import INT64_MAX, int_in, number_in
from .core_commands import parallel_arg

RUN_ID = int_in(1, INT64_MAX)
RUN_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "lost")


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="URL", default=None,
                        help="database URL or SQLite file (default: $MPIPE_DB_URL, "
                             "else ~/.local/share/mpipe/mpipe.db)")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="JSON on stdout")

    def leaf(group, name, handler, help, json_flag=False):
        parents = [common, as_json] if json_flag else [common]
        p = group.add_parser(name, help=help, description=help, parents=parents)
        p.set_defaults(handler=handler)
        return p

    _register_library(subparsers, leaf)
    _register_runs(subparsers, leaf)

    db = subparsers.add_parser("db", help="the database itself: schema upgrade and info")
    group = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    leaf(group, "upgrade", cmd_db_upgrade, "create the database or apply pending migrations")
    leaf(group, "info", cmd_db_info, "where the database is and its schema revision", json_flag=True)


def _register_library(subparsers, leaf) -> None:
    library = subparsers.add_parser("library", help="the team's schedule library")
    group = library.add_subparsers(dest="library_command", required=True, metavar="COMMAND")

    p = leaf(group, "save", cmd_save, "save a term as a new schedule (or a new version with --update)",
             json_flag=True)
    p.add_argument("name")
    p.add_argument("term", help='e.g. "transpose(1f1b(p=4, m=8), mode=dynamic)"')
    p.add_argument("--workload", "-w", default=None,
                   help="preset name, .json/.toml file, or saved:NAME[@N] (default: uniform)")
    parallel_arg(p)
    p.add_argument("--message", "-m", default="", help="what this version changes")
    p.add_argument("--description", default=None)
    p.add_argument("--tag", "-t", action="append", default=[], help="tag it (repeatable)")
    p.add_argument("--update", action="store_true", help="add a version to the existing schedule NAME")
    p.add_argument("--author", default=None, help="default: $MPIPE_USER or the login name")

    p = leaf(group, "list", cmd_list, "list schedules (latest version of each)", json_flag=True)
    p.add_argument("--search", "-s", default=None, help="text in the name or description")
    p.add_argument("--tag", "-t", default=None)
    p.add_argument("--author", default=None)
    p.add_argument("--archived", action="store_true", help="include archived schedules")

    p = leaf(group, "show", cmd_show, "show one version (NAME for the latest, or NAME@N)", json_flag=True)
    p.add_argument("ref", metavar="NAME[@N]")

    p = leaf(group, "history", cmd_history, "every version of a schedule", json_flag=True)
    p.add_argument("name")

    p = leaf(group, "diff", cmd_diff, "compare two versions' terms and metrics", json_flag=True)
    p.add_argument("a", metavar="NAME[@N]")
    p.add_argument("b", metavar="NAME[@N]")

    p = leaf(group, "fork", cmd_fork, "copy a version into a new schedule", json_flag=True)
    p.add_argument("source", metavar="NAME[@N]")
    p.add_argument("new_name")
    p.add_argument("--description", default=None)
    p.add_argument("--message", "-m", default=None)
    p.add_argument("--author", default=None)

    p = leaf(group, "tag", cmd_tag, "add or remove tags")
    p.add_argument("name")
    p.add_argument("tags", nargs="*", metavar="TAG", help="tags to add")
    p.add_argument("--remove", "-r", action="append", default=[], metavar="TAG")

    p = leaf(group, "archive", cmd_archive, "hide a schedule from listings (its runs stay)")
    p.add_argument("name")
    p.add_argument("--restore", action="store_true", help="un-archive it")

    p = leaf(group, "export", cmd_export, "write the library (or some schedules) as JSON")
    p.add_argument("names", nargs="*", metavar="NAME", help="default: everything")
    p.add_argument("--output", "-o", default=None, help="file to write (default: stdout)")

    p = leaf(group, "import", cmd_import, "add the schedules of an exported JSON file")
    p.add_argument("file")
    p.add_argument("--rename", action="store_true",
                   help="import conflicting names as NAME-2, NAME-3, ... instead of refusing")

    p = leaf(group, "workload", cmd_workload, "save, list or show named workloads", json_flag=True)
    p.add_argument("action", choices=["save", "list", "show"])
    p.add_argument("name", nargs="?", help="save/show: NAME (show: NAME[@N])")
    p.add_argument("source", nargs="?", help="save: preset name or .json/.toml file")
    p.add_argument("--message", "-m", default="")
    p.add_argument("--description", default=None)
    p.add_argument("--update", action="store_true", help="add a version to the existing workload NAME")
    p.add_argument("--author", default=None)


def _register_runs(subparsers, leaf) -> None:
    runs = subparsers.add_parser("runs", help="queue runs of saved schedules and inspect them")
    group = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")

    p = leaf(group, "enqueue", cmd_enqueue, "queue a run of SCHEDULE[@VERSION] for a worker",
             json_flag=True)
    p.add_argument("ref", metavar="SCHEDULE[@VERSION]",
                   help="with --spec: the schedule NAME the spec is saved as (its next version if it exists)")
    p.add_argument("--spec", default=None, metavar="FILE",
                   help="a run spec (what `mpipe plan --emit mpipe -o FILE` writes): its term and workload are "
                        "saved as a version of SCHEDULE with the spec's layout, then queued on the ranks it needs")
    p.add_argument("--scale", default=None, metavar="dp=K",
                   help="with --spec: queue its layout with K data-parallel replicas (tp, cp, pp and the "
                        "schedule stay)")
    p.add_argument("--backend", choices=BACKENDS, default="gloo")
    p.add_argument("--nproc", type=int_in(1, MAX_PROCS), default=None, help="default: the schedule's device count")
    p.add_argument("--steps", type=int_in(1, MAX_STEPS), default=1)
    p.add_argument("--max-attempts", type=int_in(1, MAX_ATTEMPTS), default=1,
                   help="requeue a run whose worker died until it had this many attempts "
                        "(default 1: mark it lost)")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="extra option for the executor (repeatable; VALUE parsed as JSON if it can be); "
                        "model= must be registered (see `mpipe models`), a preset, hf:llava, hf:qwen2_5_vl "
                        "or hf:/path under the checkpoint root")
    add_models_argument(p)

    p = leaf(group, "list", cmd_runs_list, "runs, newest first", json_flag=True)
    p.add_argument("--status", choices=RUN_STATUSES, default=None)
    p.add_argument("--schedule", default=None)
    p.add_argument("--limit", type=int_in(1, 100_000), default=50)

    p = leaf(group, "show", cmd_runs_show, "one run: status history, error, log tail", json_flag=True)
    p.add_argument("id", type=RUN_ID, metavar="RUN")
    p.add_argument("--timings", action="store_true", help="include every op timing")
    p.add_argument("--attempt", type=int_in(1, MAX_ATTEMPTS * 2), default=None,
                   help="with --timings: an earlier attempt's (default: the current one, e.g. the one that succeeded)")
    p.add_argument("--stragglers", action="store_true",
                   help="the slow card: each rank's busy time per step (from an imported step summary) against "
                        "the median of its pipeline stage and of the job; ranks beyond --threshold flagged")
    p.add_argument("--threshold", type=number_in(0.0001, 9.99), default=0.05, metavar="FRACTION",
                   help="with --stragglers: how far from its stage's median a rank is flagged (default 0.05: 5%%)")

    p = leaf(group, "cancel", cmd_runs_cancel, "cancel a queued run, or ask a running one to stop")
    p.add_argument("id", type=RUN_ID, metavar="RUN")


# --- helpers -------------------------------------------------------------------------------

def _open(args):
    from storage import open_database

    return open_database(args.db)


def _plain(value: Any) -> Any:
    if isinstance(value, TimelineRecord):
        return value.as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _print_json(value: Any) -> int:
    json.dump(_plain(value), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def _when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _num(value: Any, fmt: str = ".4g") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _units(version) -> tuple[str, str]:
    """(time unit, memory unit) of the workload a version was saved with ("" where none is declared)."""
    from mpipe_core.workloads.workload import load_workload

    try:
        workload = load_workload(version.workload)
    except MpipeError:
        return "", ""
    return workload.time_unit, workload.memory_unit


def _with_unit(value: Any, unit: str) -> str:
    """A number in its unit, as people read it ("11.27 s", "112.7 ms"; unitless: the number); "-" for none."""
    from mpipe_core.workloads.units import quantity

    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return quantity(value, unit)


FITS_WORDS = {True: "yes", False: "no", None: "?"}  # within the device's memory (None: unknown)


def _devices_in_all(version) -> tuple[int | None, str]:
    """(devices in all, their parts "tp 2 × pp 4 × dp 64"): the version's pipeline devices
    times its workload's tp, cp and dp (an explicit workload's devices as they are)."""
    from mpipe_core.workloads.analytic import parallel_section

    pipeline = version.summary.get("devices")
    if not isinstance(pipeline, int):
        return None, ""
    degrees = {"tp": 1, "cp": 1, "dp": 1}
    doc = version.workload
    if isinstance(doc, dict) and "model" in doc:
        try:
            section = parallel_section(doc)
            degrees = {k: int(section[k]) for k in degrees}
        except MpipeError:
            pass
    parts = [f"{k} {degrees[k]}" for k in ("tp", "cp") if degrees[k] > 1] + [f"pp {pipeline}"] + \
        ([f"dp {degrees['dp']}"] if degrees["dp"] > 1 else [])
    return pipeline * degrees["tp"] * degrees["cp"] * degrees["dp"], " × ".join(parts)


def _devices_text(total: int | None, parts: str, doc: Any) -> str:
    """ "512 (tp 8 × pp 8 × dp 8; 256 NPUs, 2 dies each)": the parts, and the NPUs where a device is a die."""
    from mpipe_core.search.plan import dies_per_npu
    from mpipe_core.workloads.cluster import devices_text

    if total is None:
        return "-"
    npus = devices_text(total, dies_per_npu(doc))
    shown = ([parts] if parts != f"pp {total}" else []) + ([npus[npus.index("(") + 1:-1]] if "(" in npus else [])
    return f"{total:,}" + (f" ({'; '.join(shown)})" if shown else "")


def _metrics_line(summary: dict) -> str:
    return (f"makespan {_num(summary.get('makespan'))}, "
            f"bubble ratio {_num(summary.get('bubble_ratio'), '.1%')}, "
            f"efficiency {_num(summary.get('efficiency'), '.1%')}")


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def _print_version(v) -> None:
    print(f"{v.ref}  by {v.author}  {_when(v.created_at)}")
    print(f"term      {v.term}")
    print(f"workload  {v.workload_label}")
    print(f"metrics   {_metrics_line(v.summary)}; devices {v.summary.get('devices', '-')}")
    if v.parent:
        print(f"parent    {v.parent}")
    if v.message:
        print(f"message   {v.message}")


# --- library -------------------------------------------------------------------------------

def cmd_save(args) -> int:
    from storage import save_schedule

    db = _open(args)
    workload = args.workload
    if args.parallel is not None:  # the workload's document with these settings, labelled by them
        from mpipe_core.workloads.workload import parse_workload, with_parallel
        from storage.library import resolve_workload

        body, label, _ = resolve_workload(db, workload)
        if body is None:
            raise MpipeError("--parallel needs an analytic workload (one that names a model and a device); "
                             "the default workload states its costs explicitly")
        workload = with_parallel(parse_workload(body, name=label), args.parallel).to_dict()
    version = save_schedule(db, args.name, args.term, workload=workload,
                            message=args.message, author=args.author, description=args.description,
                            tags=args.tag, update=args.update)
    if args.json:
        return _print_json(version)
    print(f"saved {version.ref}: {version.term} ({_metrics_line(version.summary)})")
    return 0


def cmd_list(args) -> int:
    from storage import list_schedules

    schedules = list_schedules(_open(args), search=args.search, tag=args.tag, author=args.author,
                               include_archived=args.archived)
    if args.json:
        return _print_json(schedules)
    if not schedules:
        print("no schedules" + (" match" if args.search or args.tag or args.author else " yet"))
        return 0
    rows = []
    for s in schedules:
        v = s.latest
        rows.append([
            s.name + (" (archived)" if s.archived else ""), str(v.number),
            _with_unit(v.metric("makespan"), _units(v)[0]),  # each in its workload's unit: never ms beside s
            _num(v.metric("bubble_ratio"), ".1%"), _num(v.metric("efficiency"), ".1%"),
            FITS_WORDS.get(v.metric("fits"), "?"), ",".join(s.tags) or "-", s.author, _when(s.updated_at), v.term,
        ])
    _table(rows, ["NAME", "VER", "MAKESPAN", "BUBBLE", "EFF", "FITS", "TAGS", "AUTHOR", "UPDATED", "TERM"])
    return 0


def cmd_show(args) -> int:
    from storage import eval_command, get_schedule, get_version
    from storage.library import parse_ref

    db = _open(args)
    version = get_version(db, args.ref)
    schedule = get_schedule(db, parse_ref(args.ref)[0])
    if args.json:
        return _print_json({"schedule": schedule, "version": version})
    _print_version(version)
    print("eval      " + eval_command(version, args.db))
    print(f"schedule  {schedule.name}: {schedule.version_count} version(s)"
          + (f", tags {', '.join(schedule.tags)}" if schedule.tags else "")
          + (f", forked from {schedule.forked_from}" if schedule.forked_from else "")
          + (", archived" if schedule.archived else ""))
    if schedule.description:
        print(f"          {schedule.description}")
    return 0


def cmd_history(args) -> int:
    from storage import history

    versions = history(_open(args), args.name)
    if args.json:
        return _print_json(versions)
    rows = [[str(v.number), _when(v.created_at), v.author, _with_unit(v.metric("makespan"), _units(v)[0]),
             _num(v.metric("bubble_ratio"), ".1%"), FITS_WORDS.get(v.metric("fits"), "?"), v.message or "-", v.term]
            for v in versions]
    _table(rows, ["VER", "CREATED", "AUTHOR", "MAKESPAN", "BUBBLE", "FITS", "MESSAGE", "TERM"])
    return 0


def cmd_diff(args) -> int:
    from storage import diff_versions

    diff = diff_versions(_open(args), args.a, args.b)
    if args.json:
        return _print_json({"a": diff.a.ref, "b": diff.b.ref, "term_diff": diff.term_diff,
                            "metrics": {k: {"a": a, "b": b, "delta": d} for k, (a, b, d) in diff.metrics.items()},
                            "workload_changed": diff.workload_changed})
    if diff.term_diff:
        print("\n".join(diff.term_diff))
    else:
        print(f"terms are the same: {diff.a.term}")
    if diff.workload_changed:
        print(f"workload: {diff.a.workload_label} -> {diff.b.workload_label}")
    units = {"a": _units(diff.a), "b": _units(diff.b)}
    rows = []
    for key, (a, b, d) in diff.metrics.items():
        numeric = isinstance(d, (int, float)) and not isinstance(d, bool)
        sign = "+" if numeric and d > 0 else ""
        if key in ("bubble_ratio", "efficiency"):  # a change of a fraction is in percentage points
            rows.append([key, _num(a, ".1%"), _num(b, ".1%"), f"{d * 100:+.1f} pp" if numeric else "-"])
        elif key in ("makespan", "lower_bound", "peak_memory"):
            which = 0 if key != "peak_memory" else 1
            ua, ub = units["a"][which], units["b"][which]
            change = sign + _with_unit(d, ua) if numeric else ("- (the workloads' units differ)" if ua != ub else "-")
            rows.append([key, _with_unit(a, ua), _with_unit(b, ub), change])
        elif key == "devices":  # in all: each pipeline device is tp x cp devices, the pipeline replicated dp times
            (ta, pa), (tb, pb) = _devices_in_all(diff.a), _devices_in_all(diff.b)
            shown = [_devices_text(t, p, v.workload) for t, p, v in ((ta, pa, diff.a), (tb, pb, diff.b))]
            change = f"{tb - ta:+,}" if ta is not None and tb is not None else "-"
            rows.append(["devices (in all)", *shown, change])
        else:
            rows.append([key, _num(a), _num(b), sign + _num(d)])
    print()
    _table(rows, ["METRIC", diff.a.ref, diff.b.ref, "CHANGE"])
    return 0


def cmd_fork(args) -> int:
    from storage import fork_schedule

    version = fork_schedule(_open(args), args.source, args.new_name, author=args.author,
                            description=args.description, message=args.message)
    if args.json:
        return _print_json(version)
    print(f"forked {version.parent} into {version.ref}")
    return 0


def cmd_tag(args) -> int:
    from storage import tag_schedule

    tags = tag_schedule(_open(args), args.name, add=args.tags, remove=args.remove)
    print(f"{args.name}: {', '.join(tags) if tags else 'no tags'}")
    return 0


def cmd_archive(args) -> int:
    from storage import archive_schedule

    info = archive_schedule(_open(args), args.name, restore=args.restore)
    print(f"{info.name}: {'archived' if info.archived else 'restored'}")
    return 0


def cmd_export(args) -> int:
    from storage import dump_library, export_library

    from .output import check_writable, write_output

    if args.output:
        check_writable(args.output)
    doc = export_library(_open(args), args.names or None)
    versions = sum(len(s["versions"]) for s in doc["schedules"])
    write_output(dump_library(doc), args.output,
                 f"{len(doc['schedules'])} schedule(s), {versions} version(s), {len(doc['workloads'])} workload(s)")
    return 0


def cmd_import(args) -> int:
    from storage import import_library, read_library_file

    db = _open(args)
    result = import_library(db, read_library_file(args.file), rename=args.rename, source=os.path.basename(args.file))
    print(f"imported {len(result.schedules)} schedule(s) and "
          f"{len(result.workloads) - len(result.reused_workloads)} workload(s) from {args.file}")
    for old, new in result.renamed.items():
        print(f"  {old} -> {new}")
    for name in result.reused_workloads:
        print(f"  workload {name}: already in the library, reused")
    for ref in result.unlinked:
        print(f"  {ref}: its fork origin is not in this library; lineage link dropped")
    for note in result.recomputed:
        print(f"  {note}: stored as recomputed")
    return 0


def cmd_workload(args) -> int:
    from storage import get_workload, list_workloads, save_workload
    from storage.errors import InvalidNameError

    db = _open(args)
    if args.action == "list":
        workloads = list_workloads(db)
        if args.json:
            return _print_json(workloads)
        _table([[w.name, str(w.number), w.author, _when(w.created_at), w.description or "-"]
                for w in workloads], ["NAME", "VER", "AUTHOR", "CREATED", "DESCRIPTION"])
        return 0
    if not args.name:
        raise InvalidNameError(f"library workload {args.action}: give a NAME")
    if args.action == "show":
        info = get_workload(db, args.name)
        if args.json:
            return _print_json(info)
        print(f"{info.ref}  by {info.author}  {_when(info.created_at)}  ({info.version_count} version(s))")
        print(json.dumps(info.body, indent=2, sort_keys=True))
        return 0
    if not args.source:
        raise InvalidNameError("library workload save: give NAME and SOURCE (a preset name or a file)")
    info = save_workload(db, args.name, args.source, message=args.message, author=args.author,
                         description=args.description, update=args.update)
    if args.json:
        return _print_json(info)
    print(f"saved workload {info.ref}; use it with --workload saved:{info.name}")
    return 0


# --- runs ----------------------------------------------------------------------------------

def add_models_argument(p) -> None:
    p.add_argument("--models", metavar="FILE", default=None,
                   help="the operator's model allow-list (TOML; default $MPIPE_MODELS; "
                        "see docs/team-server.md, Registering models)")


def cmd_enqueue(args) -> int:
    from mpipe_core.runs.model_registry import load_registry
    from mpipe_core.runs.model_spec import is_own_model
    from mpipe_core.runs.run_options import check_run_options
    from storage import enqueue, get_version

    options = parse_option_pairs(args.option)
    registry = load_registry(args.models)
    check_run_options(options, registry=registry)  # an unregistered model: refused before anything is imported
    spec = _enqueued_spec(args)
    db = _open(args)
    if spec is not None:
        from storage import enqueue_spec

        if is_own_model(options.get("model")):
            raise MpipeError("--spec queues the spec's workload with the executor's model sized from it; "
                             "queue an own model= on a saved schedule instead")
        run = enqueue_spec(db, spec, args.ref, backend=args.backend, steps=args.steps, options=options,
                           max_attempts=args.max_attempts, registry=registry)
    else:
        if is_own_model(options.get("model")):  # refuse now what cannot run (imports torch)
            from executor.service.run_setup import check_own_model

            version = get_version(db, args.ref)
            check_own_model(version.term, version.workload, options, registry=registry)
        run = enqueue(db, args.ref, backend=args.backend, nproc=args.nproc, steps=args.steps,
                      options=options, max_attempts=args.max_attempts, registry=registry)
    if args.json:
        return _print_json(run)
    print(f"queued run {run.id}: {run.ref} on {run.nproc} x {run.backend}, {run.steps} step(s)")
    return 0


def _enqueued_spec(args):
    """The run spec `--spec` (scaled by `--scale`) to queue, or None without --spec."""
    if args.spec is None:
        if args.scale is not None:
            raise MpipeError("--scale scales a run spec's layout: give --spec FILE with it")
        return None
    if args.nproc is not None:
        raise MpipeError("--spec's layout gives the ranks (tp*cp*pp*dp): drop --nproc (--scale dp=K changes dp)")
    if "@" in args.ref:
        raise MpipeError(f"with --spec, {args.ref[:60]} names the schedule the spec is saved as: drop '@VERSION'")
    from mpipe_core.runs.layout import parse_scale
    from mpipe_core.runs.run_spec import read_run_spec

    spec = read_run_spec(args.spec)
    return spec.scaled(parse_scale(args.scale)) if args.scale is not None else spec


def cmd_runs_list(args) -> int:
    from storage import expire_leases, list_runs

    db = _open(args)
    expire_leases(db)  # so a run whose worker died shows as lost even with no worker running
    runs = list_runs(db, status=args.status, schedule=args.schedule, limit=args.limit)
    if args.json:
        return _print_json(runs)
    if not runs:
        print("no runs")
        return 0
    from storage.runs import shown_status

    rows = [[str(r.id), shown_status(r) + (" (cancel requested)" if r.cancel_requested and r.status == "running" else "")
             + (" (imported)" if r.source == "imported" else ""),
             r.ref, f"{r.nproc}x{r.backend}", str(r.steps), r.launched_by, r.worker_id or "-",
             _when(r.created_at), _when(r.finished_at)] for r in runs]
    _table(rows, ["ID", "STATUS", "SCHEDULE", "PROCS", "STEPS", "BY", "WORKER", "QUEUED", "FINISHED"])
    return 0


def cmd_runs_show(args) -> int:
    from storage import expire_leases, get_run, run_events, timing_attempts, timing_count, timings_for
    from storage.runs import current_attempt

    if args.stragglers:
        return _show_stragglers(args)
    if args.threshold != 0.05:
        raise MpipeError("--threshold applies to --stragglers")
    db = _open(args)
    expire_leases(db)
    run = get_run(db, args.id)
    events = run_events(db, args.id)
    count = timing_count(db, args.id)
    attempts = timing_attempts(db, args.id)
    if args.json:
        doc = {"run": run, "events": events, "timing_count": count,
               "timings_per_attempt": {str(a): n for a, n in attempts.items()}}
        if args.timings:
            doc["timings"] = timings_for(db, args.id, attempt=args.attempt)
        return _print_json(doc)
    from storage.runs import shown_status

    print(f"run {run.id}: {shown_status(run)}{' (cancel requested)' if run.cancel_requested else ''}")
    print(f"schedule  {run.ref} on {run.nproc} x {run.backend}, {run.steps} step(s)"
          + (f", options {json.dumps(run.options, sort_keys=True)}" if run.options else ""))
    if run.source == "imported":
        print(f"source    imported traces (digest {run.source_digest}); ran {_when(run.started_at)} "
              f"to {_when(run.finished_at)}")
    print(f"{'imported' if run.source == 'imported' else 'launched'}  by {run.launched_by} at {_when(run.created_at)}")
    if run.worker_id:
        print(f"worker    {run.worker_id} (attempt {run.attempts} of {run.max_attempts}"
              + (f", lease until {_when(run.lease_expires_at)}" if run.lease_expires_at else "") + ")")
    if run.exit_code is not None:
        print(f"exit code {run.exit_code}")
    if run.error:
        print(f"error     {run.error}")
    shown = current_attempt(run)
    others = [f"attempt {a}: {n}" for a, n in attempts.items() if a != shown]
    print(f"timings   {count} op(s) of attempt {shown}"
          + (f"; kept apart from earlier attempts ({', '.join(others)}; see --timings --attempt N)" if others else ""))
    if run.source == "imported":
        _imported_extras(db, run.id)
    print("history:")
    for e in events:
        print(f"  {_when(e.at)}  {e.from_status or '-'} -> {e.to_status}"
              + (f"  [{e.worker_id}]" if e.worker_id else "") + (f"  {e.note}" if e.note else ""))
    if run.log_tail:
        print("log tail:")
        print(run.log_tail.rstrip("\n"))
    if args.timings:
        for t in timings_for(db, args.id, attempt=args.attempt):
            print(f"  step {t.step} rank {t.device} {t.module}:{t.chunk}{t.kind}{t.microbatch} "
                  f"{t.start:.6f} -> {t.end:.6f} {t.host}")
    return 0


def _imported_extras(db, run_id: int) -> None:
    """An imported run's step summary and communication rows, in one line each."""
    from storage.step_figures import comm_for, step_figures_for

    rows = step_figures_for(db, run_id)
    if rows:
        ranks, steps = len({r.rank for r in rows}), len({r.step for r in rows})
        print(f"summary   {ranks} rank(s) x {steps} step(s) of step figures (see --stragglers; compare-run sets "
              f"them beside a prediction)")
    comm = comm_for(db, run_id)
    if comm:
        kinds: dict[str, int] = {}
        for c in comm:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
        print("comm      " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + " (HCCL lanes)")


def _show_stragglers(args) -> int:
    """`runs show RUN --stragglers`: the slow cards of an imported step summary."""
    from executor.analysis.stragglers import find_stragglers
    from storage import get_run
    from storage.step_figures import step_figures_for

    if args.timings or args.attempt is not None:
        raise MpipeError("--stragglers shows the step summary; leave out --timings and --attempt")
    db = _open(args)
    run = get_run(db, args.id)
    rows = step_figures_for(db, run.id)
    if not rows:
        raise MpipeError(f"run {run.id} has no step summary to find slow ranks in: import the job's "
                         f"step_trace_time.csv files or msprof-analyze's cluster_step_trace_time.csv")
    report = find_stragglers(rows, args.threshold)
    if args.json:
        return _print_json({"run": run.id, **report.as_dict()})
    print(report.format(run.id))
    return 0


def cmd_runs_cancel(args) -> int:
    from storage import cancel_run

    run = cancel_run(_open(args), args.id)
    if run.status == "cancelled":
        print(f"run {run.id} cancelled")
    else:
        print(f"run {run.id} is running on {run.worker_id}; asked it to stop")
    return 0


# --- db ------------------------------------------------------------------------------------

def cmd_db_upgrade(args) -> int:
    from storage import open_database
    from storage.db import current_revision

    db = open_database(args.db)
    print(f"{db.display_url}: schema at revision {current_revision(db)} (latest)")
    return 0


def cmd_db_info(args) -> int:
    from storage import open_database
    from storage.db import check_schema, head_revision

    db = open_database(args.db, upgrade=False)
    revision = check_schema(db)
    info = {"url": db.display_url, "dialect": db.dialect, "revision": revision, "latest": head_revision()}
    if args.json:
        return _print_json(info)
    state = "up to date" if revision == info["latest"] else (
        "empty (run `mpipe db upgrade`)" if revision is None else "needs `mpipe db upgrade`")
    print(f"{info['url']} ({info['dialect']}): revision {revision or '-'}, {state}")
    return 0
