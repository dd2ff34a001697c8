"""`mpipe tune`: which schedule to run, and how much better it is than the baselines."""
from __future__ import annotations

import json
import sys

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.cluster import devices_text
from mpipe_core.workloads.units import human, quantity, seconds

from .arg_types import memory_cap
from .core_commands import db_arg, load_workload_arg, parallel_arg


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="search the algebra for the fastest schedule (Pareto front of "
                                           "makespan vs peak memory)")
    p.add_argument("--workload", "-w", default=None,
                   help="preset name, .json/.toml file or saved:NAME[@N] from the library")
    parallel_arg(p)
    db_arg(p)
    p.add_argument("--devices", "-p", type=int, required=True,
                   help="devices in all: with --parallel tp·cp·dp > 1 the pipeline gets devices / (tp·cp·dp) of "
                        "them (a disaggregated layout gives some of those to the encoders)")
    p.add_argument("--microbatches", "-m", type=int, required=True, help="microbatches M per step")
    p.add_argument("--memory-cap", type=memory_cap, default=None,
                   help="per-device peak memory limit, static + activations (default: the workload's device "
                        "memory where known; none: no cap)")
    p.add_argument("--top", type=int, default=10, help="show the K fastest candidates (plus the Pareto front)")
    p.add_argument("--time-limit", type=float, default=45.0,
                   help="seconds for the search (and again for --exact's solver)")
    p.add_argument("--exact", action="store_true",
                   help="also solve the encoder placement exactly (OR-Tools CP-SAT; small instances)")
    p.add_argument("--encoder-devices", type=_counts, default=None, metavar="K[,K...]",
                   help="encoder-device counts disaggregate tries (default: 1, 2 and those near the encoders' "
                        "share of the work); each must be less than --devices")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(handler=cmd_tune)


def _counts(text: str) -> tuple[int, ...]:
    import argparse

    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers like 2 or 1,2,4, got {text[:40]!r}") from None
    if any(k < 1 for k in counts):
        raise argparse.ArgumentTypeError(f"each must be >= 1, got {text[:40]}")
    return counts


def cmd_tune(args) -> int:
    from mpipe_core.search.tune import SearchStopped, pipeline_devices, tune

    if args.top < 1:
        raise MpipeError(f"--top must be >= 1 (got {args.top})")
    wl = load_workload_arg(args)
    cap = None if args.memory_cap == "none" else wl.capacity if args.memory_cap is None else args.memory_cap
    stages = pipeline_devices(wl, args.devices)  # --devices counts every device, tp·cp·dp of them per stage
    if args.exact:  # refuse a too-big instance before searching
        from mpipe_core.search.exact import check_size

        check_size(wl, stages, args.microbatches)

    def progress(text: str) -> None:
        print(f"tune: {text}", file=sys.stderr, flush=True)

    try:
        result = tune(wl, stages, args.microbatches, cap, args.time_limit, progress,
                      encoder_devices=args.encoder_devices, cap_is_capacity=args.memory_cap is None)
    except SearchStopped as stopped:  # what the search found before it failed, then the error (exit 2)
        if args.json:
            json.dump({"lower_bound": stopped.lower_bound, "memory_cap": cap, "capacity": wl.capacity,
                       "found": [c.as_dict(stopped.lower_bound, False) for c in stopped.found]}, sys.stdout)
            sys.stdout.write("\n")
        else:
            print(render_found(stopped, cap, wl.memory_unit, wl.time_unit))
        sys.stdout.flush()
        raise
    if args.exact:
        from mpipe_core.search.exact import solve_for

        result.optimal = solve_for(result, wl, stages, args.microbatches, args.time_limit, progress)
    doc = result.as_dict(top=args.top)
    from mpipe_core.workloads.device_source import device_source

    source = device_source(wl.source)
    if source is not None:  # an analytic workload: what its step times rest on
        doc["device_source"] = source.as_dict()
    if args.json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return 0
    per, dies = args.devices // stages, _dies(wl)
    if per > 1 or dies > 1:  # the devices in all, where they are more than the pipeline's or are dies
        print(devices_text(args.devices, dies) + ("" if per == 1 else f": {stages} pipeline devices, each "
                                                 f"tp·cp·dp = {per} devices"))
    print(render(doc, result.exact, wl.memory_unit, _dies(wl)))
    return 0


def _dies(wl) -> int:
    """Dies per NPU of the workload's cluster, else its device's (1 for an explicit workload)."""
    from mpipe_core.search.plan import dies_per_npu

    return dies_per_npu(wl.source)


BASELINE_NAMES = {"fused": "fused", "balanced": "balanced", "colocated": "colocated (Megatron MIMO)",
                  "disaggregated": "disaggregated (best)", "transpose": "transpose (best)"}


def _over(baseline: dict, cap: float | None, suffix: str) -> str:
    """A baseline is the fastest of its kind that fits, else the fastest: say when it misses the cap."""
    if cap is None or baseline["peak_memory"] <= cap + 1e-12:
        return ""
    return f"  (none of its kind fits the memory cap: needs {baseline['peak_memory']:.4g}{suffix})"


def render(doc: dict, exact=None, unit: str = "", dies_per_npu: int = 1) -> str:
    baselines = {name: b for name, b in doc["baselines"].items() if b is not None}
    fused, balanced = doc["baselines"]["fused"], doc["baselines"]["balanced"]
    rows = doc["candidates"]
    width = max(len(r["term"]) for r in rows + [fused, balanced])
    suffix = f" {unit}" if unit else ""
    cap, capacity = doc["memory_cap"], doc["capacity"]
    memory = (f"memory cap {cap:.4g}{suffix}" if cap is not None else "no memory cap") + \
             (f" (device memory {capacity:.4g}{suffix})" if capacity is not None else " (device memory unknown)")
    lines = [f"lower bound {doc['lower_bound']:.5g}", memory, "",
             f"{'baseline':<26} {'makespan':>10} {'peak mem':>9} {'speedup':>8}  term"]
    for name, b in baselines.items():
        lines.append(f"{BASELINE_NAMES.get(name, name):<26} {b['makespan']:>10.5g} {b['peak_memory']:>9.4g} "
                     f"{fused['makespan'] / b['makespan']:>7.2f}x  {b['term']}{_over(b, cap, suffix)}")
    lines += ["(speedup: over fused; every baseline on the same devices in all)", "",
              f"{'term':<{width}}  {'makespan':>10} {'peak mem':>9} {'static':>8} {'fits':>4} {'eff':>6} "
              f"{'vs fused':>8} {'vs bal':>7}  pareto"]
    fit_word = {True: "yes", False: "no", None: "?"}
    for r in rows:
        lines.append(f"{r['term']:<{width}}  {r['makespan']:>10.5g} {r['peak_memory']:>9.4g} "
                     f"{r['static_memory']:>8.4g} {fit_word[r['fits']]:>4} {r['efficiency']:>6.1%} "
                     f"{fused['makespan'] / r['makespan']:>7.2f}x {balanced['makespan'] / r['makespan']:>6.2f}x  "
                     f"{'*' if r['pareto'] else ''}")
    best = doc["best"]
    over = ", ".join(f"{b['makespan'] / best['makespan']:.2f}x over {name}" for name, b in baselines.items())
    lines += ["", f"best: {best['term']}  ({over}; efficiency {best['efficiency']:.1%})"]
    first = next((r for r in rows if r["term"] == best["term"]), None)
    if first is not None and "mfu" in first:  # an analytic workload: MFU and the step in seconds
        lines.append(f"best's step: MFU {first['mfu']:.1%}, step time {seconds(first['step_time_s'])}, "
                     f"{human(first['tokens_per_s'])} tokens/s on "
                     f"{devices_text(first['devices_total'], dies_per_npu)}")
        if doc.get("device_source") is not None:
            lines.append(f"device: {doc['device_source']['text']}")
    opt = doc["optimal"]
    if opt is not None:
        state = "proved optimal" if opt["proved"] else "not proved"
        lines.append(f"exact encoder placement: makespan {opt['makespan']:.5g} ({state}, gap {opt['gap']:.2%})"
                     + (f"; its family's best heuristic {exact.term}: {exact.heuristic:.5g} "
                        f"(heuristic gap {exact.heuristic / opt['makespan'] - 1:.2%})" if exact else ""))
    return "\n".join(lines)


def render_found(stopped, cap: float | None, memory_unit: str = "", time_unit: str = "") -> str:
    """The candidates a stopped search had evaluated, fastest first, as tune's table."""
    rows = stopped.found
    width = max(len(c.term) for c in rows)
    fit_word = {True: "yes", False: "no", None: "?"}
    within = [c for c in rows if cap is None or c.peak_memory <= cap + 1e-12]
    head = (f"the search stopped: the {len(rows)} candidates it had evaluated "
            f"({len(within)} within the memory cap), fastest first; lower bound "
            f"{quantity(stopped.lower_bound, time_unit)}")
    lines = [head, "", f"{'term':<{width}}  {'makespan':>12} {'peak mem':>10} {'fits':>4} {'eff':>6}"]
    for c in rows:
        lines.append(f"{c.term:<{width}}  {quantity(c.makespan, time_unit):>12} "
                     f"{quantity(c.peak_memory, memory_unit):>10} {fit_word[c.fits]:>4} "
                     f"{stopped.lower_bound / c.makespan if c.makespan else 1.0:>6.1%}")
    return "\n".join(lines)
