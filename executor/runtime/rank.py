"""What each rank runs: a list of jobs, one after another, on one process group.

A world of several pipelines (dp, tp, cp > 1: the job's layout) is laid out by
`executor.parallel.grid`: each rank runs its pipeline's plan through a view of
the transport that maps the plan's devices to global ranks
(`parallel.pipeline_transport`), and reduces its gradients with its dp group.

`run_job` is shared by the torchrun entry point (`python -m executor.runtime.rank`,
started by `executor.service.launch`) and by the in-process thread runner
(`run_local`).  Rank 0 gathers every rank's timings and measured memory (and gradients with
`check_grads`), aligns the clocks, compares with the reference run and returns
the job's result; the torchrun entry appends it to a JSON-lines file as soon
as a job ends.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import struct
import sys
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from mpipe_core.ir.timeline_record import TimelineRecord

from mpipe_core.errors import MpipeError

from ..errors import ExecutorError, OpFailure
from ..parallel.collective_timer import tp_collective_timer
from ..parallel.context_parallel import (adopt_reduction_group, context_parallel_model, rank_context_parallel,
                                         reduction_members)
from ..parallel.data_parallel import DataParallel
from ..parallel.encoder_shard import encoder_copies
from ..parallel.grid import ProcessGrid
from ..parallel.pipeline_transport import PipelineTransport
from ..parallel.tensor_parallel import (full_values, rank_tensor_parallel, reports_loss, tensor_parallel_model,
                                        whole_zero_gradients)
from ..timing_stream import StepWriter, host_label
from .jobs import Job, JobResult, schedule_from_dict
from .op_profiler import profiling, step_range
from .models.materialise import BuildMemory, current_rss
from .models.chunks import model_chunks
from .plan import build_plan
from .step_plans import DataStep, check_same_placement
from .gradient_agreement import RULE
from .reference import check_final, check_step, references
from .runtime import CpuClock, EventClock, OptimizerSpec, RankRuntime
from .transport import DistTransport, LocalHub, LocalTransport


def job_grid(job: Job, devices: int, world: int) -> ProcessGrid:
    """The job's process grid, checked against the schedule's devices and the ranks started."""
    try:
        layout = job.run_layout(devices)
    except MpipeError as error:
        raise ExecutorError(f"job '{job.name}': {error.message}") from None
    if layout.pp != devices:
        raise ExecutorError(f"job '{job.name}': the layout's pp={layout.pp} but the schedule has {devices} devices")
    if layout.world != world:
        if layout.world == devices:
            raise ExecutorError(f"job '{job.name}': the schedule has {devices} devices but "
                                f"{world} ranks were started")
        raise ExecutorError(f"job '{job.name}': the layout {layout.describe()} but {world} ranks were started")
    return ProcessGrid(layout)


def run_job(job: Job, transport, rank: int, *, device: torch.device, clock, offset: float,
            timeout_s: float, on_progress=None, reference_cache: dict | None = None,
            on_step=None, meshes: dict | None = None) -> JobResult | None:
    """Run one job on this rank; rank 0 returns the job's result, the others None.

    `on_step(record, ops, rows)` is called after every step (and its optimizer
    step) with its `StepRecord`, this rank's plan ops and the step's other timed
    work (`RankRuntime.take_rows`): the live timing stream.  `meshes`: where
    the torchrun entry keeps each layout's `DeviceMesh` (built once per layout:
    creating groups is a collective call); None: no mesh (threads)."""
    schedule = schedule_from_dict(job.schedule)
    plan = build_plan(schedule)
    grid = job_grid(job, plan.devices, transport.world)
    layout = grid.layout
    if meshes is not None and layout not in meshes:
        meshes[layout] = grid.build_mesh(device.type)
        grid.adopt_groups(meshes[layout], transport, rank)
        adopt_reduction_group(meshes[layout], grid, transport, rank)
    coords = grid.coords(rank)
    view = PipelineTransport(transport, grid, rank) if len(grid.pipelines()) > 1 else transport
    stage = coords["pp"]
    # Gradients are summed over dp x cp (a cp rank holds a block of its replica's sequence).
    reduce_over = reduction_members(grid, rank)
    dp = (DataParallel(transport, reduce_over, reduce_over.index(rank), rank, zero=layout.distributed_optimizer,
                       fault=job.fault, data_replica=coords["dp"], data_replicas=layout.dp)
          if len(reduce_over) > 1 else None)
    # `encoder_shard`: the groups of the encoder's copies (every rank creates them), this rank's place.
    copies = encoder_copies(grid, plan, rank, transport, layout.encoder_shard, job.fault)
    data = _data_steps(job, coords["dp"])
    step_plans = [d.plan for d in data] if data is not None else [plan] * job.steps
    opt = OptimizerSpec(**job.optimizer)
    # Its tp place first: that imports DTensor's machinery, which is not the model's build.
    tp = (rank_tensor_parallel(grid, rank, None if meshes is None else meshes[layout], layout.sp, job.fault)
          if layout.tp > 1 else None)
    before = current_rss()  # each rank builds only its part (`models.materialise`): measure what that costs
    model = job.build_model(partial=True)
    cp = None
    if layout.cp > 1:
        cp = rank_context_parallel(grid, rank, transport, None if meshes is None else meshes[layout], job.fault)
        layer_chunks = {i: c.index for c in model_chunks(model, plan.chunks, plan.layers) for i in c.layers}
        model = context_parallel_model(model, cp, layer_chunks)
    if tp is not None:  # outside cp (sp splits a cp block); sharded once its parts are built (`shard_held`)
        model = tensor_parallel_model(model, tp)
    rt = RankRuntime(model, step_plans[0], stage, view, device=device, clock=clock, optimizer=opt,
                     timeout_s=timeout_s, on_progress=on_progress, fault=job.fault, data=data, dp=dp,
                     precision=job.precision, encoder_copies=copies)
    rt.build = asdict(BuildMemory.of(before, rt.built_peak, rt.parameter_bytes))
    timer = None
    if tp is not None:  # DTensor's collectives inside each op, timed as tp_comm rows
        timer = tp_collective_timer(tp.mesh)
        rt.op_scope = timer.timing
    records, grads, comm = [], [], []
    with profiling(job.profile_dir, device, rank) as profiled:
        rt.label_ops = profiled
        for step in range(job.steps):
            transport.barrier()
            with step_range(step, profiled):
                rec = rt.run_step(step)
            records.append(rec)
            if job.check_grads:
                grads.append(rt.gradients() if tp is None else _whole_gradients(rt, tp, dp))
            rt.optimizer_step()
            rows = rt.take_rows()
            for extra in (cp, timer):
                if extra is not None:
                    rows = sorted(rows + extra.take_rows(), key=lambda r: r[2])
            comm.append(rows)
            if on_step is not None:
                on_step(rec, step_plans[step].ranks[stage].ops, rows)
    final = rt.parameters_cpu() if job.check_grads else None
    if final is not None and tp is not None:
        final = full_values(dict(rt.named_params), final)
    counts = reports_loss(grid, rank)  # tp ranks compute the same loss: one of them reports it
    mine = {
        "rank": stage,
        "global_rank": rank,
        "first": grid.is_first_pipeline(rank),
        "comm": comm,
        "offset": offset,
        "records": [dict(step=r.step, ops=r.ops, start=r.start, end=r.end, wait=r.wait,
                         step_start=r.step_start, step_end=r.step_end,
                         loss=None if r.loss is None or not counts else float(r.loss)) for r in records],
        "grads": grads,
        "final": final,
        # Whose final values are checked: the parameters it trained.  Under ZeRO-1 its gradients
        # name only its own slices, yet every element of what it trains must come back gathered.
        "trained": sorted({n for g in grads for n in g} | rt.gathered_names()) if job.check_grads else [],
        # Gradients held as slices (`gradient_pieces`) whose slices are spread over the encoder's
        # copies, not over this stage's dp ranks: merged over those copies for the check.
        "copy_sharded": sorted(rt.encoder_shard.reduced) if rt.encoder_shard is not None else [],
        "tp": coords["tp"],
        "memory": rt.memory().as_dict(),
    }
    gathered = transport.gather(mine)
    if rank != 0:
        return None
    return _assemble(job, step_plans, gathered, opt, reference_cache, data, layout.dp)


def _whole_gradients(rt: RankRuntime, tp, dp) -> dict:
    """Under tensor parallelism: this rank's gradients gathered over tp (a collective) into
    whole tensors for the check; under ZeRO-1 its slices joined over dp first, and under
    `encoder_shard` the tower's slices joined over its copies first."""
    params = dict(rt.named_params)
    grads = rt.gradients()
    out = {}
    if rt.encoder_shard is not None:  # the tower's slices, spread over its copies (same tp coordinate)
        tower = dict(rt.encoder_shard.params)
        out = whole_zero_gradients({n: grads.pop(n) for n in tower if n in grads}, tower, rt.encoder_shard.copies)
        params = {n: p for n, p in params.items() if n not in tower}
    if dp is not None and dp.zero:
        return {**whole_zero_gradients(grads, params, dp), **out}
    return {**full_values(params, grads), **out}


def _data_steps(job: Job, replica: int = 0) -> list[DataStep] | None:
    """A data run's steps: each one's execution plan and the packs of data-parallel
    replica `replica` (`step_plans`; every replica's kept for the step's global batch)."""
    if job.data_steps is None:
        return None
    if len(job.data_steps) != job.steps:
        raise ExecutorError(f"job '{job.name}': {len(job.data_steps)} planned steps for {job.steps} steps")
    steps = []
    for d in job.data_steps:
        everyone = d.get("replica_packs")
        if everyone is not None and not 0 <= replica < len(everyone):
            raise ExecutorError(f"job '{job.name}': planned for {len(everyone)} data-parallel replicas, "
                                f"not replica {replica}")
        packs = everyone[replica] if everyone is not None else d["packs"]
        steps.append(DataStep(build_plan(schedule_from_dict(d["schedule"])), packs, d["plan"], everyone))
    check_same_placement([d.plan for d in steps])
    return steps


def _merge_pieces(holders: list[dict], shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """ZeRO-1: one pipeline stage's reduced gradients put together from its dp ranks'
    slices (elements no rank reported stay NaN, so the check fails on them)."""
    out: dict[str, torch.Tensor] = {}
    for pieces in holders:
        for name, parts in pieces.items():
            shape = shapes.get(name)
            if shape is None:  # a gradient the reference lacks: reported as it is
                out[name] = torch.cat([t for _, _, t in parts])
                continue
            flat = out.setdefault(name, torch.full(shape, float("nan"))).view(-1)
            for a, b, t in parts:
                flat[a:b] = t
    return out


def _assemble(job: Job, step_plans: list, everyone: list[dict], opt, cache, data=None, dp: int = 1) -> JobResult:
    """The job's result from every rank's report: the timeline, memory and clock offsets
    of the first pipeline (tp = cp = dp = 0); the loss summed over every replica; with
    check_grads every rank's gradients and parameters against the reference run of the
    global batch (dp x the schedule's microbatches)."""
    plan = step_plans[0]
    steps = job.steps
    ranks = sorted((r for r in everyone if r["first"]), key=lambda r: r["rank"])
    timeline, waits = [], []
    makespans, losses = [], []
    base = None
    for s in range(steps):
        origin = min(r["records"][s]["step_start"] - r["offset"] for r in everyone)
        if base is None:
            base = origin
        end = origin
        for r in ranks:
            rec = r["records"][s]
            ops = [p.op for p in step_plans[s].ranks[r["rank"]].ops]
            for op, a, b, w in zip(ops, rec["start"], rec["end"], rec["wait"]):
                a, b = a - r["offset"], b - r["offset"]
                end = max(end, b)
                # In seconds; step = the run's step.
                timeline.append(TimelineRecord(r["rank"], op.module, op.kind, op.chunk, op.mb, s,
                                               a - base, b - base))
                waits.append(w)
        makespans.append(end - origin)
        parts = [r["records"][s]["loss"] for r in everyone if r["records"][s]["loss"] is not None]
        losses.append(sum(parts) if parts else None)
    comm = [TimelineRecord(r["rank"], "llm", kind, chunk, -1, s, a - r["offset"] - base, b - r["offset"] - base)
            for r in ranks for s, rows in enumerate(r["comm"]) for kind, chunk, a, b in rows]
    grad_check = None
    if job.check_grads:
        grad_check = _grad_check(job, step_plans, everyone, losses, opt, cache, data, dp)
    return JobResult(name=job.name, devices=plan.devices, chunks=plan.chunks, microbatches=plan.microbatches,
                     steps=steps, loss=losses, makespan=makespans, timeline=timeline, waits=waits,
                     clock_offsets=[r["offset"] for r in ranks], grad_check=grad_check,
                     memory=[r["memory"] for r in ranks],
                     plans=None if data is None else [d.record for d in data], comm=comm,
                     layout=job.layout)


def accumulated_terms(plan) -> int:
    """How many partial results a gradient is summed from in this run: one per
    microbatch and encoder shard, plus the all-reduce's members (the
    `gradient_agreement` rule's `terms`)."""
    shards = max(plan.shards.values(), default=1)
    return plan.microbatches * max(1, shards) + len(plan.ar_group)


def _grad_check(job: Job, step_plans: list, everyone: list[dict], losses: list, opt, cache, data,
                dp: int = 1) -> dict:
    """Every step's loss and gradients, and the parameters after the last step,
    against the references (`reference`) of the global batch (dp x the schedule's
    microbatches): one in the run's precision, one in float64."""
    steps, plan = job.steps, step_plans[0]
    global_mbs = plan.microbatches * dp
    key = (json.dumps([job.model, job.own_model, [d.get("replica_packs", d["packs"]) for d in job.data_steps or []]],
                      sort_keys=True),
           global_mbs, steps, json.dumps(job.optimizer, sort_keys=True), job.precision)
    if cache is not None and key in cache:
        refs = cache[key]
    else:
        drawn = None if data is None else (lambda model, step: data[step].global_batches(model))
        refs = references(job.build_model, global_mbs, steps, opt, drawn, job.precision)
        if cache is not None:
            cache[key] = refs
    ordered = sorted(everyone, key=lambda r: r["global_rank"])
    replicas = dp * (job.layout or {}).get("cp", 1)  # the gradient reduction's members (dp x cp)

    def held(s: int) -> list[dict]:
        """Every rank's gradients of step s; slices (ZeRO-1, `encoder_shard`) joined with the
        slices of the same tensor: a stage's dp ranks', or the encoder copies' (per tp)."""
        grads = [r["grads"][s] for r in ordered]
        if not any(isinstance(g, list) for d in grads for g in d.values()):
            return grads
        shapes = {n: tuple(g.shape) for n, g in refs.steps[s].grads.items()}
        whole = [{n: g for n, g in d.items() if not isinstance(g, list)} for d in grads]
        groups: dict[tuple, list[dict]] = {}
        for r, d in zip(ordered, grads):
            for n, g in d.items():
                if isinstance(g, list):
                    key = ("copies", r.get("tp", 0)) if n in r.get("copy_sharded", ()) else ("stage", r["rank"])
                    holders = groups.setdefault(key, [])
                    if not holders or holders[-1].get("_rank") != r["global_rank"]:
                        holders.append({"_rank": r["global_rank"]})
                    holders[-1][n] = g
        merged = [_merge_pieces([{n: g for n, g in h.items() if n != "_rank"} for h in holders], shapes)
                  for _, holders in sorted(groups.items())]
        return [d for d in whole if d] + merged

    # Partial sums per gradient element: the schedule's, and the dp x cp reduction's members.
    terms = max(accumulated_terms(p) for p in step_plans) + (replicas - 1)
    checks = [check_step(held(s), refs.steps[s], refs.truth_steps[s], losses[s], terms) for s in range(steps)]
    final = check_final([(r["global_rank"], {n: r["final"][n] for n in r["trained"]}) for r in ordered], refs,
                        terms)
    checks[-1]["failures"] += final["failures"]
    worst = max((w for w in [c["worst"] for c in checks] + [final["worst"]] if w is not None),
                key=lambda w: w["ratio"], default=None)
    if worst is not None:
        worst["step"] = next((s for s, c in enumerate(checks) if c["worst"] is worst), steps - 1)
    return {
        "ok": all(c["ok"] for c in checks) and final["ok"],
        "steps": checks,
        "max_abs_error": max(c["max_abs_error"] for c in checks),
        "max_rel_error": max(c["max_rel_error"] for c in checks),
        "loss_error": max(c["loss_error"] for c in checks),
        "final_params_max_rel_error": final["max_rel_error"],
        "final_params_ok": final["ok"],
        "worst": worst,
        "terms": terms,
        "rule": RULE,
        "precision": job.precision,
    }


# --------------------------------------------------------------------------- in-process runner

def run_local(jobs: list[Job], world: int, timeout_s: float = 60.0) -> list[JobResult]:
    """Run jobs with every rank a thread of this process (LocalTransport)."""
    hub = LocalHub(world, timeout_s)
    results: list[JobResult] = []
    errors: list[BaseException] = []
    cache: dict = {}

    def body(rank: int) -> None:
        tr = LocalTransport(hub, rank)
        try:
            for job in jobs:
                out = run_job(job, tr, rank, device=torch.device("cpu"), clock=CpuClock(), offset=0.0,
                              timeout_s=timeout_s, reference_cache=cache)
                if out is not None:
                    results.append(out)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
            hub.barrier_obj.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        first = next((e for e in errors if isinstance(e, OpFailure)), errors[0])
        raise first
    return results


# --------------------------------------------------------------------------- torchrun entry

STATUS_FORMAT = "<qqqd64s16s"  # job, step, op index, time, op text, phase
STATUS_SIZE = struct.calcsize(STATUS_FORMAT)


class StatusBoard:
    """Where a rank is, in a small memory-mapped file the launcher reads (no syscalls per op)."""

    def __init__(self, path: Path):
        path.write_bytes(b"\0" * STATUS_SIZE)
        self.file = open(path, "r+b")
        self.map = mmap.mmap(self.file.fileno(), STATUS_SIZE)
        self.job = 0

    def update(self, step: int, index: int, op: str, phase: str) -> None:
        self.map[:STATUS_SIZE] = struct.pack(STATUS_FORMAT, self.job, step, index, time.time(),
                                             op.encode()[:64], phase.encode()[:16])


def read_status(path: Path) -> dict | None:
    try:
        raw = path.read_bytes()[:STATUS_SIZE]
        job, step, index, t, op, phase = struct.unpack(STATUS_FORMAT, raw)
    except (OSError, struct.error):
        return None
    return {"job": job, "step": step, "index": index, "time": t,
            "op": op.rstrip(b"\0").decode(errors="replace"),
            "phase": phase.rstrip(b"\0").decode(errors="replace")}


def _device_for(backend: str, local_rank: int):
    if backend == "gloo":
        return torch.device("cpu"), CpuClock()
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), EventClock(torch.cuda)
    if backend == "hccl":
        import torch_npu  # noqa: F401  (registers the npu device; only on this path)

        torch.npu.set_device(local_rank)
        return torch.device("npu", local_rank), EventClock(torch.npu)
    raise SystemExit(f"unknown backend {backend}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m executor.runtime.rank")
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--run-id", default="")  # only to find this run's processes
    args = ap.parse_args(argv)
    from datetime import timedelta

    import torch.distributed as dist

    run_dir = Path(args.run_dir)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    (run_dir / f"pid.{rank}").write_text(str(os.getpid()))
    board = StatusBoard(run_dir / f"status.{rank}")
    board.update(0, -1, "", "starting")
    current = {"job": None}
    try:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        device, clock = _device_for(args.backend, local_rank)
        dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
        transport = DistTransport(args.timeout)
        offset = transport.measure_offset()
        jobs = [Job.from_dict(d) for d in json.loads(Path(args.jobs).read_text())]
        for job in jobs:  # (a model's libraries are not its build memory: imported before it is measured)
            job.import_model_libraries()
        cache: dict = {}
        meshes: dict = {}
        stream = StepWriter(run_dir, rank, host_label(device))
        for j, job in enumerate(jobs):
            board.job = j
            stream.job = j
            current["job"] = job.name
            board.update(0, -1, "", "preparing")  # building the model: the start-up limit applies
            grid = job_grid(job, build_plan(schedule_from_dict(job.schedule)).devices, transport.world)
            # Every pipeline streams its ops and collectives, tagged (the Runs page shows one at a time).
            stream.device, stream.pipeline = grid.coords(rank)["pp"], grid.pipelines().index(grid.pipeline(rank))
            result = run_job(job, transport, rank, device=device, clock=clock, offset=offset,
                             timeout_s=args.timeout, on_progress=board.update, reference_cache=cache,
                             on_step=lambda rec, ops, rows: stream.write(rec, ops, offset, rows), meshes=meshes)
            if result is not None:
                with open(run_dir / "results.jsonl", "a") as fh:
                    fh.write(json.dumps(result.to_dict()) + "\n")
        board.update(0, -1, "", "finished")
        transport.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as error:  # noqa: BLE001 - reported to the launcher, then exit
        info = {"rank": rank, "job": current["job"], "type": type(error).__name__, "time": time.time(),
                "message": str(error), "traceback": traceback.format_exc()}
        if isinstance(error, OpFailure):
            info.update(step=error.step, op=error.op, phase=error.phase,
                        message=f"{type(error.cause).__name__}: {error.cause}")
        (run_dir / f"error.{rank}.json").write_text(json.dumps(info))
        sys.stderr.write(f"[rank {rank}] {info.get('op', '')} {info['message']}\n")
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
