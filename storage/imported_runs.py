"""Runs that another stack made, stored like the queue's own.

    run, trace = import_traces(db, paths_or_uploads, term=None, workload=None, name=None,
                               label_pattern=None, progress=print)

Parsing is the core's (`mpipe_core.formats.trace_import`: per-rank Kineto
traces or Megatron's simulator output -> `TimelineRecord`s, the term inferred
from the ranks' op orders or checked against the one given); this module
stores the result in one transaction: the term as a version of schedule
`name` (default `imported-<digest>`; an existing schedule gets a new version
unless its latest already has this term and workload), a `succeeded` run
with `source="imported"`, the files' digest, and every op as a timing row of
attempt 1.  So `runs show`, `compare-run`, `calibrate` and the app treat it
as any run.  Nothing is written when anything fails.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Sequence

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from mpipe_core.errors import MpipeError
from mpipe_core.formats.rank_layout import RankLayout
from mpipe_core.formats.step_summary import StepSummary, looks_like_step_csv, merge, parse_step_csv
from mpipe_core.formats.trace_import import ImportedTrace, check_term, default_workload, infer_term
from mpipe_core.workloads.inputs import check_text
from storage.access import Actor, author_of, authorize
from storage.audit import record
from storage.db import Database
from storage.errors import ConflictError
from storage.library import (
    _add_version,
    _Content,
    check_name,
    evaluate_term,
    find_version,
    resolve_workload,
    version_body,
)
from storage.models import OpTiming, Run, Schedule, ScheduleVersion, utcnow
from storage.runs import RunInfo, _event, _get_run, _run_info
from storage.step_figures import write_comm, write_step_figures

BATCH = 5000
Progress = Callable[[str], None]


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.utc)


def _report(trace: ImportedTrace, term: str, inferred: bool) -> str:
    """What the import saw, kept as the run's log."""
    lines = [f"imported {len(trace.files)} file(s), {trace.format}: " + ", ".join(trace.files[:8])
             + (" ..." if len(trace.files) > 8 else ""),
             f"term {term} ({'inferred from the ranks’ op orders' if inferred else 'given'})",
             f"ops per rank {trace.ops_per_rank}; steps {len(trace.steps)}; clock {trace.clock}",
             "times: " + (_ascend_times(trace) if trace.format == "ascend" else
                          "device-side ranges (gpu_user_annotation)" if trace.device_side
                          else "CPU ranges, each op from its first child op to its end"),
             f"transfers (PP: SEND/RECV ranges) per rank {trace.transfers}"]
    if trace.comm:
        counts = trace.comm_counts()
        lines.append("communication rows per rank (HCCL lanes): " + "; ".join(
            f"{kind} {[c.get(kind, 0) for c in counts]}" for kind in sorted({k for c in counts for k in c})))
    if trace.step_csvs:
        lines.append(f"step summary: {len(trace.step_csvs)} step_trace_time.csv file(s) beside the traces")
    lines += [f"note: {n}" for n in trace.notes]
    return "\n".join(lines)


def _ascend_times(trace: ImportedTrace) -> str:
    if trace.device_side:
        return "device time: the 'Ascend Hardware' kernels each range launched (first start to last end)"
    return "host ranges: no 'Ascend Hardware' lane in the traces, so each op is its host range whole"


# resolve_workload's (body, label, saved "name@n" or None)
ResolvedWorkload = tuple[dict[str, Any] | None, str, str | None]


def store_imported_run(db: Database, trace: ImportedTrace, *, term: str | None = None, workload: Any = None,
                       name: str | None = None, launched_by: str | None = None, actor: Actor | None = None,
                       resolved: ResolvedWorkload | None = None,
                       step_summary: StepSummary | None = None) -> tuple[RunInfo, bool]:
    """Store `trace` as a run; (the run, whether the term was inferred); `step_summary`
    (the step_trace_time.csv files beside an Ascend trace) is stored with it.
    `actor` must be allowed to import (see `storage.access`).  `resolved` is
    `resolve_workload(db, workload)` when the caller already has it."""
    if name is not None:
        check_name(name)
    name = name or f"imported-{trace.digest[:12]}"
    who = authorize(db, "import-trace", name, actor=actor, schedule=name,
                    details={"digest": trace.digest, "files": len(trace.files)})
    launched_by = author_of(who, launched_by)
    if workload is None:
        body, label, saved = default_workload(trace), "imported (unit costs)", None
    else:
        body, label, saved = resolved if resolved is not None else resolve_workload(db, workload)
    inferred = term is None
    if inferred:
        term = infer_term(trace, body)
        if term is None:
            raise MpipeError("the ranks' op orders are not those of any generator (1f1b, gpipe, zb_h1, zb_h2, "
                             "interleaved, looped_bfs, zbv, dualpipev) with p=%d, m=%d; give the term with "
                             "--term" % (trace.ranks, trace.microbatches))
    else:
        term = check_term(trace, term, body)
    canonical, summary = evaluate_term(term, body)
    content = _Content(canonical, summary, body, label, saved)
    report = _report(trace, content.term, inferred)
    check_text(report, "import report", 64 * 1024)

    summary_rows = list(step_summary.rows) if step_summary is not None else []

    def fill(session: Session, run_id: int) -> int:
        rows = [{"run_id": run_id, "attempt": 1, "step": r.step, "rank": r.device, "module": r.module,
                 "kind": r.kind, "chunk": r.chunk, "microbatch": r.microbatch, "start": r.start, "end": r.end,
                 "device": r.host[:64]} for r in trace.records]
        for i in range(0, len(rows), BATCH):
            session.execute(insert(OpTiming), rows[i:i + BATCH])
        write_comm(session, run_id, trace.comm)
        write_step_figures(session, run_id, summary_rows)
        return len(rows)

    run = _store(db, who, content, name=name, launched_by=launched_by, digest=trace.digest, fmt=trace.format,
                 nproc=trace.ranks, steps=max(1, len(trace.steps)), backend=trace.backend or trace.format,
                 started=_when(trace.wall_start), finished=_when(trace.wall_end), report=report,
                 files=len(trace.files), fill=fill, inferred=inferred)
    return run, inferred


def _store(db: Database, who, content: _Content, *, name: str, launched_by: str, digest: str, fmt: str, nproc: int,
           steps: int, backend: str, started, finished, report: str, files: int,
           fill: Callable[[Session, int], int], inferred: bool) -> RunInfo:
    """One transaction: the schedule version (new unless the latest has this term and
    workload), a succeeded imported run, what `fill(session, run_id)` writes (it returns
    the op count), the audit record.  Refused when the same files were imported with the
    same term."""

    def write(session: Session) -> RunInfo:
        now = utcnow()
        twin = session.execute(
            select(Run.id).join(Run.version).where(Run.source_digest == digest,
                                                   ScheduleVersion.term == content.term)).first()
        if twin is not None:
            raise ConflictError(f"these traces (digest {digest[:12]}) were imported already as run "
                                f"{twin[0]} with term {content.term}")
        schedule = session.scalars(select(Schedule).where(Schedule.name == name)).one_or_none()
        version = None
        if schedule is None:
            schedule = Schedule(name=name, description=f"imported traces ({fmt})", author=launched_by,
                                created_at=now, updated_at=now, archived=False)
            session.add(schedule)
            parent = None
        else:
            if schedule.archived:
                raise ConflictError(f"schedule '{name}' is archived; restore it or choose another --name")
            parent = find_version(session, name)
            if parent.term == content.term and version_body(parent) == content.body:
                version = parent
        if version is None:
            version = _add_version(session, schedule, content, message=f"imported from traces {digest[:12]}",
                                   author=launched_by, parent=parent, now=now)
        run = Run(version=version, backend=backend[:16], nproc=nproc, steps=steps, options={}, status="succeeded",
                  launched_by=launched_by, attempts=1, max_attempts=1, cancel_requested=False, created_at=now,
                  started_at=started or now, finished_at=finished or now,
                  log_tail=report, source="imported", source_digest=digest)
        session.add(run)
        session.flush()
        _event(session, run.id, None, "succeeded", now, note=f"imported by {launched_by} from {files} "
                                                            f"{'trace ' if fmt != 'step-summary' else ''}file(s)")
        ops = fill(session, run.id)
        record(session, who, "import-trace", f"run {run.id}", schedule=name, run_id=run.id,
               details={"version": f"{name}@{version.number}", "term": content.term, "digest": digest,
                        "files": files, "ops": ops, "term_inferred": inferred})
        session.flush()
        return _run_info(_get_run(session, run.id))

    return db.write(write)


def import_traces(db: Database, sources: Sequence[Any], *, term: str | None = None, workload: Any = None,
                  name: str | None = None, label_pattern: str | None = None, align_on: str | None = None,
                  layout: str | None = None, order: str | None = None, progress: Progress | None = None,
                  actor: Actor | None = None) -> tuple[RunInfo, ImportedTrace, bool]:
    """Read, parse and store traces: `sources` are paths (files or folders) or
    uploaded (name, bytes) pairs (the app).  `layout` (`tp=8,dp=4,pp=8`) and
    `order` (`tp-cp-dp-pp`) say which world the files' ranks are global ranks
    of (default: the workload's parallel section, if it has tp, cp or dp > 1);
    one pipeline's files are kept.  Returns (run, trace, term inferred)."""
    from mpipe_core.formats.label_pattern import LabelPattern
    from mpipe_core.formats.trace_files import read_paths, read_uploads
    from mpipe_core.formats.trace_import import assemble

    pattern = LabelPattern(label_pattern) if label_pattern is not None else None
    if align_on is not None:
        check_text(align_on, "--align-on", 200, single_line=True)
    if not sources:
        raise MpipeError("give trace files or folders")
    uploads = [s for s in sources if isinstance(s, tuple)]
    if uploads and len(uploads) != len(sources):
        raise MpipeError("give either paths or uploaded files, not both")
    # A bad name or workload is refused before any file is read (parsing may take minutes).
    if name is not None:
        check_name(name)
    resolved = None if workload is None else resolve_workload(db, workload)
    rank_layout = world_layout(layout, order, None if resolved is None else resolved[0])
    if any(looks_like_step_csv(s[0] if isinstance(s, tuple) else str(s)) for s in sources):
        raise MpipeError("step summaries (.csv) are imported alone (a run summary), or found beside their "
                         "traces in the profiler folders; give them apart from trace files")
    files = read_uploads(uploads, progress) if uploads else read_paths(list(sources), progress)
    trace = assemble(files, pattern, align_on, progress, rank_layout)
    step_summary = None
    if trace.step_csvs:
        step_summary = merge([parse_step_csv(data, csv_name, rank) for csv_name, data, rank in trace.step_csvs])
    if progress is not None:
        progress(f"storing {len(trace.records)} ops of {trace.ranks} ranks")
    run, inferred = store_imported_run(db, trace, term=term, workload=workload, name=name, actor=actor,
                                       resolved=resolved, step_summary=step_summary)
    return run, trace, inferred


def is_step_summary_import(sources: Sequence[Any]) -> bool:
    """Whether every source is a step summary: a .csv, or a folder of Ascend profiler folders
    exported as summaries only (no trace_view.json): `import_step_summary`'s input."""
    from pathlib import Path

    from mpipe_core.formats.trace_files import summary_only_folders

    def one(source: Any) -> bool:
        if isinstance(source, tuple):
            return looks_like_step_csv(source[0])
        return looks_like_step_csv(str(source)) or summary_only_folders(Path(source))

    return bool(sources) and all(one(s) for s in sources)


def import_step_summary(db: Database, sources: Sequence[Any], *, term: str | None, workload: Any = None,
                        name: str | None = None, progress: Progress | None = None,
                        actor: Actor | None = None) -> tuple[RunInfo, StepSummary, str]:
    """step_trace_time.csv files (one per rank) or msprof-analyze's cluster_step_trace_time.csv,
    paths or uploaded (name, bytes), stored as a run summary: an imported run with no op
    timings and each rank's figures per step.  A summary holds no op order, so the term that
    ran is given; its devices must be the summary's pipeline stages.  (run, summary, term)."""
    from mpipe_core.api import evaluate
    from mpipe_core.formats.trace_files import digest, read_step_summaries, read_uploads

    if term is None:
        raise MpipeError("a step summary holds no op order: give the term that ran with --term "
                         "(e.g. --term '1f1b(p=8, m=32)')")
    if name is not None:
        check_name(name)
    resolved = None if workload is None else resolve_workload(db, workload)
    uploads = [s for s in sources if isinstance(s, tuple)]
    files = read_uploads(uploads, progress) if uploads else read_step_summaries(list(sources), progress)
    summary = merge([parse_step_csv(f.data, f.name, f.rank) for f in files])
    stages = sorted({r.pp for r in summary.rows if r.pp is not None})
    if stages and any(r.pp is None for r in summary.rows):
        raise MpipeError(f"{summary.source}: some rank rows have a PP Index and some do not")
    body, label, saved = resolved if resolved is not None else ({"name": "imported", "llm": {"layers": None}},
                                                                "imported (unit costs)", None)
    ev = evaluate(term, body)
    width = len(stages) if stages else len(summary.ranks)
    if ev.schedule.devices != width:
        what = f"{len(stages)} pipeline stages (PP Index)" if stages else f"{len(summary.ranks)} ranks and no PP Index"
        raise MpipeError(f"--term {ev.term} runs on {ev.schedule.devices} devices; the summary has {what}")
    if stages and stages != list(range(len(stages))):
        raise MpipeError(f"{summary.source}: PP Index values {stages[:8]} are not 0..{len(stages) - 1}")
    name = name or f"imported-{digest(files)[:12]}"
    who = authorize(db, "import-trace", name, actor=actor, schedule=name,
                    details={"digest": digest(files), "files": len(files)})
    canonical, metrics = evaluate_term(ev.term, body)
    content = _Content(canonical, metrics, body, label, saved)
    report = "\n".join([
        f"imported {len(files)} file(s), {summary.format}: " + ", ".join(f.name for f in files[:8])
        + (" ..." if len(files) > 8 else ""),
        f"term {content.term} (given)",
        f"a run summary: {len(summary.ranks)} ranks, steps {', '.join(map(str, summary.steps[:20]))}; no op timings"
        + (f"; {summary.stage_rows} stage rows of msprof-analyze recomputed from the rank rows"
           if summary.stage_rows else "")])
    if progress is not None:
        progress(f"storing {len(summary.rows)} step figures of {len(summary.ranks)} ranks")

    def fill(session: Session, run_id: int) -> int:
        write_step_figures(session, run_id, summary.rows)
        return 0

    run = _store(db, who, content, name=name, launched_by=author_of(who, None), digest=digest(files),
                 fmt="step-summary", nproc=len(summary.ranks), steps=len(summary.steps), backend="hccl",
                 started=None, finished=None, report=report, files=len(files), fill=fill, inferred=False)
    return run, summary, content.term


def world_layout(layout: str | None, order: str | None, body: Any) -> RankLayout | None:
    """The world the traces' ranks belong to: `--layout` (and `--order`), else the
    workload's parallel section (in its cluster's order, if it names one)."""
    from mpipe_core.formats.rank_layout import layout_from_parallel, parse_layout, parse_order

    for text, flag in ((layout, "--layout"), (order, "--order")):
        if text is not None:
            check_text(text, flag, 200, single_line=True)
    if order is not None:
        parse_order(order)
    if layout is not None:
        return parse_layout(layout, order)
    found = None
    if isinstance(body, dict):
        cluster = body.get("cluster")
        named = cluster.get("order") if isinstance(cluster, dict) else None
        given, where = (order, "--order") if order is not None else (
            (named, "the workload's cluster order") if isinstance(named, str) else (None, "--order"))
        found = layout_from_parallel(body.get("parallel"), given, where)
    if found is None and order is not None:
        raise MpipeError("--order needs --layout (or a workload whose parallel section sets tp, cp or dp)")
    return found


__all__: Iterable[str] = ("import_traces", "import_step_summary", "is_step_summary_import", "store_imported_run",
                          "world_layout")
