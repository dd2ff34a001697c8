"""One pipeline rank: runs its op list in order, step after step.

For each op: post the receives of the next op (overlap), wait for this op's
inputs, compute, hand outputs to local consumers or the outbox, then post the
sends the plan schedules after this op.  `F` keeps the chunk's graph; `B` and
`W` are `autograd_split.backward_input` / `backward_weight`; `BW` is fused.
An LLM chunk's forward and backward follow the schedule's `recompute(...)`
(`recompute.chunk_forward`: fully recomputed layers keep only their input and
are rebuilt before their backward, selective ones recompute the attention core).
Encoder replicas follow the plan: `BCAST` broadcasts the parameters from the
source device, `R` recomputes the forward from shipped images, `AR`
all-reduces the encoder gradients; `colocated`'s barriers (`GATHER`,
`SCATTER`) wait for what the plan has them receive (every share's features,
the first stage's token) and pass tokens on.  An encoder op serving a group of
microbatches (`encoder_batch`) runs the encoder once on their images and
splits the features per microbatch (`encoder_rows`); its backward takes the
feature gradients of all of them.  The step ends by waiting for outstanding
sends and collectives, summing the gradients of parameters several parts use
over the ranks holding them (`models.sharing`), then the optimizer step.
With data parallelism (`dp`, `executor.parallel.data_parallel`) each chunk's
gradients are reduced over the replicas right after the chunk's last weight-
gradient op, the rest at the end of the step; each replica draws its own share
of the global batch, and the loss is normalised over the whole global batch.
Under `encoder_shard` the encoder's own parameters leave both: its copies reduce,
step and gather them among themselves (`executor.parallel.encoder_shard`), the
plan's `AR` op launching that reduction.

Every op is timed: `perf_counter` on CPU (the work is synchronous), device
events on CUDA/NPU (resolved after the step against a host anchor).  Memory is
measured as it runs (`memory_meter`): the bytes autograd saves for backward,
live over the step (its peak and the op it was reached in), and the static
bytes of the parameters, gradients and optimizer state the rank holds.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mpipe_core.ir.ops import ALLREDUCE, BCAST, BW, GATHER, LLM, SCATTER, B, F, R, W, format_op

from ..errors import ExecutorError, OpFailure
from ..parallel.data_parallel import OPTIMIZER, GradientSync, last_weight_ops
from ..parallel.encoder_shard import EncoderShard
from ..parallel.tensor_parallel import flat_values, gradient_from_flat, local_tensor
from .autograd_split import WeightGradState, backward_fused, backward_input, backward_weight
from .encoder_rows import EncoderRows
from .op_profiler import op_range
from .memory_meter import MemoryMeter, RankMemory, optimizer_state_tensors, storage_bytes, tensors_in
from .models.chunks import model_chunks
from .models.materialise import builds_partially, materialise, peak_rss
from .models.protocol import Batch, PipelineModel, encoder_trainable, named_parameters_of
from .models.sharing import shared_parameters, sync_groups
from .plan import ACT, FEAT, FGRAD, GRAD, IMG, TOKEN, Edge, ExecutionPlan, OpPlan
from .precision import compute_context, wire
from .recompute import ChunkGraph, chunk_forward


@dataclass
class OptimizerSpec:
    """SGD with momentum by default: with `check_grads` over several steps, AdamW's
    normalisation turns last-bit differences of near-zero gradient elements
    (summation order) into visible parameter differences, so multi-step checks
    compare best under SGD.  Both are deterministic."""

    name: str = "sgd"  # sgd | adamw
    lr: float = 0.05
    momentum: float = 0.9

    def build(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer | None:
        if not params:
            return None
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, foreach=False)
        if self.name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, foreach=False)
        raise ExecutorError(f"unknown optimizer '{self.name}' (sgd, adamw)")


class CpuClock:
    """Wall clock after synchronous work."""

    def begin_step(self) -> None:
        pass

    def mark(self):
        return time.perf_counter()

    def resolve(self, marks: list) -> list[float]:
        return list(marks)


class EventClock:
    """Device events (torch.cuda / torch.npu), anchored to the host clock once per step."""

    def __init__(self, device_module):
        self.mod = device_module
        self.anchor_event = None
        self.anchor_host = 0.0

    def begin_step(self) -> None:
        self.mod.synchronize()
        self.anchor_host = time.perf_counter()
        self.anchor_event = self.mod.Event(enable_timing=True)
        self.anchor_event.record()

    def mark(self):
        ev = self.mod.Event(enable_timing=True)
        ev.record()
        return ev

    def resolve(self, marks: list) -> list[float]:
        self.mod.synchronize()
        return [self.anchor_host + self.anchor_event.elapsed_time(ev) / 1000.0 for ev in marks]


@dataclass
class _Activation:
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]


@dataclass
class StepRecord:
    step: int
    ops: list[str]
    start: list[float]
    end: list[float]
    wait: list[float]  # seconds spent waiting for inputs before each op
    step_start: float
    step_end: float
    loss: float | None  # this rank's share of the step loss (last chunk holder), else None


@dataclass
class RankRuntime:
    model: PipelineModel  # the whole model (executor.runtime.models.protocol); this rank keeps its parts
    plan: ExecutionPlan
    rank: int
    transport: Any
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    clock: Any = field(default_factory=CpuClock)
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    timeout_s: float = 60.0
    on_progress: Callable[[int, int, str, str], None] | None = None  # (step, index, op, phase)
    # Test hook: {"rank", "op", "kind": raise|exit|hang}, or {"rank", "kind": "wrong_grad",
    # "param", "index" (flat, default 0), "delta" (default 1.0), "step" (default 0)}: that
    # gradient element is off by `delta` at the end of the step, as a schedule bug would leave it
    # (with "scale" instead: the whole gradient times it, as a dropped reduction would leave it).
    # The gradient check's mutations (`_mutation`), each "step" (default 0): {"kind":
    # "drop_microbatch", "mb"} (its backward starts from zero), {"kind": "swap_shard", "mb"} (its
    # first chunk gets the encoder shards' features in reverse order), {"kind":
    # "skip_optimizer_step", "rank"} (that rank's optimizer does not step).
    fault: dict | None = None
    # `mpipe run --data`: per step its plan and packs (`step_plans.DataStep`); every
    # message then carries its shape (`transport`'s shaped messages).
    data: list | None = None
    # `mpipe run --profile`: each op inside its `mpipe:` label range (`op_profiler`).
    label_ops: bool = False
    # A context each op runs inside, given the op (tp runs: `collective_timer.CollectiveTimer.timing`,
    # which times DTensor's collectives of the op as tp_comm rows); None: none.
    op_scope: Callable[[Any], Any] | None = None
    # This rank's dp group (`executor.parallel.data_parallel.DataParallel`); None: one replica.
    dp: Any = None
    # This rank's place among the encoder's trained copies under `encoder_shard`
    # (`executor.parallel.encoder_shard.EncoderCopies`); None: the encoder's state is not sharded.
    encoder_copies: Any = None
    precision: str = "fp32"  # `precision.PRECISIONS`: the forward's compute dtype
    # What building this rank cost (`models.materialise.BuildMemory.__dict__`), set by whoever built it.
    build: dict | None = None

    def __post_init__(self) -> None:
        model, plan = self.model, self.plan
        rp = plan.ranks[self.rank]
        self.rank_plan = rp
        trainable = encoder_trainable(model)
        folded = plan.encoder_layers is not None  # `balanced` ran the tower inside the LLM chunks
        self.tower_trains = folded and trainable
        if folded and model.encoder is None:
            raise ExecutorError(f"the schedule folds encoder layers into its chunks but the model "
                                f"'{model.name}' has no encoder (a text-only model)")
        # (folded: no encoder ops, the chunks run the tower, `models.tower`)
        if not folded and plan.encoder is None and model.encoder is not None:
            raise ExecutorError(f"the model '{model.name}' has an encoder but the schedule places "
                                "no encoder ops (evaluate the term with the model's workload)")
        if plan.encoder is not None and model.encoder is None:
            raise ExecutorError(f"the schedule places encoder '{plan.encoder}' ops but the model "
                                f"'{model.name}' has no encoder (a text-only model)")
        if plan.trainable and not trainable:
            raise ExecutorError(f"the schedule trains encoder '{plan.encoder}' but the model's is frozen")
        if trainable and not plan.trainable and not folded:
            raise ExecutorError(f"the model's encoder is trainable but the schedule has no encoder "
                                f"backward ops")
        self.chunks = model_chunks(model, plan.chunks, plan.layers, plan.encoder_layers)
        held = [self.chunks[c] for c in rp.chunks]
        self.encoder = model.encoder if plan.holds_encoder(self.rank) else None
        # The parts this rank runs go to its device; the rest of the model stays where it was built
        # (on the meta device for a partial build: then only these parts are made real, here).
        held_modules = [m for c in held for m in c.modules(model)] + [self.encoder]
        self.built_bytes = materialise(model, held_modules, self.device) if builds_partially(model) else None
        for module in held_modules:
            if module is not None:
                module.to(self.device)
        shard = getattr(model, "shard_held", None)  # tensor parallelism: shard the real parts
        if shard is not None:
            shard(held_modules)
        self.built_peak = peak_rss()  # the build ends here (the optimizer's imports are not the model's)
        # Memory: parameters and buffers are static, never activations.
        self.meter = MemoryMeter()
        self._static_tensors()
        self.parameter_bytes = storage_bytes(p for m in held_modules if m is not None for p in m.parameters())
        self.gradient_bytes = self.optimizer_bytes = 0
        # What this rank trains: each parameter once, however many of its parts use it.
        self.named_params: list[tuple[str, torch.nn.Parameter]] = []
        seen: set[int] = set()

        def train(pairs) -> None:
            for name, p in pairs:
                if id(p) not in seen:
                    seen.add(id(p))
                    self.named_params.append((name, p))

        for c in held:
            train(c.parameters(model))
        # Parameters several parts use: summed over their holders at the end of the step.
        shared = shared_parameters(model, plan)
        shared_names = {s.name for s in shared}
        by_name = dict(model.root.named_parameters())
        self.shared_sync = [(ranks, [by_name[s.name] for s in shared if s.ranks == ranks])
                            for ranks in sync_groups(shared) if self.rank in ranks]
        # Backward touches the encoder's trainable parameters; broadcast and all-reduce
        # those no other part uses (the shared ones are summed with the rest of their uses).
        self.encoder_params: list[torch.nn.Parameter] = []
        self.encoder_sync_params: list[torch.nn.Parameter] = []
        if self.encoder is not None and trainable:
            enc = [(n, p) for n, p in named_parameters_of(model, self.encoder) if p.requires_grad]
            train(enc)
            self.encoder_params = [p for _, p in enc]
            self.encoder_sync_params = [p for n, p in enc if n not in shared_names]
        # `encoder_shard`: those parameters are reduced, stepped and gathered over the copies
        # (`parallel.encoder_shard`), outside this rank's own dp reduction and optimizer.
        self.encoder_shard = None
        if self.encoder_copies is not None and self.encoder_sync_params:
            self.encoder_shard = EncoderShard(self.encoder_copies, [(n, p) for n, p in enc if n not in shared_names],
                                              self.optimizer, self.device)
        self.unsharded = [(n, p) for n, p in self.named_params
                          if self.encoder_shard is None or id(p) not in self.encoder_shard.ids]
        self.opt = self.optimizer.build([p for _, p in self.unsharded])
        self.grad_sync = self._gradient_sync(shared_names) if self.dp is not None and self.dp.size > 1 else None
        self.timed: list[tuple[str, int, float, float]] = []  # timed work besides ops (optimizer)
        self.shaped = self.data is not None
        self.sync_groups = sync_groups(shared)
        self._use_plan(plan, self.data[0] if self.data else None)

    def _gradient_sync(self, shared_names: set[str]) -> GradientSync:
        """The dp reduction: each held chunk's own parameters a bucket group reduced after
        its last weight-gradient op; the rest (encoder, shared) at the end of the step."""
        placed: set[int] = set()
        chunk_params: dict[int, list] = {}
        for c in self.rank_plan.chunks:
            own = [(n, p) for n, p in self.chunks[c].parameters(self.model) if n not in shared_names]
            chunk_params[c] = [(n, p) for n, p in own if id(p) not in placed]
            placed.update(id(p) for _, p in own)
        rest = [(n, p) for n, p in self.unsharded if id(p) not in placed]
        sync = GradientSync(self.dp, chunk_params, rest, last_weight_ops(self.rank_plan.ops, LLM, (W, BW)),
                            self.device)
        if self.dp.zero:  # ZeRO-1: the optimizer steps this rank's slices only
            self.opt = self.optimizer.build(sync.masters())
        return sync

    def _use_plan(self, plan: ExecutionPlan, step=None) -> None:
        """This step's plan (a data run's steps differ in op orders, microbatch order,
        encoder placement and groups; never in what each rank holds: `step_plans`)."""
        self.plan = plan
        self.rank_plan = plan.ranks[self.rank]
        self.data_step = step
        if getattr(self, "grad_sync", None) is not None:  # a data run's step: its own op order
            self.grad_sync.last_weight_op = last_weight_ops(self.rank_plan.ops, LLM, (W, BW))
        self.image_counts = (step.image_counts(self.model.encoder is not None) if step is not None
                             else self._replica_image_counts(plan.microbatches))
        self.rows = EncoderRows(self.image_counts, plan.shards, plan.encoder_batch)
        self.transport.setup(plan.channels, [plan.bcast_group, plan.ar_group] + self.sync_groups,
                             shaped=self.shaped)

    def _replica_image_counts(self, microbatches: int) -> list[int]:
        """This replica's microbatches' image counts: its slice of the global batch's."""
        if self.dp is None or self.dp.replicas == 1:
            return self.model.image_counts(microbatches)
        lo = self.dp.replica * microbatches
        return self.model.image_counts(self.dp.replicas * microbatches)[lo:lo + microbatches]

    def _step_normalizer(self) -> int:
        """The step's target count: over the global batch (every replica's microbatches)."""
        m = self.plan.microbatches
        if self.data_step is not None and self.data_step.replica_packs:  # every replica's drawn packs
            return sum(self.model.target_count(b) for b in self.data_step.global_batches(self.model))
        if self.dp is None or self.dp.replicas == 1:
            return sum(self.model.target_count(self._batch(i)) for i in range(m))
        total = self.dp.replicas * m
        return sum(self.model.target_count(self.model.make_batch(self.step, g, total)) for g in range(total))

    # ------------------------------------------------------------------ shapes

    def _shape(self, e: Edge) -> tuple[int, ...]:
        if e.what in (ACT, GRAD):
            after = self.chunks[min(e.producer.chunk, e.consumer.chunk) + 1]
            if after.tower_input:  # a boundary inside a folded tower: its hidden state
                if e.what == GRAD and not self.tower_trains:
                    return (0,)  # a frozen tower sends no gradient back
                images = self._batch(e.consumer.mb).images.shape[0]
                return tuple(self.model.encoder_hidden_shape(images, after.tower.start - 1))
            return tuple(self.model.hidden_shape(self._batch(e.consumer.mb)))
        if e.what == TOKEN:
            return (1,)
        if e.what == IMG:  # the images of a shard, for its recompute
            lo, hi = self.rows.shard(e.producer.chunk, e.producer.mb)
            return (hi - lo,) + tuple(self._batch(e.producer.mb).images.shape[1:])
        enc, llm = (e.producer, e.consumer) if e.what == FEAT else (e.consumer, e.producer)
        lo, hi = self.rows.piece(enc.chunk, llm.mb)
        return (hi - lo,) + tuple(self.model.feature_shape())

    # ------------------------------------------------------------------ step

    def run_step(self, step: int) -> StepRecord:
        self.step = step
        if self.data is not None:
            self._use_plan(self.data[step].plan, self.data[step])
        self.local: dict[Edge, torch.Tensor] = {}
        self.outbox: dict[Edge, torch.Tensor] = {}
        self.inbox: dict[Edge, tuple[torch.Tensor, list]] = {}
        self.arrived: dict[Edge, torch.Tensor] = {}  # received by an earlier op (a GATHER) for a later one
        self.acts: dict[tuple, _Activation] = {}
        self.wstates: dict[tuple, Any] = {}
        self.pending_sends: list = []
        self.bcast: tuple | None = None  # (buffer, works)
        self.allreduce: tuple | None = None
        self.loss = None
        self.batches = {}
        self.contexts = {}
        self.meter.new_step()
        self._static_tensors()
        self.normalizer = self._step_normalizer()
        ops = self.rank_plan.ops
        marks_start, marks_end, waits = [], [], []
        self.clock.begin_step()
        step_start = time.perf_counter()
        with self.meter.recording():
            for i, p in enumerate(ops):
                text = format_op(p.op)
                phase = "receiving"
                try:
                    self._post_recvs(p)
                    if i + 1 < len(ops):
                        self._post_recvs(ops[i + 1])
                    self._progress(i, text, "waiting")
                    t_wait = time.perf_counter()
                    inputs = self._collect(p)
                    if p.wait_bcast:
                        self._finish_bcast()
                    waits.append(time.perf_counter() - t_wait)
                    phase = "computing"
                    self._progress(i, text, "computing")
                    self._maybe_fault(p)
                    self.meter.label = text
                    marks_start.append(self.clock.mark())
                    with op_range(p.op, self.label_ops), (self.op_scope(p.op) if self.op_scope else nullcontext()):
                        self._run(p, inputs)
                    marks_end.append(self.clock.mark())
                    phase = "sending"
                    self._post_sends(p)
                    self._reap_sends()
                    if self.grad_sync is not None:
                        self.grad_sync.after_op(i)
                except OpFailure:
                    raise
                except BaseException as error:  # noqa: BLE001 - re-raised with its place
                    raise OpFailure(self.rank, step, text, phase, error) from error
            self.meter.label = ""
        text = "end of step"
        try:
            self._progress(len(ops), text, "finishing")
            self.transport.wait([w for works, _ in self.pending_sends for w in works])
            self.pending_sends = []
            if self.bcast is not None:
                self._finish_bcast()
            if self.allreduce is not None:
                self._finish_allreduce()
            self._sum_shared_gradients()
            if self.encoder_shard is not None:
                self.encoder_shard.finish_step()
            if self.grad_sync is not None:
                self.gradient_bytes = max(self.gradient_bytes, self._kept_gradient_bytes())
                self.grad_sync.finish_step()
            if self.acts or self.wstates or self.local or self.outbox or self.arrived:
                left = [str(k) for k in list(self.acts) + list(self.wstates) + list(self.arrived)]
                raise ExecutorError(f"state left over at the end of the step: {left[:5]}")
        except BaseException as error:  # noqa: BLE001
            raise OpFailure(self.rank, step, text, "finishing", error) from error
        starts = self.clock.resolve(marks_start)
        ends = self.clock.resolve(marks_end)
        step_end = time.perf_counter() if not ends else max(time.perf_counter(), ends[-1])
        self._maybe_wrong_gradient()
        self._progress(len(ops), text, "done")
        return StepRecord(step, [format_op(p.op) for p in ops], starts, ends, waits,
                          step_start, step_end, self.loss)

    def _static_tensors(self) -> None:
        """Tell the meter which storages are parameters and buffers (never activations)."""
        self.meter.set_static([t for t in list(self.model.root.parameters()) + list(self.model.root.buffers())
                               if not t.is_meta])

    def _kept_gradient_bytes(self) -> int:
        """The gradients this rank keeps for its optimizer step (the encoder's, sharded: its slices)."""
        kept = [p.grad for _, p in self.unsharded if p.grad is not None]
        return storage_bytes(kept + (self.encoder_shard.kept_gradients() if self.encoder_shard is not None else []))

    def optimizer_step(self) -> None:
        self.gradient_bytes = max(self.gradient_bytes, self._kept_gradient_bytes())
        if self.grad_sync is not None and self.dp.zero:
            if self._mutation("skip_optimizer_step", rank=self.rank) is None:
                self.grad_sync.sharded_step(self.opt)
        elif self.opt is not None:
            t0 = time.perf_counter()
            if self._mutation("skip_optimizer_step", rank=self.rank) is None:
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.timed.append((OPTIMIZER, -1, t0, time.perf_counter()))
        if self.encoder_shard is not None:
            self.encoder_shard.step(skip=self._mutation("skip_optimizer_step", rank=self.rank) is not None)
        state = optimizer_state_tensors(self.opt) + (optimizer_state_tensors(self.encoder_shard.opt)
                                                     if self.encoder_shard is not None else [])
        self.optimizer_bytes = max(self.optimizer_bytes, storage_bytes(state))

    def take_rows(self) -> list[tuple[str, int, float, float]]:
        """The step's timed work besides its ops: (kind, chunk, start, end) of each dp
        reduction and gather and the optimizer step (perf_counter seconds)."""
        rows = self.timed + (self.grad_sync.take_rows() if self.grad_sync is not None else [])
        rows += self.encoder_shard.take_rows() if self.encoder_shard is not None else []
        self.timed = []
        return sorted(rows, key=lambda r: r[2])

    def memory(self) -> RankMemory:
        """What this rank measured so far: the activation peak, and static memory
        (gradients and optimizer state as of the last optimizer step)."""
        return RankMemory(self.rank, self.meter.peak, self.meter.peak_at, self.parameter_bytes,
                          self.gradient_bytes, self.optimizer_bytes, self.build)

    def gradients(self) -> dict[str, Any]:
        """Current gradients of the parameters this rank trains (None-free, on CPU); under
        ZeRO-1 (and for the encoder under `encoder_shard`) the reduced slices this rank
        holds, name -> [(a, b, elements [a, b))]."""
        shard = self.encoder_shard.gradient_pieces() if self.encoder_shard is not None else {}
        if self.grad_sync is not None and self.dp.zero:
            return {**self.grad_sync.gradient_pieces(), **shard}
        out = {}
        for name, p in self.unsharded:
            if p.grad is not None:
                out[name] = p.grad.detach().to("cpu").clone()
        return {**out, **shard}

    def gathered_names(self) -> set[str]:
        """Under ZeRO-1 or `encoder_shard`: the parameters some replica or copy had a gradient
        for, whose every element must come back gathered (this rank's slices may hold none)."""
        names = set(self.grad_sync.reduced) if self.grad_sync is not None and self.dp.zero else set()
        return names | (self.encoder_shard.reduced if self.encoder_shard is not None else set())

    def parameters_cpu(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().to("cpu").clone() for name, p in self.named_params}

    # ------------------------------------------------------------------ plumbing

    def _progress(self, index: int, text: str, phase: str) -> None:
        if self.on_progress is not None:
            self.on_progress(self.step, index, text, phase)

    def _maybe_fault(self, p: OpPlan) -> None:
        f = self.fault
        if not f or f.get("rank") != self.rank or f.get("op") != format_op(p.op) \
                or f.get("step", 0) != self.step:
            return
        kind = f.get("kind", "raise")
        if kind == "raise":
            raise RuntimeError("injected fault")
        if kind == "exit":
            import os
            import signal
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            while True:
                time.sleep(1)

    def _mutation(self, kind: str, **where) -> dict | None:
        """The injected mutation of `kind` if it applies to this step and `where` (test hook)."""
        f = self.fault
        if not f or f.get("kind") != kind or f.get("step", 0) != self.step:
            return None
        return f if all(f.get(k) == v for k, v in where.items()) else None

    def _maybe_wrong_gradient(self) -> None:
        f = self.fault
        if not f or f.get("kind") != "wrong_grad" or f.get("rank") != self.rank or f.get("step", 0) != self.step:
            return
        params = dict(self.named_params)
        if f.get("param") not in params:
            raise ExecutorError(f"fault: rank {self.rank} holds no parameter {f.get('param')!r}")
        grad = params[f["param"]].grad
        if "scale" in f:  # the whole tensor, e.g. 0.5: one of two data-parallel replicas' gradients dropped
            grad.mul_(float(f["scale"]))
        else:
            grad.view(-1)[int(f.get("index", 0))] += float(f.get("delta", 1.0))

    def _batch(self, m: int) -> Batch:
        mb = self.batches.get(m)
        if mb is None:
            if self.data_step is not None:
                mb = self.data_step.batch(self.model, m).to(self.device)
            elif self.dp is not None and self.dp.replicas > 1:  # this replica's share of the global batch
                total = self.dp.replicas * self.plan.microbatches
                mb = self.model.make_batch(self.step, self.dp.replica * self.plan.microbatches + m, total)
                mb = mb.to(self.device)
            else:
                mb = self.model.make_batch(self.step, m, self.plan.microbatches).to(self.device)
            self.batches[m] = mb
        return mb

    def _context(self, m: int):
        """The layers' per-microbatch context (positions, masks): no gradient, never sent."""
        if m not in self.contexts:
            with torch.no_grad():
                self.contexts[m] = self.model.context(self._batch(m))
            self.meter.exclude(tensors_in(self.contexts[m]), step=True)  # kept all step, shared by layers
        return self.contexts[m]

    def _post_recvs(self, p: OpPlan) -> None:
        if self.shaped:  # each message's shape comes first: post its header's receive
            for e in p.recvs:
                if e not in self.inbox:
                    self.inbox[e] = (None, self.transport.post_shaped_recv(e.src, self.device))
            return
        todo = []
        for e in p.recvs:
            if e in self.inbox:
                continue
            buf = torch.empty(self._shape(e), dtype=torch.float32, device=self.device)
            if buf.numel() == 0:
                self.inbox[e] = (buf, [])
            else:
                todo.append((e, buf))
        if todo:
            works = self.transport.post([], [(e.src, buf) for e, buf in todo])
            # A batch's works complete together; keep them with the first edge.
            for j, (e, buf) in enumerate(todo):
                self.inbox[e] = (buf, works if j == 0 else [])

    def _collect(self, p: OpPlan) -> dict[Edge, torch.Tensor]:
        for e in p.recvs:
            buf, works = self.inbox.pop(e)
            if self.shaped:  # in posting order, so each channel's payloads are received in order
                buf = self.transport.wait_shaped(works)
            else:
                self.transport.wait(works)
            self.arrived[e] = buf
        return {e: self.arrived.pop(e) if e.remote else self.local.pop(e) for e in p.inputs}

    def _produce(self, p: OpPlan, what: str, tensor: torch.Tensor | Callable[[Edge], torch.Tensor],
                 k: int | None = None) -> None:
        """Hand `tensor` (or `tensor(edge)`, each consumer its own rows) to every
        consumer of kind `what` (of encoder shard `k`)."""
        for e in p.outputs:
            if e.what != what or (k is not None and e.consumer.chunk != k):
                continue
            data = wire((tensor(e) if callable(tensor) else tensor).detach())
            if e.remote:
                self.outbox[e] = data
            else:
                self.local[e] = data

    def _post_sends(self, p: OpPlan) -> None:
        if not p.sends_after:
            return
        sends = []
        for e in p.sends_after:
            t = self.outbox.pop(e)
            if t.numel() or self.shaped:  # (a shaped message tells an empty one by its header)
                sends.append((e.dst, t.contiguous()))
        if sends:
            works = self.transport.post_shaped(sends) if self.shaped else self.transport.post(sends, [])
            self.pending_sends.append((works, [t for _, t in sends]))

    def _reap_sends(self) -> None:
        if len(self.pending_sends) > 16:
            keep = []
            for works, tensors in self.pending_sends:
                if all(getattr(w, "is_completed", lambda: False)() for w in works):
                    continue
                keep.append((works, tensors))
            self.pending_sends = keep

    # ------------------------------------------------------------------ ops

    def _run(self, p: OpPlan, inputs: dict[Edge, torch.Tensor]) -> None:
        op = p.op
        if op.module == LLM:
            if op.kind == F:
                self._llm_forward(p, inputs)
            elif op.kind in (B, BW):
                self._llm_backward(p, inputs)
            else:
                self.wstates.pop((LLM, op.chunk, op.mb)).backward_weight()
            return
        if op.kind == F:
            self._encoder_forward(p)
        elif op.kind == R:
            (imgs,) = inputs.values()
            with torch.enable_grad(), compute_context(self.precision, self.device):
                feats = self.encoder(imgs)
            self.acts[(op.module, op.chunk, op.mb)] = _Activation([], [feats])
        elif op.kind in (B, BW):
            # Its microbatches' feature gradients, in row order (one without `encoder_batch`).
            pieces = [t for e, t in sorted(inputs.items(), key=lambda et: et[0].producer.mb)]
            grad = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
            act = self.acts.pop((op.module, op.chunk, op.mb))
            grad = grad.to(act.outputs[0].dtype)  # (bf16 features' gradient came as float32)
            params = self.encoder_params
            if op.kind == BW:
                backward_fused(act.outputs, [grad], [], params)
            else:
                _, state = backward_input(act.outputs, [grad], [], params)
                self.wstates[(op.module, op.chunk, op.mb)] = state
        elif op.kind == W:
            state: WeightGradState = self.wstates.pop((op.module, op.chunk, op.mb))
            backward_weight(state)
        elif op.kind == BCAST:
            params = self.encoder_sync_params  # the same list on every member: all post, or none
            buf = flat_values([q.detach() for q in params]) if params else None  # (tp: local shards)
            works = self.transport.broadcast(buf, self.plan.bcast_src, self.plan.bcast_group) if params else []
            self.bcast = (buf, works)
        elif op.kind in (GATHER, SCATTER):
            # What it waits for has arrived (`_collect`): open the barrier on the other devices.
            self._produce(p, TOKEN, torch.ones(1, device=self.device))
        elif op.kind == ALLREDUCE and self.encoder_shard is not None:
            self.encoder_shard.launch()  # over the N copies instead (`parallel.encoder_shard`)
        elif op.kind == ALLREDUCE:
            params = self.encoder_sync_params
            grads = [q.grad if q.grad is not None else torch.zeros_like(local_tensor(q)) for q in params]
            # With one flag per parameter: one no replica has a gradient for (a part the loss
            # does not use) stays without one, as training alone leaves it.
            have = torch.tensor([float(q.grad is not None) for q in params], device=self.device)
            buf = torch.cat([flat_values(grads), have]) if params else None
            works = self.transport.all_reduce(buf, self.plan.ar_group) if params else []
            self.allreduce = (buf, works)
        else:  # pragma: no cover - the plan refuses unknown kinds
            raise ExecutorError(f"cannot run op kind {op.kind}")

    def _llm_forward(self, p: OpPlan, inputs: dict[Edge, torch.Tensor]) -> None:
        op = p.op
        chunk = self.chunks[op.chunk]
        mb = self._batch(op.mb)
        x, feats = None, []
        if chunk.first and not chunk.tower:  # (a folded tower starts from the batch's images)
            # Each shard's rows of this microbatch's features, in shard order (rows that
            # carry none need no gradient: their feature-gradient message is empty).
            feats = [t.requires_grad_(self.plan.trainable and t.numel() > 0)
                     for _, t in sorted(((e.producer.chunk, t) for e, t in inputs.items()),
                                        key=lambda kt: kt[0])]
            if self._mutation("swap_shard", mb=op.mb) is not None:
                feats = feats[::-1]
        elif not chunk.first:
            (x,) = inputs.values()
            x.requires_grad_(not chunk.tower_input or self.tower_trains)
        full, selective = self.plan.recompute_of(op.chunk)
        context = self._context(op.mb)
        with compute_context(self.precision, self.device):
            graph = chunk_forward(chunk, self.model, x, feats, mb, context, self.normalizer,
                                  full, selective, self.meter.hold)
        out = graph.output
        if chunk.last:
            value = out.detach()
            self.loss = value if self.loss is None else self.loss + value
        self.acts[(LLM, op.chunk, op.mb)] = graph
        self._produce(p, ACT, out)

    def _llm_backward(self, p: OpPlan, inputs: dict[Edge, torch.Tensor]) -> None:
        op = p.op
        graph: ChunkGraph = self.acts.pop((LLM, op.chunk, op.mb))
        if self.chunks[op.chunk].last:
            grad = torch.ones_like(graph.output)
            if self._mutation("drop_microbatch", mb=op.mb) is not None:
                grad = torch.zeros_like(graph.output)
        else:
            (grad,) = inputs.values()
            grad = grad.to(graph.output.dtype)  # (a bf16 output's gradient came as float32)
        if op.kind == BW:
            gin = graph.backward_fused(grad)
        else:
            gin = graph.backward_input(grad)
            self.wstates[(LLM, op.chunk, op.mb)] = graph
        if op.chunk > 0:  # (none inside a frozen folded tower: an empty message, as `_shape` expects)
            frozen = self.chunks[op.chunk].tower_input and not self.tower_trains
            none = frozen or gin[0] is None
            self._produce(p, GRAD, torch.empty(0, device=self.device) if none else gin[0])
        elif self.plan.trainable:
            for k, (g, (shape, dtype, device)) in enumerate(zip(gin, graph.input_shapes)):
                self._produce(p, FGRAD, g if g is not None else torch.zeros(shape, dtype=dtype, device=device), k=k)

    def _encoder_forward(self, p: OpPlan) -> None:
        op = p.op
        members = self.rows.members(op.mb)
        images = [self._batch(m).images for m in members]
        lo, hi = self.rows.shard(op.chunk, op.mb)
        imgs = (torch.cat(images) if len(images) > 1 else images[0])[lo:hi]
        keep_graph = self.plan.trainable and (op.chunk, op.mb) not in self.plan.recompute
        with torch.set_grad_enabled(keep_graph), compute_context(self.precision, self.device):
            feats = self.encoder(imgs)
        if keep_graph:
            self.acts[(op.module, op.chunk, op.mb)] = _Activation([], [feats])

        def rows_of(e: Edge) -> torch.Tensor:  # the consumer microbatch's rows of this shard
            a, b = self.rows.piece(op.chunk, e.consumer.mb)
            return feats[a - lo:b - lo]

        self._produce(p, FEAT, rows_of)
        self._produce(p, IMG, imgs)

    def _finish_bcast(self) -> None:
        if self.bcast is None:
            return
        buf, works = self.bcast
        self.transport.wait(works)
        if self.rank != self.plan.bcast_src and buf is not None:
            with torch.no_grad():  # in place: ZeRO's master slices are views of these parameters
                offset = 0
                for q in self.encoder_sync_params:
                    mine = local_tensor(q)  # a tp-sharded parameter's own shard
                    mine.copy_(buf[offset:offset + mine.numel()].view_as(mine))
                    offset += mine.numel()
        self.bcast = None

    def _finish_allreduce(self) -> None:
        buf, works = self.allreduce
        self.transport.wait(works)
        params = self.encoder_sync_params
        offset = 0
        for q, count in zip(params, buf[len(buf) - len(params):].tolist() if params else []):
            n = local_tensor(q).numel()
            q.grad = gradient_from_flat(q, buf[offset:offset + n]) if count > 0 else None
            offset += n
        self.allreduce = None

    def _sum_shared_gradients(self) -> None:
        """Each shared parameter's gradient summed over the ranks holding it (zeros
        from a holder without one; None everywhere if no holder has one), groups in
        the same order on every rank (`models.sharing`)."""
        for ranks, params in self.shared_sync:
            grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
            have = torch.tensor([float(q.grad is not None) for q in params], device=self.device)
            buf = torch.cat([g.detach().reshape(-1).float() for g in grads] + [have])
            self.transport.wait(self.transport.all_reduce(buf, ranks))
            offset = 0
            for q, count in zip(params, buf[-len(params):].tolist()):
                n = q.numel()
                q.grad = buf[offset:offset + n].view_as(q).to(q.dtype).clone() if count > 0 else None
                offset += n
