"""A schedule turned into what each rank does: ops, receives, sends, collectives.

Pure Python (no torch), computed identically on every rank and in the launcher,
so a schedule that cannot run is refused before any process starts.

Dataflow (the core's contract, `mpipe_core.simulation.dataflow`), as *edges* that carry
one tensor each from a producer op to a consumer op:

=========================  ==========================  =========
consumer                   producer                    carries
=========================  ==========================  =========
llm F(c, m), c > 0         llm F(c-1, m)               ``act``
llm F(0, m)                enc F(k, m) for every k     ``feat``
llm B/BW(c, m), c < last   llm B/BW(c+1, m)            ``grad``
enc R(k, m)                enc F(k, m)                 ``img``
enc B/BW(k, m)             llm B/BW(0, m)              ``fgrad``
enc GATHER/SCATTER(d)      the same barrier on chunk   ``token``
                           0's device (d elsewhere)
=========================  ==========================  =========

Encoder groups (`encoder_batch`): an encoder op carries its group's first
microbatch g; ``llm F(0, m)`` receives from it the rows of m's images
(`encoder_rows`), and its backward receives the feature gradient from
``llm B/BW(0, m)`` of every member m.

Phase barriers (`colocated`): ``GATHER`` on chunk 0's device *receives* every
remote share's features (they stay there until ``llm F(0, m)`` reads them) and
then sends a one-element token to each other device's ``GATHER``; ``SCATTER``
there follows chunk 0's last backward and sends its token likewise.  A device
passes its barrier when the token arrives, so no device starts the LLM phase
before every feature has reached the first stage, nor the encoder backward
before the first stage's last input gradient: the simulator's dependencies
(`mpipe_core.simulation.dataflow`), each token costing the link's latency there.

Other dependencies stay on one device (local state): the last chunk's B after
its F, W after B, an encoder's backward after the F or R whose graph it uses,
an encoder F/R after the device's parameter broadcast.

Ordering rule (why no valid schedule deadlocks, on gloo or NCCL): every
ordered pair of ranks (src, dst) is a *channel* with its own two-rank process
group, so it carries traffic one way only.  On a channel, messages travel in
the order the receiver consumes them (the position of the consumer op in dst's
order).  The receiver posts its receives in that order, just before the op
that needs them (one op ahead, to overlap).  The sender posts message j as soon
as it has produced messages 1..j of the channel: a message produced early
waits in the outbox for the ones the receiver needs first.  That delay never
adds a wait the receiver would not have had anyway (it consumes those first),
so the only waits are the schedule's own dependencies; sends never block, so a
schedule whose dependency graph is acyclic always completes.
`check_protocol` replays exactly this protocol abstractly to prove it for a
given schedule before launch.

Collectives (`BCAST`, `AR`) are posted asynchronously at their place in the
order on their own group (the devices holding such an op); a broadcast is
waited for before the device's first encoder op that reads the parameters,
an all-reduce at the end of the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mpipe_core.ir.ops import (
    ALLREDUCE,
    BCAST,
    BW,
    COLLECTIVE_KINDS,
    GATHER,
    LLM,
    NO_MICROBATCH,
    SCATTER,
    B,
    F,
    Op,
    R,
    W,
    format_op,
)
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.dataflow import (
    EDGE_BOUNDARY,
    EDGE_FEATURES,
    EDGE_LOCAL,
    collect_facts,
    predecessors,
)

from ..errors import ExecutorError

ACT, GRAD, FEAT, FGRAD, IMG, TOKEN = "act", "grad", "feat", "fgrad", "img", "token"
BACKWARD_KINDS = (B, BW)
BARRIER_KINDS = (GATHER, SCATTER)


@dataclass(frozen=True)
class Edge:
    """One tensor moving from `producer` (on `src`) to `consumer` (on `dst`)."""

    producer: Op
    consumer: Op
    src: int
    dst: int
    what: str

    @property
    def remote(self) -> bool:
        return self.src != self.dst

    def __str__(self) -> str:
        return f"{format_op(self.producer)}->{format_op(self.consumer)}({self.what}, {self.src}->{self.dst})"


@dataclass
class OpPlan:
    op: Op
    index: int
    inputs: list[Edge] = field(default_factory=list)  # edges this op consumes (local or remote)
    outputs: list[Edge] = field(default_factory=list)  # edges this op produces
    local_deps: list[Op] = field(default_factory=list)  # same-device ops that must have run
    wait_bcast: bool = False  # wait for this device's parameter broadcast first
    sends_after: list[Edge] = field(default_factory=list)  # remote sends posted after this op
    # Remote edges this op receives: its own remote inputs, and for a GATHER the
    # features it gathers for later ops (None: its remote inputs).
    receives: list[Edge] | None = None

    @property
    def recvs(self) -> list[Edge]:
        if self.receives is not None:
            return self.receives
        return [e for e in self.inputs if e.remote]


@dataclass
class RankPlan:
    device: int
    ops: list[OpPlan]
    chunks: list[int]  # LLM chunks held
    has_encoder: bool  # holds an encoder replica
    encoder_grads: bool  # computes encoder weight gradients


@dataclass
class ExecutionPlan:
    devices: int
    chunks: int
    microbatches: int
    chunk_device: list[int]
    encoder: str | None
    trainable: bool
    shards: dict[int, int]  # mb -> encoder shard count
    recompute: set  # (k, mb) with an R op
    bcast_group: tuple[int, ...]
    bcast_src: int | None
    ar_group: tuple[int, ...]
    ranks: list[RankPlan]
    channels: list[tuple[int, int]]  # (src, dst) pairs that carry messages, sorted
    channel_edges: dict[tuple[int, int], list[Edge]]  # in channel (receiver) order
    layers: tuple[int, ...] | None = None  # LLM layers per chunk (partition/balanced); None: even
    # Encoder layers per chunk once `balanced` folded the tower into the chain (they run inside
    # the chunks' F/B/W ops; a chunk boundary inside the tower carries its hidden state); None: not.
    encoder_layers: tuple[int, ...] | None = None
    # `recompute(...)`: per chunk (full, selective) recomputed layers, its first ones; None: none.
    llm_recompute: tuple[tuple[int, int], ...] | None = None

    encoder_batch: int = 1  # microbatches per encoder op (`encoder_batch`); shards etc. keyed by group

    def recompute_of(self, chunk: int) -> tuple[int, int]:
        """(full, selective): how many of the chunk's first layers are recomputed, and how."""
        if self.llm_recompute is None:
            return 0, 0
        full, selective = self.llm_recompute[chunk]
        return int(full), int(selective)

    def holds_encoder(self, device: int) -> bool:
        """Whether `device` keeps the encoder's parameters: it runs encoder ops or joins
        the encoder's broadcast or all-reduce.  The runtime places the encoder and
        `sharing` groups its shared parameters by this one rule, so every holder posts
        the same collectives."""
        return self.ranks[device].has_encoder or device in self.ar_group or device in self.bcast_group

    @property
    def last_chunk(self) -> int:
        return self.chunks - 1

    def encoder_devices(self) -> list[int]:
        return [r.device for r in self.ranks if r.has_encoder]


def _message_kind(edge: int, consumer: Op) -> str:
    """What a dataflow edge carries, named the way the runtime stores it."""
    if edge == EDGE_BOUNDARY:
        return ACT if consumer.kind == F else GRAD
    if edge == EDGE_FEATURES:
        return FEAT if consumer.module == LLM else FGRAD
    return IMG  # EDGE_INPUT: the raw images a recompute needs


def _fail(message: str) -> None:
    raise ExecutorError(message)


def build_plan(schedule: Schedule) -> ExecutionPlan:
    """Validate `schedule` for execution and derive every rank's plan."""
    if len(schedule.pipelines) != 1 or schedule.pipelines[0].replica != 0:
        _fail("the executor runs one pipeline; schedules built with par/overlay "
              "(replicas like 'llm@1') are not supported")
    pipe = schedule.pipelines[0]
    if pipe.steps != 1:
        _fail("the executor runs one schedule step repeatedly; use --steps K instead of "
              "repeat/seq in the term")
    if len(schedule.encoders) > 1:
        _fail(f"the executor's model has one encoder; this schedule has {list(schedule.encoders)}")
    encoder = schedule.encoders[0] if schedule.encoders else None
    chunks, mbs = pipe.chunks, pipe.microbatches
    where: dict[Op, int] = {}
    position: dict[Op, int] = {}
    for d, order in enumerate(schedule.orders):
        for i, op in enumerate(order):
            if op in where:
                _fail(f"op {format_op(op)} appears twice (devices {where[op]} and {d})")
            if op.step != 0:
                _fail(f"op {format_op(op)} belongs to step {op.step}; use --steps instead of repeat/seq")
            if op.module not in (LLM, encoder):
                _fail(f"op {format_op(op)}: unknown module '{op.module}'")
            where[op] = d
            position[op] = i

    # LLM: each chunk lives on one device; complete F and backward per (chunk, mb).
    chunk_device = [-1] * chunks
    for op, d in where.items():
        if op.module != LLM:
            continue
        if op.kind not in (F, B, W, BW):
            _fail(f"op {format_op(op)}: kind {op.kind} is not an LLM op")
        if not (0 <= op.chunk < chunks and 0 <= op.mb < mbs):
            _fail(f"op {format_op(op)} is outside the pipeline ({chunks} chunks, {mbs} microbatches)")
        if chunk_device[op.chunk] not in (-1, d):
            _fail(f"LLM chunk {op.chunk} has ops on devices {chunk_device[op.chunk]} and {d}; "
                  "a chunk's activations live on one device")
        chunk_device[op.chunk] = d
    for c in range(chunks):
        for m in range(mbs):
            kinds = {k for k in (F, B, W, BW) if Op(LLM, k, c, m) in where}
            if kinds not in ({F, BW}, {F, B, W}):
                _fail(f"LLM chunk {c} microbatch {m} has ops {sorted(kinds)}; "
                      "needs F and BW, or F, B and W")

    def bstar(module: str, chunk: int, m: int) -> Op:
        op = Op(module, B, chunk, m)
        return op if op in where else Op(module, BW, chunk, m)

    # Encoder facts.
    shards: dict[int, int] = {}
    recompute: set = set()
    trainable = False
    bcast_group: list[int] = []
    ar_group: list[int] = []
    groups = [g for g, _ in pipe.groups()]
    if encoder is not None:
        for op, d in where.items():
            if op.module != encoder:
                continue
            if op.kind in COLLECTIVE_KINDS:
                if op.chunk != d or op.mb != NO_MICROBATCH:
                    _fail(f"op {format_op(op)} sits on device {d}; a collective op names its own device")
                if op.kind in (BCAST, ALLREDUCE):
                    (bcast_group if op.kind == BCAST else ar_group).append(d)
                continue
            if op.kind not in (F, B, W, BW, R):
                _fail(f"op {format_op(op)}: kind {op.kind} is not an encoder op")
            if not 0 <= op.mb < mbs:
                _fail(f"op {format_op(op)} is outside the pipeline ({mbs} microbatches)")
            if op.mb != pipe.group_of(op.mb):
                _fail(f"op {format_op(op)}: encoder ops serve groups of {pipe.encoder_batch} microbatches "
                      f"and carry the group's first microbatch ({pipe.group_of(op.mb)})")
            if op.kind == F:
                shards[op.mb] = max(shards.get(op.mb, 0), op.chunk + 1)
            if op.kind == R:
                recompute.add((op.chunk, op.mb))
            if op.kind in (B, W, BW):
                trainable = True
        for m in groups:
            for k in range(shards.get(m, 0)):
                if Op(encoder, F, k, m) not in where:
                    _fail(f"encoder '{encoder}' microbatch {m}: shard {k} has no F "
                          f"(shards must be numbered 0..{shards[m] - 1})")
            if m not in shards:
                _fail(f"encoder '{encoder}' has no forward for microbatch {m}")
        for m in groups:
            for k in range(shards[m]):
                kinds = {kd for kd in (B, W, BW) if Op(encoder, kd, k, m) in where}
                if trainable and kinds not in ({BW}, {B, W}):
                    _fail(f"encoder '{encoder}' shard {k} microbatch {m} has backward ops "
                          f"{sorted(kinds)}; needs BW, or B and W")
                if not trainable and (k, m) in recompute:
                    _fail(f"encoder '{encoder}' is frozen but has a recompute R({k},{m})")
                if trainable:
                    back = bstar(encoder, k, m)
                    graph = Op(encoder, R, k, m) if (k, m) in recompute else Op(encoder, F, k, m)
                    if where[graph] != where[back]:
                        _fail(f"{format_op(back)} runs on device {where[back]} but the graph it "
                              f"differentiates ({format_op(graph)}) is on device {where[graph]}")
                    if Op(encoder, W, k, m) in where and where[Op(encoder, W, k, m)] != where[back]:
                        _fail(f"encoder W({k},{m}) and its B are on different devices")
        bcast_group.sort()
        ar_group.sort()
        enc_devices = sorted({d for op, d in where.items()
                              if op.module == encoder and op.kind not in (BCAST, ALLREDUCE)})
        grad_devices = sorted({d for op, d in where.items()
                               if op.module == encoder and op.kind in (W, BW)})
        if len(grad_devices) > 1 and not set(grad_devices) <= set(ar_group):
            _fail(f"encoder gradients are computed on devices {grad_devices} but no all-reduce (AR) "
                  "op joins them")
        if trainable and len(enc_devices) > 1:
            synced = set(enc_devices) <= set(bcast_group) or set(enc_devices) <= set(ar_group)
            if not synced:
                _fail(f"the trainable encoder runs on devices {enc_devices} but neither a broadcast "
                      "(BCAST) nor an all-reduce (AR) on all of them keeps the replicas equal")
    bcast_src = None
    if bcast_group:
        bcast_src = chunk_device[0] if chunk_device[0] in bcast_group else bcast_group[0]

    # Edges.
    edges_in: dict[Op, list[Edge]] = {op: [] for op in where}
    edges_out: dict[Op, list[Edge]] = {op: [] for op in where}
    local_deps: dict[Op, list[Op]] = {op: [] for op in where}

    def add(producer: Op, consumer: Op, what: str) -> None:
        e = Edge(producer, consumer, where[producer], where[consumer], what)
        edges_in[consumer].append(e)
        edges_out[producer].append(e)

    # The dependencies are the core's dataflow (what the simulator waits for);
    # a remote or local edge that moves a tensor becomes a message, a local
    # one without data an ordering constraint.
    facts = collect_facts(schedule)
    gathered: dict[Op, Op] = {}  # remote encoder F -> the GATHER that receives its features
    for op, d in where.items():
        for producer, edge in predecessors(op, d, facts, where):
            producer = Op(*producer)
            if op.kind in BARRIER_KINDS:
                if where.get(producer) == d:
                    local_deps[op].append(producer)  # its own share, its own backward parts
                elif producer.kind in BARRIER_KINDS:
                    add(producer, op, TOKEN)  # the first stage's device opens the barrier
                else:
                    gathered[producer] = op
                continue
            if edge != EDGE_LOCAL:
                add(producer, op, _message_kind(edge, op))
            elif op.kind == ALLREDUCE:
                # A collective: it waits for this device's own weight gradients only.
                if where.get(producer) == d:
                    local_deps[op].append(producer)
            elif producer.kind != BCAST:  # a broadcast is waited for as a collective (wait_bcast)
                local_deps[op].append(producer)
        # Autograd on top: a backward differentiates the graph its own forward
        # (or recompute) built on this device.
        if op.kind in BACKWARD_KINDS:
            if op.module == LLM and op.chunk < chunks - 1:
                local_deps[op].append(Op(LLM, F, op.chunk, op.mb))
            elif op.module == encoder and (op.chunk, op.mb) not in recompute:
                local_deps[op].append(Op(encoder, F, op.chunk, op.mb))

    # Who receives each remote edge: its consumer, or the GATHER before it that
    # gathers that forward's features.
    receiver: dict[Edge, Op] = {}
    for op in where:
        for e in edges_in[op]:
            if not e.remote:
                continue
            gather = gathered.get(e.producer)
            if gather is not None and e.what == FEAT and where[gather] == e.dst \
                    and position[gather] < position[e.consumer]:
                receiver[e] = gather
            else:
                receiver[e] = e.consumer
    for producer, gather in gathered.items():
        if not any(receiver.get(e) == gather for e in edges_out[producer]):
            _fail(f"{format_op(gather)} gathers the features of {format_op(producer)}, but no LLM forward "
                  f"after it on device {where[gather]} reads them")
    receives: dict[Op, list[Edge]] = {op: [] for op in where}
    for e, op in receiver.items():
        receives[op].append(e)

    def arrival(e: Edge) -> tuple:  # one order for the receiver's posts and the channel's messages
        return (position[receiver[e]], position[e.producer], position[e.consumer], e.what)

    # Channels in receiver order; post points on the sender.
    channel_edges: dict[tuple[int, int], list[Edge]] = {}
    for e in receiver:
        channel_edges.setdefault((e.src, e.dst), []).append(e)
    sends_after: dict[Op, list[Edge]] = {op: [] for op in where}
    for key, edges in channel_edges.items():
        edges.sort(key=arrival)
        ready = -1
        order = schedule.orders[key[0]]
        for e in edges:
            ready = max(ready, position[e.producer])
            sends_after[order[ready]].append(e)

    ranks = []
    for d, order in enumerate(schedule.orders):
        plans = []
        for i, op in enumerate(order):
            ins = sorted(edges_in[op], key=lambda e: (e.src, position[e.producer], e.what))
            wait_bcast = (encoder is not None and op.module == encoder and op.kind in (F, R)
                          and d in bcast_group)
            deps = list(local_deps[op])
            if wait_bcast:
                deps.append(Op(encoder, BCAST, d, NO_MICROBATCH))
            recvs = sorted(receives[op], key=lambda e: (e.src, arrival(e)))
            plans.append(OpPlan(op, i, ins, edges_out[op], deps, wait_bcast, sends_after[op], recvs))
        held = sorted(c for c in range(chunks) if chunk_device[c] == d)
        has_enc = encoder is not None and any(  # a barrier alone needs no copy of the encoder
            op.module == encoder and op.kind not in BARRIER_KINDS for op in order)
        enc_grads = any(op.module == encoder and op.kind in (W, BW) for op in order)
        ranks.append(RankPlan(d, plans, held, has_enc, enc_grads))
    plan = ExecutionPlan(
        devices=len(schedule.orders), chunks=chunks, microbatches=mbs, chunk_device=chunk_device,
        encoder=encoder, trainable=trainable, shards=shards, recompute=recompute,
        bcast_group=tuple(bcast_group), bcast_src=bcast_src, ar_group=tuple(ar_group), ranks=ranks,
        channels=sorted(channel_edges), channel_edges=channel_edges, layers=pipe.layers,
        encoder_layers=pipe.encoder_layers,
        llm_recompute=pipe.recompute, encoder_batch=pipe.encoder_batch)
    check_protocol(plan)
    return plan


def check_protocol(plan: ExecutionPlan) -> None:
    """Replay the runtime's protocol abstractly; raise naming the stuck ops if it cannot finish.

    Each rank runs its ops in order; an op waits for its local dependencies,
    for the posting of every remote message it consumes and (encoder F/R) for
    the completion of its device's broadcast, which needs every member of the
    broadcast group to have posted it.  Sends and collectives never block.
    """
    done: set[Op] = set()
    posted: set[Edge] = set()
    pc = [0] * plan.devices
    bcast_posted: set[int] = set()

    def ready(p: OpPlan) -> str | None:
        for dep in p.local_deps:
            if dep not in done:
                return f"waits for {format_op(dep)} on its own device"
        for e in p.inputs:
            if not e.remote and e.producer not in done:
                return f"waits for {format_op(e.producer)} on its own device"
        for e in p.recvs:  # (a remote input another op received came before it in the order)
            if e not in posted:
                return f"waits for {format_op(e.producer)} on device {e.src}"
        if p.wait_bcast and set(plan.bcast_group) - bcast_posted:
            missing = sorted(set(plan.bcast_group) - bcast_posted)
            return f"waits for the parameter broadcast of devices {missing}"
        return None

    progress = True
    while progress:
        progress = False
        for d, rank in enumerate(plan.ranks):
            while pc[d] < len(rank.ops):
                p = rank.ops[pc[d]]
                if ready(p) is not None:
                    break
                done.add(p.op)
                if p.op.kind == BCAST:
                    bcast_posted.add(d)
                posted.update(p.sends_after)
                pc[d] += 1
                progress = True
    stuck = [(d, rank.ops[pc[d]]) for d, rank in enumerate(plan.ranks) if pc[d] < len(rank.ops)]
    if stuck:
        lines = "; ".join(f"device {d} at {format_op(p.op)} {ready(p)}" for d, p in stuck)
        raise ExecutorError(f"the schedule would deadlock: {lines}")
