"""What an analytic workload knows beyond its ops' costs: the figures one
optimizer step needs (model FLOPs for MFU, parameters for the data-parallel
gradient sync and the optimizer, the communication inside each layer for the
breakdown, the cluster for placing it all).  Built by `analytic`, read by
`simulation.step_figures`; an explicit workload has none.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.cluster import Cluster, LinkClass, Placement, group_link, hop_link, place, stage_level
from mpipe_core.workloads.collectives import Collective, all_gather

KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class EncoderStep:
    """An analytic encoder's figures per image (whole encoder, before any split)."""

    name: str
    flops: tuple[float, float, float]  # F, B, W
    trainable: bool
    params: float  # per device of its tensor-parallel group
    layers: int
    # Its state sharded over its trained copies (`parallel.encoder_shard`): each of the k copies in a
    # pipeline syncs and updates 1/k of it over dp x cp.
    sharded: bool = False


@dataclass(frozen=True)
class StepModel:
    tp: int
    cp: int
    dp: int
    sp: bool
    distributed_optimizer: bool
    overlap_grad_reduce: bool
    tp_comm_overlap: bool
    peak_flops: float  # dense 16-bit FLOP/s per device
    hbm_bytes_per_s: float  # achieved
    seconds_per_unit: float  # the workload's time unit in seconds
    microbatch_size: float
    seq_len: float
    layer_flops: tuple[float, float, float]  # F, B, W of one whole layer per microbatch
    core_flops: float  # the attention core's forward (selective recompute)
    head_flops: tuple[float, float, float]
    layer_params: float  # per device (after the tp split)
    embed_params: float
    head_params: float
    encoders: tuple[EncoderStep, ...] = ()
    # Seconds per layer and microbatch of tp and cp communication that add to
    # each kind's time (after any overlap), and of the embedding's and head's.
    tp_layer: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cp_layer: tuple[float, float, float] = (0.0, 0.0, 0.0)
    tp_embed: tuple[float, float, float] = (0.0, 0.0, 0.0)
    tp_head: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # One layer's collectives as priced, (kind, collective): tp's all-reduces / all-gathers /
    # reduce-scatters and cp's K/V sends (`simulation.comm_timeline` draws them on the ops).
    layer_collectives: tuple[tuple[str, Collective], ...] = ()
    # The embedding's and the head's tp collectives, (kind, collective), as priced.
    embed_collectives: tuple[tuple[str, Collective], ...] = ()
    head_collectives: tuple[tuple[str, Collective], ...] = ()
    cluster: Cluster | None = None
    grad_bytes: float = 4.0  # bytes per gradient the data-parallel sync moves (fp32; 2 with 16-bit reduction)
    # False: a pipeline send holds its device until the transfer is done (Megatron-LM 2021's
    # batch_isend_irecv + wait + cuda.synchronize after every exchange).
    p2p_overlap: bool = True
    # The receiving stage's all-gather of the hidden state over its tp group after a
    # pipeline exchange (Megatron's scatter/gather optimization; 0 with sp or tp = 1), seconds.
    boundary_gather_s: float = 0.0
    boundary_gather: Collective | None = None  # that all-gather itself (None: none)
    boundary_gather_link: LinkClass | None = None  # the tp group's link it runs on

    def boundary_gather_at(self, ratio: float) -> Collective | None:
        """That all-gather for a hidden state `ratio` times the nominal one (a drawn
        batch's microbatch of other tokens: `LLM.token_ratio`)."""
        c = self.boundary_gather
        if c is None:
            return None
        return all_gather(c.ranks, c.buffer_bytes * ratio, self.boundary_gather_link)
    bucket_params: float = 40e6  # Megatron's default gradient bucket (--ddp-bucket-size)
    # the LLM's embedding tied to its head: the first and last stage all-reduce its gradient
    tied_embeddings: bool = False
    notes: tuple[str, ...] = field(default=(), compare=False)

    def placement(self, pp: int) -> Placement | None:
        """Where a pipeline of `pp` stages of this layout sits on the cluster (None: no cluster)."""
        if self.cluster is None:
            return None
        return place(self.cluster, self.tp, self.cp, self.dp, pp)

    def hop_link(self, pp: int) -> LinkClass | None:
        placement = self.placement(pp)
        return None if placement is None else hop_link(self.cluster, placement)

    def stage_link(self, pp: int, a: int, b: int) -> LinkClass | None:
        """The link a send from stage a to stage b runs on (None: no cluster, or a == b)."""
        if self.cluster is None:
            return None
        self.placement(pp)  # checks whole nodes
        level = stage_level(self.cluster, self.tp, self.cp, self.dp, pp, a, b)
        return self.cluster.slowest({level}) if level else None

    def gradient_link(self, pp: int) -> LinkClass | None:
        """The link the gradient sync runs on: over dp x cp ranks, the slower of the two groups'."""
        placement = self.placement(pp)
        if placement is None:
            return None
        links = [group_link(self.cluster, placement, d) for d in ("dp", "cp")]
        links = [link for link in links if link is not None]
        return min(links, key=lambda link: link.bytes_per_s) if links else None


def check_sequence(seq_len: float, cp: int) -> None:
    if seq_len % cp:
        raise WorkloadError(f"parallel.cp: {cp} does not divide the sequence length ({seq_len:g} tokens)")
