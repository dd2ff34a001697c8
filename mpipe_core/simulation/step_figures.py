"""One optimizer step of a simulated pipeline, in seconds, and its MFU.

The simulator times the pipeline (its ops' costs carry the tensor- and
context-parallel communication when a cluster is declared).  After a
device's last op come its data-parallel gradient sync and its optimizer step:

* the sync (`gradient_sync`, which `plan_space`'s bound prices too): a ring
  all-reduce of the device's gradients (`grad_bytes` per parameter it holds:
  4 for fp32 reduction, 2 with `grad_reduce_fp32: false`; its chunks' layers,
  the embedding on the first chunk, the head on the last, the encoder copy it
  trains) over the dp x cp ranks
  that hold the same parameters; with the distributed optimizer a
  reduce-scatter of them and an all-gather of the updated 16-bit parameters.
  An encoder whose state is sharded over its k trained copies
  (`parallel.encoder_shard`) has reduce-scattered its gradients over the
  copies in the pipeline (the timeline's AR op, which also all-gathers its
  weights); each copy then reduce-scatters its 1/k over dp x cp, updates
  1/(k dp cp) of it and all-gathers it back (ZeRO's reduce-scatter +
  all-gather, whatever the LLM's optimizer).
  With `overlap_grad_reduce` (`exposed_reduction`) the reduction runs in buckets (40M parameters,
  Megatron's default) from the moment the device's first backward op of the
  last microbatch has made the first bucket (that op's time x 40M / its
  chunk's parameters), beside the rest of the backward and through the
  cooldown's idle gaps, and only what outlasts the device's last op counts
  (never less than the last bucket); the all-gather is never hidden;
* an LLM that ties its embedding to its head (`model.tied_embeddings`, GPT's
  default in Megatron-LM) all-reduces the embedding's gradient between the
  devices of its first and last chunk when they differ (Megatron's embedding
  group; `grad_bytes` per parameter, on the link between the two stages), in
  full after the sync;
* the optimizer (`optimizer_seconds`, which `plan_space`'s bound prices too):
  memory-bound, as Megatron-LM's mixed-precision optimizer
  (`Float16OptimizerWithFloat16Params.step`, apex `FusedAdam`) moves it, per
  parameter it updates (1/(dp x cp) of them with the distributed optimizer):
  unscale and inf check of the fp32 gradient (read, write: 8 B; fp16 loss
  scaling, a bf16 run skips it), the gradient norm (read: 4 B), Adam (read
  gradient, master weight, two moments, write the weight and moments: 28 B),
  the copy of the master weight to the 16-bit one (read 4, write 2: 6 B):
  46 B; then per parameter it holds, zeroing the fp32 gradient buffer for the
  next step (`zero_grad_buffer`: 4 B).  (Clipping rescales the gradients only
  when the norm exceeds its bound: not counted.)

step_time_s = max over devices of (last op's end + sync + optimizer), in
seconds.  Model FLOPs (MFU) count forward and backward of every layer, the
head and the trained encoders (a frozen encoder forward only), attention
scores in full, no recompute; hardware FLOPs (HFU) add the recomputed
forwards.  mfu = model FLOPs / (step_time_s x devices_total x peak), with
devices_total = tp x cp x dp x the schedule's devices.  Without a cluster
nothing is priced on a network: the sync costs nothing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from mpipe_core.simulation.chunks import llm_layers, split_recompute
from mpipe_core.ir.ops import ALLREDUCE, BCAST, B, BW, W, base_module, is_llm
from mpipe_core.ir.schedule import Schedule
from mpipe_core.workloads.collectives import Collective, all_gather, all_reduce, reduce_scatter
from mpipe_core.workloads.step_model import StepModel

OPTIMIZER_BYTES_PER_PARAM = 46.0  # per parameter updated (the docstring itemises it)
GRAD_ZERO_BYTES_PER_PARAM = 4.0  # per parameter held: the fp32 gradient buffer zeroed
BACKWARD_KINDS = (B, BW, W)


@dataclass(frozen=True)
class DeviceStep:
    """One device's part of the step, in seconds."""

    end: float  # its last op's end in the pipeline
    busy: float
    tp: float
    cp: float
    encoder_comm: float  # broadcast / all-reduce ops of replicated encoders
    sync: tuple[Collective, ...]
    sync_exposed: float
    optimizer: float
    params: float
    sync_parts: tuple[float, ...] = ()  # each of `sync`'s exposed seconds (they add up to sync_exposed)

    @property
    def finish(self) -> float:
        return self.end + self.sync_exposed + self.optimizer


@dataclass(frozen=True)
class StepFigures:
    step_time_s: float
    devices_total: int
    tokens_per_s: float
    samples_per_s: float
    model_flops: float
    hardware_flops: float
    model_tflops_per_device: float
    mfu: float
    hfu: float
    breakdown: dict
    critical_device: int
    notes: tuple[str, ...] = ()
    # Each device's part (its pipeline end, sync and optimizer): what `comm_timeline` draws
    # after the pipeline.  Not part of the figures' JSON.
    devices: tuple[DeviceStep, ...] = field(default=(), repr=False, compare=False)

    def as_dict(self) -> dict:
        out = asdict(replace(self, devices=()))
        del out["devices"]
        out["notes"] = list(self.notes)
        return out


def _chunk_devices(schedule: Schedule) -> dict[tuple[str, int], int]:
    where: dict[tuple[str, int], int] = {}
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op[1] == "F" and is_llm(op):
                where.setdefault((op[0], op[2]), d)
    return where


def _tied_embedding_sync(schedule: Schedule, model: StepModel, where, pp: int):
    """(the devices of the first and last chunk, their all-reduce of the tied embedding's
    gradient) when the LLM ties its embedding to its head and the two sit on different devices
    (Megatron's `_allreduce_embedding_grads` over the embedding group); else None."""
    if not model.tied_embeddings or model.cluster is None:
        return None
    for pipe in schedule.pipelines:
        first, last = where.get((pipe.module, 0)), where.get((pipe.module, pipe.chunks - 1))
        if first is not None and last is not None and first != last:
            link = model.stage_link(pp, first, last)
            return {first, last}, all_reduce(2, model.grad_bytes * model.embed_params, link)
    return None


PARAM_BYTES = 2.0  # the 16-bit parameters the distributed optimizer all-gathers


def gradient_sync(model: StepModel, params: float, sharded: float, link
                  ) -> tuple[Collective, Collective | None, tuple[Collective, ...]]:
    """A device's data-parallel sync over the dp x cp ranks that hold its `params`
    (and `sharded` encoder parameters, its share of a state sharded over the
    copies): (the gradient all-reduce or reduce-scatter, the distributed
    optimizer's all-gather of 16-bit parameters or None, the sharded encoder's
    reduce-scatter and all-gather).  Gradients move at `model.grad_bytes` each.
    The one formula the step and `plan_space`'s bound both price."""
    n = model.dp * model.cp
    grads = model.grad_bytes * params
    if model.distributed_optimizer:
        reduce, gather = reduce_scatter(n, grads, link), all_gather(n, PARAM_BYTES * params, link)
    else:
        reduce, gather = all_reduce(n, grads, link), None
    shard: tuple[Collective, ...] = ()
    if sharded:
        # its 1/k of the sharded encoders: reduce-scatter over dp x cp, update 1/(k n), all-gather
        shard = (reduce_scatter(n, model.grad_bytes * sharded, link), all_gather(n, PARAM_BYTES * sharded, link))
    return reduce, gather, shard


def exposed_reduction(model: StepModel, reduce: Collective, params: float, window: float) -> float:
    """The seconds of a device's gradient reduction `reduce` (of its `params`) that
    outlast its last op, when the reduction may run for `window` seconds before that op
    ends (from its first bucket being ready: beside the rest of the backward and through
    the cooldown's idle gaps).  Without `overlap_grad_reduce` all of it; with it, what
    the window does not hide, never less than the last bucket.  (`plan_space`'s bound
    counts an overlapped reduction as 0: the last bucket's min(params, bucket) is concave
    in the parameters, so the device average of it could exceed the even spread's.)"""
    if not model.overlap_grad_reduce or reduce.seconds <= 0:
        return reduce.seconds
    last_bucket = reduce.seconds * min(1.0, model.bucket_params / params) if params else 0.0
    return max(last_bucket, reduce.seconds - max(0.0, window))


def optimizer_seconds(model: StepModel, params: float, sharded: float) -> float:
    """A device's optimizer step, seconds: OPTIMIZER_BYTES_PER_PARAM of HBM traffic per
    parameter it updates (1/(dp cp) of its `params` with the distributed optimizer, and
    1/(dp cp) of its `sharded` encoder share), plus GRAD_ZERO_BYTES_PER_PARAM per
    parameter it holds (`params` + `sharded`: the gradient buffer zeroed).  Linear in the
    parameters (`plan_space`'s bound averages it over the pipeline's devices)."""
    if model.hbm_bytes_per_s <= 0:
        return 0.0
    n = model.dp * model.cp
    updated = params / (n if model.distributed_optimizer else 1) + (sharded / n if sharded else 0.0)
    traffic = OPTIMIZER_BYTES_PER_PARAM * updated + GRAD_ZERO_BYTES_PER_PARAM * (params + sharded)
    return traffic / model.hbm_bytes_per_s


def step_figures(schedule: Schedule, workload, timeline) -> StepFigures | None:
    """The step's figures, or None for a workload without a step model (explicit costs)."""
    model: StepModel | None = workload.step
    if model is None:
        return None
    unit = model.seconds_per_unit
    pp = schedule.devices
    placement = model.placement(pp)  # checks whole nodes
    devices_total = model.tp * model.cp * model.dp * pp
    where = _chunk_devices(schedule)
    enc = {e.name: e for e in model.encoders}
    P = timeline.devices
    params = [0.0] * P
    tp = [0.0] * P
    cp = [0.0] * P
    busy = [0.0] * P
    end = [0.0] * P
    enc_comm = [0.0] * P
    trains_encoder: list[set[str]] = [set() for _ in range(P)]
    # each device's first backward op of the last microbatch: (start s, seconds, its chunk's parameters)
    first_backward = [(float("inf"), 0.0, 0.0)] * P
    model_flops = hardware_flops = 0.0
    samples = 0.0
    steps = 1
    layers_of: dict[str, list[int]] = {}
    recompute_of: dict[str, list[tuple[int, int]]] = {}
    for pipe in schedule.pipelines:
        M, steps = pipe.microbatches, max(steps, pipe.steps)
        layers = llm_layers(pipe, workload)
        layers_of[pipe.module] = layers
        _, llm_part = split_recompute(pipe)
        recompute_of[pipe.module] = llm_part
        per_mb = sum(layers) * sum(model.layer_flops) + sum(model.head_flops)
        images = 0.0
        flops_enc = 0.0
        for e in workload.encoders:
            spec = enc.get(e.name)
            if spec is None:
                continue
            count = sum(e.image_counts(M))
            images += count
            flops_enc += count * (sum(spec.flops) if spec.trainable else spec.flops[0])
        extra = sum(full * model.layer_flops[0] + sel * model.core_flops for full, sel in llm_part) * M
        if pipe.encoder_recompute == "full" and pipe.encoder_layers is None:  # encoders=yes|only
            for e in workload.encoders:
                spec = enc.get(e.name)
                if spec is not None and spec.trainable:
                    extra += sum(e.image_counts(M)) * spec.flops[0]
        model_flops += pipe.steps * (M * per_mb + flops_enc)
        hardware_flops += pipe.steps * (M * per_mb + flops_enc + extra)
        samples += pipe.steps * M * model.microbatch_size
        for c, n in enumerate(layers):
            d = where.get((pipe.module, c))
            if d is None:
                continue
            params[d] += n * model.layer_params
            if c == 0:
                params[d] += model.embed_params
            if c == pipe.chunks - 1:
                params[d] += model.head_params
            if pipe.encoder_layers:
                for spec in model.encoders:
                    params[d] += pipe.encoder_layers[c] * spec.params / max(spec.layers, 1) if spec.trainable else 0
    # Recomputed R ops (transpose backward=recompute) of encoders: one forward per microbatch.
    recomputed = {(op[0], op[3], op[4]) for order in schedule.orders for op in order if op[1] == "R"}
    for module, mb, _ in recomputed:
        spec = enc.get(base_module(module))
        if spec is not None:
            e = workload.encoder(spec.name)
            pipe_m = max(p.microbatches for p in schedule.pipelines)
            hardware_flops += e.image_counts(pipe_m)[mb] * spec.flops[0]
    tp_layer = dict(zip("FBW", model.tp_layer))
    cp_layer = dict(zip("FBW", model.cp_layer))
    tp_embed, tp_head = dict(zip("FBW", model.tp_embed)), dict(zip("FBW", model.tp_head))
    last_mb = {p.module: p.microbatches - 1 for p in schedule.pipelines}
    for op, d, s, e in timeline.rows():
        dur = (e - s) * unit
        busy[d] += dur
        end[d] = max(end[d], e * unit)
        module, kind, chunk, mb = op[0], op[1], op[2], op[3]
        if is_llm(op):
            layers = layers_of.get(module)
            if layers is None:
                continue
            n = layers[chunk]
            kinds = ("B", "W") if kind == BW else (kind,) if kind in ("F", "B", "W") else ()
            for k in kinds:
                tp[d] += n * tp_layer[k] + (tp_embed[k] if chunk == 0 else 0.0) \
                    + (tp_head[k] if chunk == len(layers) - 1 else 0.0)
                cp[d] += n * cp_layer[k]
            if kind in (B, BW):
                full = recompute_of[module][chunk][0]
                tp[d] += full * tp_layer["F"]
                cp[d] += full * cp_layer["F"]
            if kind in BACKWARD_KINDS and mb == last_mb.get(module) and s * unit < first_backward[d][0]:
                chunk_params = n * model.layer_params + (model.embed_params if chunk == 0 else 0.0) \
                    + (model.head_params if chunk == len(layers) - 1 else 0.0)
                first_backward[d] = (s * unit, dur, chunk_params)
        else:
            name = base_module(module)
            if kind in (ALLREDUCE, BCAST):
                enc_comm[d] += dur
            elif kind in BACKWARD_KINDS and name in enc and enc[name].trainable:
                trains_encoder[d].add(name)
    copies = {name: sum(name in trains for trains in trains_encoder) for name in enc}
    sharded = [0.0] * P  # encoder parameters whose sync and update this device shares with the other copies
    for d in range(P):
        for name in trains_encoder[d]:
            if enc[name].sharded:
                sharded[d] += enc[name].params / copies[name]
            else:
                params[d] += enc[name].params
    link = model.gradient_link(pp)
    tied = _tied_embedding_sync(schedule, model, where, pp)
    devices = []
    for d in range(P):
        reduce, gather, shard = gradient_sync(model, params[d], sharded[d], link)
        sync = (reduce,) + ((gather,) if gather is not None else ()) + shard
        window = 0.0
        start, seconds, chunk_params = first_backward[d]
        if start < float("inf"):
            # the first bucket is ready once that op has made bucket_params of gradients
            ready = start + seconds * min(1.0, model.bucket_params / chunk_params if chunk_params else 1.0)
            window = end[d] - ready
        parts = [exposed_reduction(model, reduce, params[d], window)]
        parts += [gather.seconds] if gather is not None else []
        parts += [c.seconds for c in shard]
        if tied is not None and d in tied[0]:
            # the tied embedding's gradient, summed between the first and the last stage
            sync += (tied[1],)
            parts.append(tied[1].seconds)
        exposed = sum(parts)
        optimizer = optimizer_seconds(model, params[d], sharded[d])
        devices.append(DeviceStep(end[d], busy[d], tp[d], cp[d], enc_comm[d], sync, exposed, optimizer,
                                  params[d] + sharded[d], tuple(parts)))
    critical = max(range(P), key=lambda d: devices[d].finish)
    dev = devices[critical]
    makespan = max(end)
    tail = dev.finish - makespan  # what the step adds after the pipeline (the last step's)
    step_time = (makespan + steps * tail) / steps  # each step pays its sync and optimizer
    per_step = 1.0 / steps
    model_total = model.dp * model_flops * per_step
    hardware_total = model.dp * hardware_flops * per_step
    compute = dev.busy - dev.tp - dev.cp - dev.encoder_comm
    breakdown = {
        "compute": compute * per_step, "tp_comm": dev.tp * per_step, "cp_comm": dev.cp * per_step,
        "encoder_comm": dev.encoder_comm * per_step, "bubble": (dev.end - dev.busy) * per_step,
        "dp_comm": dev.sync_exposed, "optimizer": dev.optimizer,
        "dp_sync": [c.as_dict() for c in dev.sync],
    }
    peak = model.peak_flops
    notes = tuple(model.notes) + (placement.notes if placement is not None else ())
    notes = tuple(dict.fromkeys(notes))
    if model.cluster is None:
        notes += ("no cluster declared: tensor-, context- and data-parallel communication is not priced",)
    tokens = model.dp * samples * per_step * model.seq_len
    return StepFigures(
        step_time_s=step_time, devices_total=devices_total,
        tokens_per_s=tokens / step_time, samples_per_s=model.dp * samples * per_step / step_time,
        model_flops=model_total, hardware_flops=hardware_total,
        model_tflops_per_device=model_total / step_time / devices_total / 1e12,
        mfu=model_total / (step_time * devices_total * peak), hfu=hardware_total / (step_time * devices_total * peak),
        breakdown=breakdown, critical_device=critical, notes=notes, devices=tuple(devices))
