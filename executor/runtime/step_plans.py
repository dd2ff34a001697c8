"""A data run's steps on a rank: each step's execution plan and its packs.

`mpipe run --data` gives every step its own schedule (`per_batch`'s plan for
that step's batch: another microbatch order, the encoder ops placed again,
another `encoder_batch` group size) and its own packs.  What a rank set up
once stays: the LLM chunks each rank holds, their layers, which ranks hold
the encoder and the groups that broadcast and all-reduce it
(`check_same_placement` refuses a plan that would move parameters).  With dp > 1
a rank runs its replica's packs; every replica's are kept for the step's global
batch (the loss's normaliser and the reference).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from ..errors import ExecutorError
from .models.protocol import Batch, PipelineModel
from .plan import ExecutionPlan


def placement(plan: ExecutionPlan) -> tuple:
    """What the runtime sets up once per run from a plan."""
    return (plan.devices, plan.chunks, plan.microbatches, tuple(plan.chunk_device), plan.layers, plan.encoder,
            plan.trainable, tuple(plan.holds_encoder(d) for d in range(plan.devices)),
            tuple(r.chunks for r in plan.ranks), plan.bcast_group, plan.bcast_src, plan.ar_group)


def check_same_placement(plans: list[ExecutionPlan]) -> None:
    first = placement(plans[0])
    for step, plan in enumerate(plans[1:], start=1):
        if placement(plan) != first:
            raise ExecutorError(f"step {step}'s plan places the LLM chunks or the encoder's parameters on other "
                                "ranks than step 0's: moving parameters between steps is not run")


def takes_piece_keys(model: PipelineModel) -> bool:
    """Whether the model's `data_batch` seeds pieces by their own keys (a plug-in
    written before piece keys takes only `(pieces, key)`)."""
    try:
        params = inspect.signature(model.data_batch).parameters
    except (TypeError, ValueError):
        return False
    return "piece_keys" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@dataclass
class DataStep:
    """One step of a data run: its plan and, per slot, the pack it runs."""

    plan: ExecutionPlan
    # {"key": the pack's draw position, "pieces": [[tiles...], text, frames], ...,
    #  "piece_keys": [each piece's draw position, ...]} ("piece_keys" absent in plans made before them)
    packs: list[dict[str, Any]]
    record: dict[str, Any]
    # With dp > 1: every replica's packs, replica order (this rank's `packs` among them); None: one replica.
    replica_packs: list[list[dict[str, Any]]] | None = None

    def pieces(self, slot: int) -> list[tuple[tuple[int, ...], int, int]]:
        return [(tuple(t), int(n), int(f)) for t, n, f in self.packs[slot]["pieces"]]

    def batch(self, model: PipelineModel, slot: int) -> Batch:
        """The slot's pack: each piece's tensors seeded by its own key where the plan
        has them and the model takes them (`piece_keys`), else the pack's by its key."""
        pack = self.packs[slot]
        if pack.get("piece_keys") and takes_piece_keys(model):
            return model.data_batch(self.pieces(slot), pack["key"], piece_keys=list(pack["piece_keys"]))
        return model.data_batch(self.pieces(slot), pack["key"])

    def image_counts(self, has_encoder: bool) -> list[int]:
        """Encoder inputs per slot: every tile and video frame."""
        if not has_encoder:
            return [0] * len(self.packs)
        return [sum(sum(t) + f for t, _, f in self.pieces(s)) for s in range(len(self.packs))]

    def batches(self, model: PipelineModel) -> list[Batch]:
        """The step's batches in the order its plan runs them (what the single-process
        reference runs: the same batches, gradients accumulated in the same microbatch
        order as before `per_batch` permuted them, so the check's slack is only the
        schedule's own summation order)."""
        return [self.batch(model, s) for s in range(len(self.packs))]

    def global_batches(self, model: PipelineModel) -> list[Batch]:
        """Every replica's batches, replica after replica (each in its plan's order): the
        step's global batch, which the loss is normalised over and the reference runs."""
        if not self.replica_packs:
            return self.batches(model)
        return [DataStep(self.plan, packs, self.record).batch(model, s)
                for packs in self.replica_packs for s in range(len(packs))]
