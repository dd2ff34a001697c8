"""`mpipe eval`, `export`, `import-csv`, `compare`, `terms`: the core's commands."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mpipe_core.errors import MpipeError
from mpipe_core.formats.export import FORMATS, LAUNCH_FORMATS, STACK_FORMATS

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
                   help="preset name or .json/.toml file (default: uniform, F=B=W=1 per chunk)")
    parallel_arg(p)


def parallel_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parallel", type=parallel_spec, default=None, metavar="KEY=VALUE,...",
                   help="an analytic workload's parallel section, e.g. tp=8,sp (keys: tp, sp, flash_attention, "
                        "dp, distributed_optimizer; docs/memory.md)")


def load_workload_arg(args):
    """The workload `--workload` names, with `--parallel` applied."""
    from mpipe_core.workloads.workload import load_workload, with_parallel

    wl = load_workload(args.workload)
    return wl if args.parallel is None else with_parallel(wl, args.parallel)


def _summary_text(summary: dict) -> str:
    lines = [
        f"term         {summary['term']}",
        f"devices      {summary['devices']}    ops {summary['ops']}",
        f"makespan     {summary['makespan']:.4g}",
        f"bubble ratio {summary['bubble_ratio']:.1%}",
        f"lower bound  {summary['lower_bound']:.4g}    efficiency {summary['efficiency']:.1%}",
        "idle         " + " ".join(f"{x:.3g}" for x in summary["idle"]),
        "peak memory  " + " ".join(f"{x:.3g}" for x in summary["peak_memory"]),
    ]
    if any(summary["static_memory"]):
        lines.append("static       " + " ".join(f"{x:.3g}" for x in summary["static_memory"]))
    if summary["capacity"] is not None:
        lines.append(f"capacity     {summary['capacity']:.4g}    {fit_text(summary)}")
    if "step_time_s" in summary:
        lines[1:1] = step_lines(summary)
    return "\n".join(lines)


def step_lines(summary: dict) -> list[str]:
    """MFU and the step time first, with units (an analytic workload's step figures)."""
    b = summary["breakdown"]
    parts = ", ".join(f"{k.replace('_', ' ')} {b[k]:.3g} s" for k in
                      ("compute", "tp_comm", "cp_comm", "encoder_comm", "bubble", "dp_comm", "optimizer") if b[k])
    lines = [f"MFU          {summary['mfu']:.1%}    step time {summary['step_time_s']:.4g} s    "
             f"HFU {summary['hfu']:.1%}",
             f"throughput   {summary['tokens_per_s']:.4g} tokens/s    {summary['samples_per_s']:.4g} samples/s    "
             f"{summary['model_tflops_per_device']:.4g} model TFLOP/s per device on {summary['devices_total']} devices",
             f"step         {parts} (device {summary['critical_device']})"]
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
    print(_summary_text(summary))
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

    return _print_evaluation(evaluate(args.term, load_workload_arg(args), max_ops=args.max_ops), args)


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
    width = max(len(r.evaluation.term) for r in rows)
    step = rows[0].evaluation.step is not None
    extra = f"{'MFU':>6} {'step s':>8} " if step else ""
    print(f"{'term':<{width}}  {extra}{'makespan':>9} {'speedup':>7} {'bubble':>7} {'eff':>6} {'peak mem':>9}")
    for r in rows:
        s = r.evaluation.summary()
        lead = f"{s['mfu']:>6.1%} {s['step_time_s']:>8.4g} " if step else ""
        print(f"{s['term']:<{width}}  {lead}{s['makespan']:>9.4g} {r.speedup:>6.2f}x {s['bubble_ratio']:>7.1%} "
              f"{s['efficiency']:>6.1%} {max(s['peak_memory']):>9.3g}")
    for r in rows:
        if r.transpose is not None:
            print(f"\n{r.evaluation.term}:\n  {r.transpose.verdict()}")
        if r.layout is not None:
            print(f"\n{r.evaluation.term}:\n  {r.layout.verdict()}")
            for line in r.layout.device_lines():
                print(f"    {line}")
    return 0


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
