"""`mpipe run --data FILE`: each step planned from that step's drawn batch.

The data are drawn exactly as the core draws them (`batch_costs.drawn_batches`:
the same packing, the same order), so the prediction and the run agree on
which samples form each microbatch.  Each step gets the plan `per_batch(t)`'s
planner (`mpipe_core.search.per_batch.Planner`) makes for its batch, or the
static plan of `t` when the term is not wrapped; the ranks receive, per step,
the schedule, the packs each slot runs (a pack's pieces: tiles per image, text
tokens, frames) and the plan's identity, which the timeline keeps.

Planning happens once, at launch, for every step (the steps of a run are
known in advance): a training loop would plan step s + 1 while step s runs.

FILE is a data section (JSON, `docs/data.md`; its `samples` file relative to
FILE's folder) or a `.jsonl` of samples whose packing comes from the
workload's data section, else `DEFAULT_PACKING`.  A tile (or a video frame)
is one encoder input of the model, so the data's `tokens` must be the model's
tokens per encoder input (`feature_shape()[0]`); they default to it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from mpipe_core.data.spec import DataSpec, parse_data
from mpipe_core.errors import MpipeError
from mpipe_core.workloads.inputs import load_document, read_bounded
from mpipe_core.workloads.workload import Workload

from ..errors import RunSpecError

DEFAULT_PACKING = {"max_tiles": 8, "max_tokens": 64}
DATA_DOCUMENT_LIMIT = 1024 * 1024  # a data section file (its samples file has the core's own limit)


def read_data_document(path: str, workload_data: dict | None = None) -> tuple[dict, Path]:
    """(the data section FILE names, the folder its file names are relative to)."""
    file = Path(path)
    if file.suffix == ".jsonl":
        doc: dict[str, Any] = {k: v for k, v in (workload_data or {}).items() if k != "samples"}
        doc["samples"] = str(file.resolve())
        doc.setdefault("packing", dict(DEFAULT_PACKING))
        return doc, file.parent
    raw = read_bounded(file, DATA_DOCUMENT_LIMIT, "a data section")
    doc = load_document(raw, f"--data {path}")
    if not isinstance(doc, dict):
        raise RunSpecError(f"--data {path}: expected a data section object or a .jsonl file of samples")
    return doc, file.parent


def data_spec(path: str, tokens_per_tile: int, workload_data: dict | None = None) -> DataSpec:
    """The run's data, its tokens per tile checked against the model's."""
    doc, base = read_data_document(path, workload_data)
    if isinstance(doc.get("tokens"), dict):
        for key in ("per_tile", "per_frame"):
            stated = doc["tokens"].get(key)
            if stated is not None and stated != tokens_per_tile:
                raise RunSpecError(f"--data {path}: tokens.{key} is {stated} but the model's encoder gives "
                                   f"{tokens_per_tile} tokens per input (a tile or a frame is one input)")
    else:
        doc = {**doc, "tokens": {"per_tile": tokens_per_tile, "per_frame": tokens_per_tile}}
    return parse_data(doc, base)


def with_data(workload: Workload, spec: DataSpec) -> Workload:
    """`workload` whose microbatches are the data's packs: its encoder costs per
    tile (an `images` count gives way to the data's tiles)."""
    encoders = tuple(replace(e, images=None) for e in workload.encoders)
    return replace(workload, encoders=encoders, data=spec)


def _pieces(pack) -> list[list]:
    return [[list(p.tiles), p.text_tokens, p.frames] for p in pack.pieces]


def pack_entry(pack, key: str) -> dict[str, Any]:
    """What a rank gets for one slot: the pack's key (its place among the step's packs),
    its pieces and each piece's own key (`Sample.key`, its place in the draw), which seeds
    the piece's tensors wherever `regroup` puts it."""
    return {"key": key, "pieces": _pieces(pack), "piece_keys": [p.key for p in pack.pieces]}


def step_plans(term: str, workload: Workload, steps: int, has_encoder: bool,
               budget_ms: float | None = None, dp: int = 1) -> list[dict[str, Any]]:
    """Per step: its schedule (as the ranks read it), the packs of its slots and
    the plan's identity (`plan`: how, digest, order, predicted makespans).

    With `dp` replicas each step's global batch is dp x M packs, drawn as the core
    draws them (`Batch.of(r)`: replica r's share), and each replica's share is
    planned on its own; the step then carries every replica's packs
    (`replica_packs`) and, in `plan`, replica 0's plan with each replica's
    (`replicas`).  The replicas must run one schedule per step: they run in
    lockstep (each chunk's gradient reduction is one collective over them,
    issued where the chunk's last weight-gradient op runs), so a step whose
    replicas' `per_batch` plans differ is refused, not run."""
    from mpipe_core.algebra.terms import parse
    from mpipe_core.search.per_batch import Planner
    from mpipe_core.workloads.batch_costs import drawn_batches

    stated = workload.data.dp if workload.data is not None else None
    if stated not in (None, dp):
        raise RunSpecError(f"the data section says dp={stated} but the run's layout has dp={dp}")
    workload = replace(workload, data=replace(workload.data, dp=dp))  # the draw deals dp shares a step
    ast = parse(term)
    planner = Planner(ast, workload)
    out = []
    for batch in drawn_batches(workload, planner.microbatches, steps):
        shares = [_replica_step(planner, ast.name == "per_batch", workload, batch, r, has_encoder, budget_ms)
                  for r in range(dp)]
        first = shares[0]
        for r, share in enumerate(shares[1:], start=1):
            why = lockstep_conflict(first["schedule"], share["schedule"])
            if why is not None:
                raise RunSpecError(
                    f"step {batch.index}: per_batch planned data-parallel replica {r}'s share "
                    f"({share['plan']['how']}) unlike replica 0's ({first['plan']['how']}): {why}; "
                    f"the replicas run in lockstep (each chunk's gradient reduction is one collective over "
                    f"them, launched after the chunk's last weight-gradient op), so they cannot run it: run "
                    f"the term without per_batch, or dp=1")
        step = {"schedule": first["schedule"], "packs": first["packs"], "plan": first["plan"]}
        if dp > 1:
            step["replica_packs"] = [s["packs"] for s in shares]
            step["plan"] = {**first["plan"], "replicas": [s["plan"] for s in shares]}
        out.append(step)
    return out


def lockstep_conflict(schedule: dict, other: dict) -> str | None:
    """Why two replicas' schedules of one step cannot run side by side, or None.  Their
    op orders may differ; what every replica set up once may not (what each rank
    holds: `step_plans.placement`), nor the order in which each rank's chunks finish
    their weight gradients: that is the order of the collectives over the replicas."""
    from ..parallel.data_parallel import last_weight_ops
    from ..runtime.jobs import schedule_from_dict
    from ..runtime.plan import build_plan
    from ..runtime.step_plans import placement
    from mpipe_core.ir.ops import BW, LLM, W

    if schedule == other:
        return None
    a, b = build_plan(schedule_from_dict(schedule)), build_plan(schedule_from_dict(other))
    if placement(a) != placement(b):
        return "its ranks would hold other chunks or encoder parameters"

    def finishing(plan, device: int) -> list[int]:  # the chunks in the order their last W runs
        return [c for _, c in sorted(last_weight_ops(plan.ranks[device].ops, LLM, (W, BW)).items())]

    for device in range(a.devices):
        if finishing(a, device) != finishing(b, device):
            return (f"device {device} finishes its chunks' weight gradients in the order {finishing(b, device)} "
                    f"there, {finishing(a, device)} in replica 0's")
    return None


def _replica_step(planner, wrapped: bool, workload: Workload, batch, replica: int, has_encoder: bool,
                  budget_ms: float | None) -> dict[str, Any]:
    """One replica's share of a step: its schedule, packs (slot order) and plan."""
    from mpipe_core.search.per_batch import BUDGET_MS
    from mpipe_core.simulation.simulator import simulate
    from mpipe_core.workloads.batch_costs import microbatch_workload

    from ..runtime.jobs import schedule_to_dict

    packs = batch.of(replica)
    if not has_encoder and any(p.tiles for p in packs):
        raise RunSpecError(f"the data's batch {batch.index} has images but the model has no encoder")
    costs = microbatch_workload(workload, packs)
    # A pack's key seeds its tensors: its place among the step's packs (replica 0's are 0..M-1, as before).
    base = replica * len(packs)
    keys = [f"{batch.index}.{base + i}" for i in range(len(packs))]
    regrouped = False
    if wrapped:
        plan = planner.plan(costs, BUDGET_MS if budget_ms is None else budget_ms, packs)
        schedule, order, how = plan.schedule, plan.order, plan.how
        if plan.packs is not None:  # the step's samples re-composed (`data.regroup`): the slots run those
            packs = plan.packs
            keys, regrouped = [f"{batch.index}.r{base + i}" for i in range(len(plan.packs))], True
        predicted, static = plan.makespan, plan.static_makespan
    else:
        schedule, order, how = planner.static, tuple(range(len(packs))), "static"
        predicted = static = simulate(schedule, costs, check=False, remember=False).makespan
    sdict = schedule_to_dict(schedule)
    identity = [sdict, list(order)] + ([[_pieces(p) for p in packs]] if regrouped else [])
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return {
        "schedule": sdict,
        "packs": [pack_entry(packs[i], keys[i]) for i in order],
        "plan": {"step": batch.index, "how": how, "digest": digest, "order": list(order),
                 "regrouped": regrouped,
                 "predicted_makespan": predicted, "static_makespan": static,
                 "tiles": [packs[i].tiles for i in order], "tokens": [packs[i].tokens for i in order]},
    }


def check_data_model(model, where: str) -> None:
    """A model `--data` can feed: one with `data_batch(pieces, key)` that makes a
    batch of a one-tile sample (so a model that refuses data says so before launch)."""
    if not callable(getattr(model, "data_batch", None)):
        raise MpipeError(f"model '{getattr(model, 'name', where)}' has no data_batch(pieces, key), so --data "
                         "cannot shape its batches (docs/running.md, the plug-in protocol)")
    model.data_batch([((1,) if model.encoder is not None else (), 2, 0)], "probe")


def plan_line(plan: dict) -> str:
    """One step's plan of a data run, in words."""
    order = "regrouped microbatches" if plan.get("regrouped") else "microbatch order"
    line = (f"plan {plan['digest']} ({plan['how']}), {order} {plan['order']}, tiles {plan['tiles']}, "
            f"tokens {plan['tokens']}; predicted {plan['predicted_makespan']:.4g}")
    if plan["static_makespan"] != plan["predicted_makespan"]:
        line += f" (static plan {plan['static_makespan']:.4g})"
    return line
