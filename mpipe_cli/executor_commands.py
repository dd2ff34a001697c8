"""`mpipe run`: execute an evaluated schedule for real (torch.distributed) and
report measured timings, the loss, each rank's measured memory against the
prediction, and with --check-grads the gradient check against a
single-process reference run."""
from __future__ import annotations

import json
import sys

from mpipe_core.errors import MpipeError
from mpipe_core.runs.run_options import BACKENDS, MAX_STEPS, PRECISIONS
from mpipe_core.workloads.units import MS_PER_TIME_UNIT

from .arg_types import int_in, number_in, parallel_spec, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run a schedule for real on torch.distributed (gloo/nccl/hccl)")
    p.add_argument("term", nargs="?", default=None, help='a term, e.g. "zbv(p=2, m=8)" (or give --spec)')
    p.add_argument("--spec", default=None, metavar="FILE",
                   help="a run spec (JSON: workload, layout, term; what `mpipe plan --emit mpipe` writes) "
                        "instead of a term, --workload and --parallel")
    p.add_argument("--scale", default=None, metavar="dp=K",
                   help="with --spec: run its layout with K data-parallel replicas (tp, cp, pp and the "
                        "schedule stay), e.g. a 512-device plan on 8 devices")
    p.add_argument("--parallel", type=parallel_spec, default=None, metavar="KEY=VALUE,...",
                   help="the run's layout over the workload's parallel section: tp, sp, cp, dp, "
                        "distributed_optimizer, encoder_shard (world = tp*cp*pp*dp; pp is the term's devices)")
    p.add_argument("--model", default=None,
                   help="executor model preset (tiny, tiny-text, tiny-frozen, tiny-varimg, small, "
                        "vit-heavy; default tiny, or tiny-text when the workload has no encoder), or an own "
                        "model: hf:llava, hf:qwen2_5_vl, hf:/path/to/checkpoint, a registered name (mpipe models) "
                        "or package.module:factory (your own code: only mpipe run and mpipe profile import it)")
    p.add_argument("--workload", default=None,
                   help="core workload (preset or file): its LLM layers, encoder and images shape the built-in "
                        "model; with an own model its costs predict the run (e.g. from mpipe profile)")
    add_own_model_arguments(p)
    p.add_argument("--data", default=None, metavar="FILE",
                   help="plan each step from its drawn batch: a data section (JSON, docs/data.md) or a .jsonl of "
                        "samples; with per_batch(t) every step gets its own plan (docs/running.md)")
    p.add_argument("--plan-budget-ms", type=number_in(0, lo_open=True), default=None,
                   help="per_batch's planning budget per step, CPU milliseconds (default 50)")
    p.add_argument("--nproc", type=positive_int, default=None, help="ranks per node (default: the schedule's devices)")
    p.add_argument("--backend", default="gloo", choices=BACKENDS)
    p.add_argument("--steps", type=int_in(1, MAX_STEPS), default=1, help="training steps (optimizer step after each)")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--lr", type=number_in(0, lo_open=True), default=None)
    p.add_argument("--check-grads", action="store_true",
                   help="compare loss and every gradient with a single-process reference run")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="run the steps under the device's profiler, every op labelled mpipe:<module>:<kind>:<mb>:"
                        "<chunk>, and write each rank's trace to DIR: on NPU (hccl) torch_npu's *_ascend_pt folders, "
                        "on CUDA (nccl) and CPU (gloo) rank<R>_trace.json; `mpipe import-trace DIR` reads it back "
                        "(docs/trace-import.md)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="bf16: bf16 compute (autocast), fp32 master weights and gradient reductions; --check-grads "
                        "then compares with a bf16 reference at the bf16 tolerance (docs/running.md)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--timeout", type=number_in(0, lo_open=True), default=None,
                   help="seconds without progress before the run is declared hung (default: run_setup.INTERACTIVE_STALL_S, 60)")
    p.add_argument("--in-process", action="store_true",
                   help="run the ranks as threads of this process (no torchrun; CPU only)")
    p.add_argument("--nnodes", type=positive_int, default=1)
    p.add_argument("--node-rank", type=int_in(0), default=0)
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (multi-node)")
    p.add_argument("--run-dir", default=None, help="where ranks write results (shared across nodes)")
    p.set_defaults(handler=run_command)


def add_own_model_arguments(p) -> None:
    p.add_argument("--model-config", default=None,
                   help="passed to an own model (hf: tiny, tiny-frozen, small, small-frozen; a checkpoint: frozen)")
    p.add_argument("--microbatch-size", type=int, default=1, help="own models: samples per microbatch")
    p.add_argument("--seq-len", type=int, default=8, help="own models: text tokens per sample (at most)")
    p.add_argument("--images", type=int, default=1, help="own models: images per sample")


def batch_shape(args):
    """An own model's `BatchShape` from --microbatch-size, --seq-len and --images."""
    from mpipe_core.runs.model_spec import BatchShape

    for name in ("microbatch_size", "seq_len", "images"):
        if getattr(args, name) < 1:
            raise MpipeError(f"--{name.replace('_', '-')} must be >= 1")
    return BatchShape(microbatch_size=args.microbatch_size, images=args.images, text_len=args.seq_len)


def _check_profile_folder(folder: str) -> None:
    """--profile DIR: a folder that can be made and written, and holds no traces yet (the import reads them all)."""
    import os
    from pathlib import Path

    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise MpipeError(f"--profile {folder}: not a folder")
    if path.is_dir() and any(path.iterdir()):
        raise MpipeError(f"--profile {folder}: not empty; give a new or empty folder (import-trace reads every "
                         f"trace in it)")
    parent = path if path.is_dir() else next((p for p in path.absolute().parents if p.exists()), Path("/"))
    if not os.access(parent, os.W_OK):
        raise MpipeError(f"--profile {folder}: cannot write there (permission denied)")


def run_command(args) -> int:
    from executor.errors import RunFailed
    from executor.service.launch import LaunchOptions, launch
    from executor.service.run_setup import INTERACTIVE_STALL_S, RunSpec, prepare

    if args.timeout is None:  # resolved here so that building the parser imports no executor code
        args.timeout = INTERACTIVE_STALL_S
    term, workload, layout = _term_workload_layout(args)
    if args.profile is not None:
        if args.in_process:
            raise MpipeError("--profile needs one process per rank (torchrun): leave out --in-process")
        _check_profile_folder(args.profile)
    prep = prepare(RunSpec(
        term=term, workload=workload, model=args.model, model_config=args.model_config,
        shape=batch_shape(args), steps=args.steps,
        nproc=args.nproc, nnodes=args.nnodes, backend=args.backend, optimizer=args.optimizer, lr=args.lr,
        check_grads=args.check_grads, stall_s=args.timeout, data=args.data,
        plan_budget_ms=args.plan_budget_ms, profile=args.profile, layout=layout, parallel=args.parallel,
        precision=args.precision))
    ev, cfg, job, devices = prep.evaluation, prep.model, prep.job, prep.world
    own = job.own_model is not None
    try:
        if args.in_process:
            if args.backend != "gloo":
                raise MpipeError("--in-process runs on CPU threads; drop --backend")
            if prep.layout.tp > 1:
                raise MpipeError(f"--in-process: tp={prep.layout.tp} shards on a torch.distributed device "
                                 "mesh (one process per rank): leave out --in-process")
            from executor.runtime.rank import run_local

            results = run_local([job], devices, timeout_s=args.timeout)
        else:
            results = launch([job], LaunchOptions(
                nproc=prep.nproc_per_node, backend=args.backend, stall_s=args.timeout, nnodes=args.nnodes,
                node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint, run_dir=args.run_dir))
    except RunFailed as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    if not results:  # a non-zero node rank of a multi-node run: rank 0 reports
        return 0
    result = results[0]
    from executor.service.run_setup import model_prediction, runs_same_model, what_ran

    ran, same = what_ran(prep), runs_same_model(prep)
    own_ev = model_prediction(prep)  # the model that ran: the default prediction
    predicted = own_ev.summary()["makespan"]
    out = {
        "term": ev.term, "workload": ev.workload.name, "model": cfg.to_dict(), "backend": args.backend,
        "devices": devices, "layout": prep.layout.to_dict(), "steps": args.steps, "loss": result.loss,
        "makespan": result.makespan, "makespan_unit": "s",
        "predicted_makespan": predicted, "predicted_unit": own_ev.workload.time_unit or "workload time units",
        "predicted_workload": own_ev.workload.name,
        "timeline": result.to_dict()["timeline"], "clock_offsets": result.clock_offsets,
        # The first pipeline's timed collectives and optimizer steps (kinds: timeline_record.COMM_KINDS).
        "comm": [r.as_dict() for r in result.comm],
        "ran": ran, "same_model": same,
        "across_models": None if same else {"workload": ev.workload.name, "makespan": ev.summary()["makespan"],
                                            "unit": ev.workload.time_unit},  # False: the workload is another model's (predictions compare across models)
    }
    memory = None
    if result.memory is not None:
        from executor.analysis.memory_check import compare_memory

        from executor.analysis.layout_memory import layout_metrics

        metrics = layout_metrics(ev, prep.layout)  # a profiled workload's state as the layout shards it (ZeRO-1, encoder_shard)
        memory = compare_memory(metrics, ev.workload.memory_unit, result.memory, ev.workload.name)
        out["memory"] = result.memory  # per rank, bytes: activation peak (and its op), parameters, ...
        out["predicted_memory"] = {"unit": ev.workload.memory_unit,
                                   "peak_activation": metrics.peak_activation_memory,
                                   "static": metrics.static_memory}
        out["memory_check"] = memory.as_dict()
    check = result.grad_check
    if check is not None:
        out["grad_check"] = check
    if result.plans is not None:
        out["plans"] = result.plans
    if args.json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(f"{ev.term} on {devices} ranks ({args.backend}), {args.steps} step(s)"
              + (f", model {cfg}" if own else "")
              + (f", layout {prep.layout.describe()}" if devices != prep.devices else ""))
        for line in ran:
            print(f"  {line}")
        for s, (loss, span) in enumerate(zip(result.loss, result.makespan)):
            print(f"  step {s}: loss {loss:.6f}  measured makespan {span * 1000:.1f} ms")
            if result.plans is not None:
                from executor.service.data_run import plan_line

                print("    " + plan_line(result.plans[s]))
        print("  " + predicted_line(predicted, own_ev.workload.time_unit)
              + ("" if same else f" (on {own_ev.workload.name}, the structure of the model that ran)"))
        if not same:  # another model's figures: shown for what they are, never as this run's prediction
            print("  across models (not a prediction of this run): "
                  + predicted_line(ev.summary()["makespan"], ev.workload.time_unit)
                  .replace("predicted makespan", f"workload {ev.workload.name} simulates a makespan of"))
        if memory is not None:
            lines = memory.lines()
            if not same:
                lines = [f"across models (not a prediction of this run): {lines[0]}"] + lines[1:]
            print("  " + "\n  ".join(lines))
        from executor.service.build_memory import build_memory_line

        built = build_memory_line(result.memory)
        if built is not None:
            print("  " + built)
        if check is not None:
            from executor.runtime.gradient_agreement import verdict_line

            print(f"  {verdict_line(check)}")
            precision = check.get("precision", "fp32")
            against = "" if precision == "fp32" else f", {precision} against a {precision} reference"
            print(f"    (rule: {check['rule']}, terms {check['terms']}{against}; docs/running.md)")
            for s, step in enumerate(check["steps"]):
                for line in step["failures"][:10]:
                    print(f"    step {s}: {line}")
    if check is not None and not check["ok"]:
        return 1
    return 0


def _term_workload_layout(args):
    """(term, workload, layout) from a run spec (`--spec`, `--scale`) or from the term and
    --workload (the layout then comes from the workload's parallel section and --parallel)."""
    if args.spec is None:
        if args.term is None:
            raise MpipeError("give a term (e.g. \"1f1b(p=2, m=4)\") or --spec FILE")
        if args.scale is not None:
            raise MpipeError("--scale scales a run spec's layout: give --spec FILE with it")
        workload = args.workload
        if args.parallel and workload is not None:  # an analytic workload prices the run with them too
            from mpipe_core.workloads.workload import load_workload, with_parallel

            loaded = load_workload(workload)
            if isinstance(loaded.source, dict) and "model" in loaded.source:
                workload = with_parallel(loaded, args.parallel)
        return args.term, workload, None
    from mpipe_core.runs.layout import parse_scale
    from mpipe_core.runs.run_spec import read_run_spec

    if args.term is not None or args.workload is not None or args.parallel is not None:
        raise MpipeError("--spec gives the term, the workload and the layout: drop the term, --workload "
                         "and --parallel")
    spec = read_run_spec(args.spec)
    if args.scale is not None:
        spec = spec.scaled(parse_scale(args.scale))
    return spec.term, spec.workload, spec.layout



def predicted_line(predicted: float, time_unit: str) -> str:
    """The prediction in the measured steps' unit (ms), or why it cannot be: a
    workload without a time unit (the uniform default) is in abstract units."""
    if time_unit:
        return f"predicted makespan {predicted * MS_PER_TIME_UNIT[time_unit]:.1f} ms"
    return (f"predicted makespan {predicted:.4g} workload units (the workload states no time unit, so this is "
            f"not in ms; profile the model with `mpipe profile` for a workload in seconds)")
