"""`mpipe plan`: the whole layout for N devices and a global batch."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from mpipe_core.errors import MpipeError
from mpipe_core.search.budget import DEFAULT_EVALUATIONS
from mpipe_core.workloads.units import human, seconds

from .arg_types import int_in, memory_cap, number_in


RUN_SPEC = "mpipe"  # --emit mpipe: the winner as a run spec (workload, layout, term) for `mpipe run --spec`


def _targets() -> list[str]:
    from mpipe_core.formats.launch_config import LAUNCH_TARGETS

    return list(LAUNCH_TARGETS)


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="search the whole layout (tp, cp, pp, dp, virtual stages, microbatch "
                                           "size, recompute, encoder strategy) for N devices")
    p.add_argument("--workload", "-w", required=True,
                   help="analytic workload: preset name, .json/.toml file or saved:NAME[@N] (e.g. one "
                        "`mpipe calibrate --save` fitted)")
    p.add_argument("--devices", type=int_in(-2**31), required=True,
                   help="devices in all (N); on cloudmatrix384 a device is one die, two to an NPU")
    p.add_argument("--global-batch", type=int_in(-2**31), required=True, help="samples per optimizer step (B)")
    p.add_argument("--cluster", default=None,
                   help="cluster preset or a .json file with a cluster section (default: the workload's, else "
                        "its device's)")
    p.add_argument("--memory-cap", type=memory_cap, default=None,
                   help="per-device peak memory limit in GB (default: the device's memory; none: no cap)")
    p.add_argument("--top", type=int_in(1, 1000), default=5, help="show the K fastest layouts")
    p.add_argument("--evaluations", type=int_in(1, 10**9), default=None, metavar="N",
                   help=f"the search budget in terms evaluated (default {DEFAULT_EVALUATIONS}; recompute tries "
                        f"come on top): the same question gets the same answer on any machine, idle or loaded")
    p.add_argument("--time-limit", type=number_in(0.0, lo_open=True), default=None,
                   help="seconds of search, an extra bound beside --evaluations (default: none; an answer cut "
                        "by it depends on the machine's load)")
    p.add_argument("--emit", choices=[*_targets(), RUN_SPEC], default=None,
                   help="also write the launch configuration of the best layout this stack can run, saying how "
                        "much slower it is than the winner; mpipe: the winner as a run spec file (-o) for "
                        "`mpipe run --spec`")
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="with --emit mpipe: the run spec file to write")
    p.add_argument("--runnable-by", choices=_targets(), default=None, metavar="STACK",
                   help=f"rank only the layouts this stack can run ({', '.join(_targets())})")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    from .core_commands import db_arg

    db_arg(p)
    p.set_defaults(handler=cmd_plan)


def _cluster_arg(text: str | None):
    if text is None:
        return None
    from mpipe_core.workloads.cluster import CLUSTERS

    if text in CLUSTERS:
        return text
    path = Path(text)
    if not path.exists():
        raise MpipeError(f"--cluster {text[:60]!r}: no such preset or file (presets: {', '.join(sorted(CLUSTERS))})")
    from mpipe_core.workloads.inputs import load_document, read_bounded

    doc = load_document(read_bounded(path, 1 << 20, "the cluster file"), str(path),
                        kind=path.suffix.lstrip(".").lower() or "json")
    return doc.get("cluster", doc) if isinstance(doc, dict) else doc


class _Bar:
    """A one-line progress bar on stderr (only when it is a terminal, else a line every few seconds)."""

    def __init__(self) -> None:
        import time

        self.time = time.perf_counter
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int, what: str) -> None:
        now = self.time()
        if now - self.last < (0.2 if self.tty else 5.0) and (done != total or not total):
            return
        self.last = now
        width = 30
        if total:
            filled = width * done // total
            line = f"plan: [{'#' * filled}{'.' * (width - filled)}] {done}/{total} terms  {what}"
        else:  # before the terms are counted (the layouts being enumerated): what it says is all there is
            line = f"plan: {what}"
        print(("\r" + line + "\033[K") if self.tty else line, end="" if self.tty else "\n", file=sys.stderr,
              flush=True)
        if self.tty and done == total and total:
            print(file=sys.stderr)


def cmd_plan(args) -> int:
    import argparse

    from mpipe_core.search.plan import plan

    from .core_commands import load_workload_arg

    wl = load_workload_arg(argparse.Namespace(workload=args.workload, parallel=None, db=args.db))
    if wl.source is None or "model" not in wl.source:
        raise MpipeError(f"plan needs an analytic workload (one that names a model and a device); "
                         f"'{wl.name}' states its costs explicitly")
    if args.emit == RUN_SPEC and not args.output:  # before the search, not after it
        raise MpipeError("--emit mpipe writes the winner as a run spec file: give -o FILE")
    if args.output and args.emit != RUN_SPEC:
        raise MpipeError("-o FILE is where --emit mpipe writes its run spec; the stacks' files print on stdout")
    cap = None if args.memory_cap == "none" else "capacity" if args.memory_cap is None else args.memory_cap
    keep = None
    if args.runnable_by:
        from mpipe_core.formats.runnable import term_filter

        keep = term_filter(args.runnable_by, wl.source)
    budget = DEFAULT_EVALUATIONS if args.evaluations is None else args.evaluations
    result = plan(wl.source, args.devices, args.global_batch, _cluster_arg(args.cluster), cap, args.top,
                  args.time_limit, _Bar(), max_evaluations=budget, keep=keep)
    if args.runnable_by:
        from mpipe_core.formats.runnable import runnable_only

        result = runnable_only(result, args.runnable_by)
    choice, refused = None, None
    if args.emit == RUN_SPEC:
        return _emit_run_spec(result, args)
    if args.emit:
        from mpipe_core.formats.runnable import best_runnable

        try:
            choice = best_runnable(result, args.emit)
        except MpipeError as error:  # the plan is still printed, then the one error line
            refused = error
    if args.json:
        doc = result.as_dict()
        if args.runnable_by:
            doc["runnable_by"] = args.runnable_by
        if choice is not None:
            from mpipe_core.formats.launch_config import as_text

            doc["emit"] = {"target": args.emit, "candidate": choice.index + 1, "term": choice.candidate.term,
                           "slower": choice.slower, "summary": choice.summary(), "files": choice.files,
                           "text": as_text(choice.files)}
        elif refused is not None:
            doc["emit"] = {"target": args.emit, "error": refused.message}
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(render(result, _write_best_workload(result.best.document)))
        if choice is not None:
            print("\n" + emitted(choice))
    if refused is not None:
        raise refused
    return 0


def _emit_run_spec(result, args) -> int:
    """The plan, then its winner written as a run spec: what `mpipe run --spec` runs (`--scale dp=K`
    tries it on fewer devices first)."""
    from mpipe_core.runs.run_spec import run_spec_from_plan_row, write_run_spec

    best = result.best
    spec = run_spec_from_plan_row(best.as_dict(), source=f"mpipe plan: {result.devices} devices, global batch "
                                                         f"{result.global_batch}, #1 of {len(result.candidates)}")
    try:
        write_run_spec(spec, args.output)
    except OSError as error:
        raise MpipeError(f"-o {args.output}: cannot write the run spec ({error.strerror or error})") from None
    if args.json:
        doc = result.as_dict()
        doc["emit"] = {"target": RUN_SPEC, "candidate": 1, "term": best.term, "file": args.output,
                       "spec": spec.to_dict()}
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(render(result, _write_best_workload(result.best.document)))
        print(f"\n# mpipe: #1 written as a run spec to {args.output} ({spec.layout.world} ranks): "
              f"mpipe run --spec {args.output} --check-grads  (--scale dp=K: fewer replicas first)")
    return 0


def emitted(choice) -> str:
    """The chosen layout's launch configuration under a line saying which it is and what it costs."""
    from mpipe_core.formats.launch_config import as_text

    c = choice.candidate
    head = (f"# {choice.target}: {choice.summary()}: {c.step_time_s:.4g} s, {c.layout.label()}  {c.term}"
            if choice.index else f"# {choice.target}: {choice.summary()}")
    if choice.first_refusal:
        head += f"\n# #1: {choice.first_refusal}"
    if choice.index >= choice.top:
        head += (f"\n# (the fastest of the layouts the search evaluated: it pruned against its top "
                 f"{choice.top}; --runnable-by {choice.target} ranks what {choice.label} can run exactly)")
    return f"{head}\n{as_text(choice.files)}"


def best_workload_path(document: dict) -> Path:
    """Where `plan` writes the best layout's workload document: the user's cache
    ($XDG_CACHE_HOME, else ~/.cache), named by the document's digest, so the same
    document is one file however often it is planned."""
    import hashlib
    import os

    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "mpipe" / "plans" / f"{digest}.json"


def _write_best_workload(document: dict) -> Path | None:
    """The best layout's document written to `best_workload_path` (None: it could not be written)."""
    path = best_workload_path(document)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2) + "\n")
    except OSError:
        return None
    return path


def render(result, workload_path: Path | None = None) -> str:
    s = result.searched
    cap = f"memory cap {result.memory_cap:.4g} GB" if result.memory_cap is not None else "no memory cap"
    lines = [f"{result.cluster.count_text(result.devices)} on {result.cluster.name}, global batch {result.global_batch}, {cap}",
             f"searched {s['layouts']} layouts, {s['terms']} terms: {s['evaluated']} evaluations "
             f"({s['recompute_tries']} of them recompute tries), {s['pruned_by_bound']} pruned by the step-time bound, "
             f"{s['pruned_by_memory']} by static memory, in {result.seconds:.1f} s; {result.coverage()}", "",
             f"{'#':>2} {'step s':>8} {'MFU':>6} {'peak GB':>8} {'tp':>3} {'cp':>3} {'pp':>3} {'dp':>4} {'mbs':>3} "
             f"{'M':>4}  term"]
    front = {id(c) for c in result.pareto()}
    for i, c in enumerate(result.shown(), 1):
        lay = c.layout
        lines.append(f"{i:>2} {c.step_time_s:>8.4g} {c.mfu:>6.1%} {c.peak_memory:>8.4g} {lay.tp:>3} {lay.cp:>3} "
                     f"{lay.pp:>3} {lay.dp:>4} {lay.mbs:>3} {c.microbatches:>4}  {c.term}"
                     f"{'  (pareto)' if id(c) in front else ''}")
    best = result.best
    b = best.breakdown
    source = result.device_source()
    if source is not None:  # what every step time above rests on
        lines += ["", f"device: {source.text()}"]
    lines += ["", f"best: {best.layout.label()}  {best.term}",
              "  breakdown: " + ", ".join(f"{k} {seconds(b[k], significant=3)}" for k in
                                            ("compute", "tp_comm", "cp_comm", "dp_comm", "bubble", "optimizer",
                                             "encoder_comm") if k in b),
              ("  reproduce: mpipe eval " + shlex.quote(best.term) + " -w " + shlex.quote(str(workload_path))
               if workload_path is not None else
               "  reproduce: mpipe eval " + shlex.quote(best.term) + " -w <best.workload of --json, as a file>"),
              "", "pareto front (step time vs peak memory):"]
    lines += [f"  {seconds(c.step_time_s)}  {human(c.peak_memory)} GB  {c.layout.label()}  {c.term}"
              for c in result.pareto()]
    lines += ["", "ruled out:"] + [f"  {line}" for line in result.ruled_out]
    return "\n".join(lines)
