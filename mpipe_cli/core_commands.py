"""`mpipe eval`, `export`, `import-csv`, `compare`, `terms`: the core's commands."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mpipe_core.errors import MpipeError
from mpipe_core.formats.export import FORMATS, LAUNCH_FORMATS, STACK_FORMATS
from mpipe_core.workloads.units import human, quantity, seconds

from .arg_types import parallel_spec, positive_int
from .output import check_writable, write_output

ASCII_GANTT_MAX_OPS = 400


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="evaluate and simulate a term")
    p.add_argument("term", help='e.g. "transpose(1f1b(p=4, m=8), mode=dynamic)"')
    _workload_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--timeline", action="store_true", help="include every op's start and end")
    p.add_argument("--max-ops", type=positive_int, default=None, help="refuse terms bigger than this")
    p.add_argument("--batches", type=int, default=None, metavar="N",
                   help="evaluate N batches drawn from the workload's data (docs/data.md): per-batch makespan, "
                        "mean/p50/p95/max, tokens/s; per_batch(t) against static t")
    p.add_argument("--budget-ms", type=float, default=None, metavar="MS",
                   help="per_batch's planning budget per batch, CPU milliseconds (default 50)")
    p.set_defaults(handler=cmd_eval)

    p = subparsers.add_parser("export", help="export a schedule (torch CSV, Chrome trace, JSON, stack configs)")
    p.add_argument("term")
    _workload_arg(p)
    p.add_argument("--format", required=True, choices=[*FORMATS, *STACK_FORMATS, *LAUNCH_FORMATS],
                   help="torchtitan: a folder with schedule.csv and torchtitan.toml (-o DIR); megatron-layout: "
                        "the --pipeline-model-parallel-layout string; mindspeed-placement: layer_placement JSON; "
                        "megatron, mindspeed-mm: the whole layout's launch arguments / config")
    p.add_argument("-o", "--output", help="file to write (default: stdout); for torchtitan the folder")
    p.add_argument("--fqn-template", default=None, metavar="FQNS",
                   help="torchtitan: the model's module names in order, {} for a layer index "
                        "(default tok_embeddings,layers.{},norm,output)")
    p.set_defaults(handler=cmd_export)

    p = subparsers.add_parser("import-csv", help="simulate a torch pipelining CSV schedule")
    p.add_argument("file")
    _workload_arg(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeline", action="store_true")
    p.set_defaults(handler=cmd_import_csv)

    p = subparsers.add_parser("compare", help="several terms on one workload, with what transpose, colocated "
                                              "and disaggregate cost and gain")
    p.add_argument("terms", nargs="+")
    _workload_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_compare)

    p = subparsers.add_parser("terms", help="list generators, combinators and workload presets")
    p.set_defaults(handler=cmd_terms)


def _workload_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", default=None,
                   help="preset name, .json/.toml file, saved:NAME[@N] from the library, or version:NAME@N (the "
                        "workload a library version was saved with) (default: uniform, F=B=W=1 per chunk)")
    parallel_arg(p)
    db_arg(p)


def db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", default=None,
                   help="the database a saved:NAME workload is read from (default: $MPIPE_DB_URL, else "
                        "~/.local/share/mpipe/mpipe.db)")


def parallel_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parallel", type=parallel_spec, default=None, metavar="KEY=VALUE,...",
                   help="an analytic workload's parallel section, e.g. tp=8,sp or cp=2,encoder_shard=gradients "
                        "(keys: tp, sp, cp, dp, flash_attention, distributed_optimizer, overlap_grad_reduce, "
                        "tp_comm_overlap, tp_backward_overlap, grad_accumulation_fusion, grad_reduce_fp32, p2p_overlap, "
                        "encoder_shard=none|optimizer|gradients; docs/memory.md, docs/cluster.md)")


VERSION_PREFIX = "version:"  # -w version:NAME@N: the workload a library version was saved with


def load_workload_arg(args):
    """The workload `--workload` names, with `--parallel` applied."""
    from mpipe_core.workloads.workload import load_workload, parse_workload, with_parallel

    source = args.workload
    if isinstance(source, str) and source.startswith(VERSION_PREFIX):  # a library version's own workload
        from storage import get_version, open_database

        db = open_database(getattr(args, "db", None))
        try:
            version = get_version(db, source[len(VERSION_PREFIX):])
        finally:
            db.close()
        wl = load_workload(version.workload) if version.workload is not None else load_workload(None)
    elif isinstance(source, str) and source.startswith("saved:"):  # the library's: storage reads it
        from storage import open_database
        from storage.library import resolve_workload

        db = open_database(getattr(args, "db", None))
        try:
            body, label, _ = resolve_workload(db, source)
        finally:
            db.close()
        wl = parse_workload(body, name=label)
    else:
        wl = load_workload(source)
    return wl if args.parallel is None else with_parallel(wl, args.parallel)


def _summary_text(summary: dict, dies_per_npu: int = 1) -> str:
    lines = [
        f"term         {summary['term']}",
        f"devices      {devices_text(summary, dies_per_npu)}    ops {summary['ops']}",
        f"makespan     {human(summary['makespan'])}",
        f"bubble ratio {summary['bubble_ratio']:.1%}",
        f"lower bound  {human(summary['lower_bound'])}    efficiency {summary['efficiency']:.1%}",
        "idle         " + " ".join(human(x, 3) for x in summary["idle"]),
        "peak memory  " + " ".join(human(x, 3) for x in summary["peak_memory"]),
    ]
    if any(summary["static_memory"]):
        lines.append("static       " + " ".join(human(x, 3) for x in summary["static_memory"]))
    if summary["capacity"] is not None:
        lines.append(f"capacity     {human(summary['capacity'])}    {fit_text(summary)}")
    if "step_time_s" in summary:
        lines[1:1] = step_lines(summary)
    return "\n".join(lines)


def devices_text(summary: dict, dies_per_npu: int = 1) -> str:
    """The schedule's devices, and where the workload says so every device of the
    job (tp x cp x dp of them per pipeline device): never a count that ignores tp;
    on a cluster whose device is one die of an NPU, the NPUs too."""
    from mpipe_core.workloads.cluster import devices_text as count

    total = summary.get("devices_total")
    if total is None or total == summary["devices"]:
        return str(summary["devices"]) if dies_per_npu == 1 else count(summary["devices"], dies_per_npu)
    return (f"{count(total, dies_per_npu)} in all ({summary['devices']} pipeline devices x "
            f"{total // summary['devices']} (tp x cp x dp))")


def step_lines(summary: dict) -> list[str]:
    """MFU and the step time first, with units (an analytic workload's step figures)."""
    b = summary["breakdown"]
    parts = ", ".join(f"{k.replace('_', ' ')} {seconds(b[k], significant=3)}" for k in
                      ("compute", "tp_comm", "cp_comm", "encoder_comm", "bubble", "dp_comm", "optimizer") if b[k])
    lines = [f"MFU          {summary['mfu']:.1%}    step time {seconds(summary['step_time_s'])}    "
             f"HFU {summary['hfu']:.1%}",
             f"throughput   {human(summary['tokens_per_s'])} tokens/s    {human(summary['samples_per_s'])} samples/s    "
             f"{human(summary['model_tflops_per_device'])} model TFLOP/s per device on {summary['devices_total']} devices",
             f"step         {parts} (device {summary['critical_device']})"]
    source = summary.get("device_source")
    if source is not None:  # what the step time rests on
        lines.append(f"device       {source['text']}")
    return lines + [f"note         {note}" for note in summary["notes"]]


def fit_text(summary: dict) -> str:
    """Whether the schedule fits the device's memory, in a few words."""
    peaks, capacity = summary["peak_memory"], summary["capacity"]
    worst = max(range(len(peaks)), key=peaks.__getitem__)
    if summary["fits"]:
        return f"fits (least headroom {min(summary['headroom']):.3g}, device {worst})"
    over = [d for d, h in enumerate(summary["headroom"]) if h < 0]
    return (f"does not fit: device {worst} needs {peaks[worst]:.4g}, {peaks[worst] - capacity:.3g} over "
            f"({len(over)} of {len(peaks)} devices over)")


def _print_evaluation(ev, args) -> int:
    from mpipe_core.formats.ascii_gantt import render

    summary = ev.summary()
    if args.json:
        if args.timeline:
            summary["timeline"] = ev.timeline_rows()
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
        return 0
    from mpipe_core.search.plan import dies_per_npu

    print(_summary_text(summary, dies_per_npu(ev.workload.source)))
    if len(ev.timeline) <= ASCII_GANTT_MAX_OPS:
        print()
        print(render(ev.timeline))
    else:
        print(f"(timeline of {len(ev.timeline)} ops: use --json --timeline or `mpipe export`)")
    if args.timeline:
        for row in ev.timeline_rows():
            print(f"dev{row['device']} {row['module']}:{row['chunk']}{row['kind']}{row['microbatch']} "
                  f"{row['start']:.4g} -> {row['end']:.4g}")
    return 0


def cmd_eval(args) -> int:
    from mpipe_core.api import evaluate

    if args.batches is not None:
        return _eval_batches(args)
    if args.budget_ms is not None:
        raise MpipeError("--budget-ms applies to --batches")
    return _print_evaluation(evaluate(args.term, load_workload_arg(args), max_ops=args.max_ops), args)


def _eval_batches(args) -> int:
    from mpipe_core.search.per_batch import BUDGET_MS
    from mpipe_core.search.stream import evaluate_stream

    if args.batches < 1:
        raise MpipeError(f"--batches: expected a whole number of batches >= 1, got {args.batches}")
    if args.timeline:
        raise MpipeError("--timeline shows one schedule's ops; with --batches use `mpipe eval` on one batch")
    budget = BUDGET_MS if args.budget_ms is None else args.budget_ms
    if not budget >= 0 or budget == float("inf"):
        raise MpipeError(f"--budget-ms: expected a finite number of milliseconds >= 0, got {args.budget_ms}")
    result = evaluate_stream(args.term, load_workload_arg(args), args.batches, budget, max_ops=args.max_ops)
    if result.note:
        print(f"note: {result.note}", file=sys.stderr)
    if args.json:
        json.dump(result.as_dict(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    print(stream_text(result))
    return 0


def stream_text(result) -> str:
    """`eval --batches` as a table and a summary."""
    unit = result.time_unit or "time units"
    memory = result.memory_unit
    head = f"{'batch':>5} {'makespan':>11} {'peak mem':>11}"
    if result.per_batch:
        head += f" {'static':>11} {'gain':>6} {'plan ms':>7}  plan"
    if result.dp > 1:
        head += f"  {'gap':>5}"
    lines = [f"term     {result.term}", f"batches  {len(result.batches)}   dp {result.dp}   balance {result.balance}"
             f"   makespan in {unit}, peak memory (the worst device's) in {memory or 'memory units'}", "", head]
    from mpipe_core.search.stream import gap

    for b in result.batches:
        row = f"{b.index:>5} {b.makespan:>11.5g} {b.peak_memory:>11.5g}"
        if result.per_batch:
            row += (f" {b.static_makespan:>11.5g} {b.static_makespan / b.makespan:>5.3f}x {b.plan_ms:>7.1f}  "
                    f"{'; '.join(sorted(set(b.how)))}{' (budget hit)' if b.fallback else ''}")
        if result.dp > 1:
            row += f"  {gap(b.replicas):>5.1%}"
        lines.append(row)
    s = result.summary()
    lines += ["", f"makespan mean {s['mean']:.5g}  p50 {s['p50']:.5g}  p95 {s['p95']:.5g}  max {s['max']:.5g}"]
    if "tokens_per_s" in s:
        lines.append(f"step time {human(s['step_time_s_mean'])} s mean    tokens/s {s['tokens_per_s']:,.0f}")
    else:
        lines.append(f"tokens per time unit {s['tokens_per_time_unit']:,.4g}")
    if result.per_batch:
        lines.append(f"static   mean {s['static_mean']:.5g}  p95 {s['static_p95']:.5g}   gain {s['gain']:.3f}x "
                     f"overall (per batch {s['gain_min']:.3f}x to {s['gain_max']:.3f}x)")
        lines.append(f"planning {s['plan_ms_mean']:.1f} ms mean, {s['plan_ms_max']:.1f} ms max per batch "
                     f"(budget {result.budget_ms:g} ms; {s['fallbacks']} batches hit it); set-up "
                     f"{result.setup_ms:.0f} ms once")
    top = f"peak memory max {quantity(s['peak_memory_max'], memory)}"
    lines.append(top if result.capacity is None else f"{top} (device memory {quantity(result.capacity, memory)})")
    for b in result.over_capacity():
        lines.append(f"over memory: batch {b.index} peaks at {quantity(b.peak_memory, memory)} on its worst device, "
                     f"{quantity(b.peak_memory - result.capacity, memory)} over the device's "
                     f"{quantity(result.capacity, memory)}")
    if result.dp > 1:
        gaps = s["straggler_gap"]
        lines.append("straggler gap " + ", ".join(f"{k} {v:.1%}" for k, v in gaps.items()))
    return "\n".join(lines)


def cmd_export(args) -> int:
    from mpipe_core.api import evaluate
    from mpipe_core.formats.export import export_text

    if args.fqn_template is not None and args.format != "torchtitan":
        raise MpipeError("--fqn-template applies to --format torchtitan")
    if args.format == "torchtitan":
        return _export_torchtitan(args)
    if args.output:
        check_writable(args.output)
    ev = evaluate(args.term, load_workload_arg(args))
    if args.format in LAUNCH_FORMATS:
        from mpipe_core.formats.launch_config import emit_evaluation, global_batch_of

        text, notes = emit_evaluation(ev, global_batch_of(ev), args.format), []
    else:
        text, notes = export_text(ev, args.format)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    write_output(text, args.output)
    return 0


def _export_torchtitan(args) -> int:
    from mpipe_core.api import evaluate
    from mpipe_core.formats.torchtitan import CSV_NAME, LLAMA_FQNS, torchtitan_files

    if not args.output:
        raise MpipeError("--format torchtitan writes a folder (schedule.csv, torchtitan.toml): give -o DIR")
    folder = Path(args.output)
    if folder.exists() and not folder.is_dir():
        raise MpipeError(f"{folder}: exists and is not a folder")
    ev = evaluate(args.term, load_workload_arg(args))  # with --parallel, as every other format
    files, notes = torchtitan_files(ev, str(folder / CSV_NAME), args.fqn_template or LLAMA_FQNS)
    from mpipe_core.formats.launch_config import global_batch_of, with_layout
    from mpipe_core.formats.torchtitan import TOML_NAME

    files[TOML_NAME] = with_layout(files[TOML_NAME], ev, global_batch_of(ev))  # an analytic layout's degrees
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    except OSError as error:
        raise MpipeError(f"{folder}: cannot write ({error.strerror or error})") from None
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {', '.join(str(folder / n) for n in files)}", file=sys.stderr)
    return 0


def cmd_import_csv(args) -> int:
    from mpipe_core.algebra.combinators.encoders import fuse_encoders
    from mpipe_core.algebra.terms.ast import Call
    from mpipe_core.api import Evaluation
    from mpipe_core.formats.torch_csv import from_torch_csv
    from mpipe_core.simulation.simulator import simulate
    from mpipe_core.workloads.inputs import CSV_FILE_LIMIT, decode_utf8, read_bounded

    path = Path(args.file)
    text = decode_utf8(read_bounded(path, CSV_FILE_LIMIT, "the CSV file"), str(path))
    wl = load_workload_arg(args)
    schedule = from_torch_csv(text, source=str(path))
    try:
        schedule = fuse_encoders(schedule, wl)
        ev = Evaluation(f"csv({path.name})", Call("csv"), wl, schedule, simulate(schedule, wl))
    except MpipeError as error:  # an incomplete or deadlocking schedule: say which file
        raise MpipeError(f"{path}: {error.message}") from None
    return _print_evaluation(ev, args)


def cmd_compare(args) -> int:
    from mpipe_core.compare import compare

    rows = compare(args.terms, load_workload_arg(args))
    if args.json:
        json.dump([r.as_dict() for r in rows], sys.stdout)
        sys.stdout.write("\n")
        return 0
    print(compare_table(rows))
    for r in rows:
        if r.transpose is not None:
            print(f"\n{r.evaluation.term}:\n  {r.transpose.verdict()}")
        if r.layout is not None:
            print(f"\n{r.evaluation.term}:\n  {r.layout.verdict()}")
            for line in r.layout.device_lines():
                print(f"    {line}")
    return 0


def compare_table(rows) -> str:
    """`mpipe compare`'s table: the one lower bound every row's efficiency divides
    (named, with the term it is of), the device memory, then a row per term
    with its units in the column heads and whether it fits."""
    from mpipe_core.compare import shared_bound
    from mpipe_core.workloads.units import human, quantity

    wl = rows[0].evaluation.workload
    time_unit, memory_unit = wl.time_unit, wl.memory_unit
    bound, of = shared_bound(rows)
    capacity = rows[0].evaluation.metrics.capacity
    step = rows[0].evaluation.step is not None  # an analytic workload: MFU and the step in seconds lead
    heads = (("MFU", "step (s)") if step else ()) + (
        "makespan" + (f" ({time_unit})" if time_unit else ""), "speedup", "bubble", "eff",
        "peak mem" + (f" ({memory_unit})" if memory_unit else ""), "fits")
    width = max(len(r.evaluation.term) for r in rows)
    cells = []
    for r in rows:
        m = r.evaluation.metrics
        fits = {True: "yes", False: "no", None: "?"}[m.fits]
        lead = (f"{r.evaluation.step.mfu:.1%}", human(r.evaluation.step.step_time_s)) if step else ()
        cells.append(lead + (human(m.makespan), f"{r.speedup:.2f}x", f"{m.bubble_ratio:.1%}",
                             f"{r.shared_efficiency:.1%}", human(max(m.peak_memory, default=0.0)), fits))
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = [f"lower bound {quantity(bound, time_unit)}: the lowest of the rows' own ({of}); "
             f"eff = this bound / makespan, the same for every row",
             f"device memory {quantity(capacity, memory_unit)}" if capacity is not None
             else "device memory unknown (fits: ?)", "",
             f"{'term':<{width}}  " + " ".join(f"{h:>{w}}" for h, w in zip(heads, widths))]
    for r, c in zip(rows, cells):
        lines.append(f"{r.evaluation.term:<{width}}  " + " ".join(f"{v:>{w}}" for v, w in zip(c, widths)))
    if step:
        from mpipe_core.workloads.device_source import device_source

        source = device_source(wl.source)
        if source is not None:  # what every row's step time rests on
            lines += ["", f"device {source.text()}"]
    return "\n".join(lines)


def cmd_terms(args) -> int:
    from mpipe_core.algebra.terms.signatures import signatures
    from mpipe_core.workloads.presets import PRESETS

    table = signatures()
    for kind in ("generator", "combinator"):
        print(f"{kind}s:")
        for sig in table.values():
            if sig.kind == kind:
                print(f"  {sig.usage():<60} {sig.doc}")
    print("workload presets: " + ", ".join(PRESETS))
    return 0
