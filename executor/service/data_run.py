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
    spec = parse_data(doc, base)
    if spec.dp not in (None, 1):
        raise RunSpecError(f"--data {path}: the executor runs one data-parallel replica; the data says dp={spec.dp}")
    return spec


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
               budget_ms: float | None = None) -> list[dict[str, Any]]:
    """Per step: its schedule (as the ranks read it), the packs of its slots and
    the plan's identity (`plan`: how, digest, order, predicted makespans)."""
    from mpipe_core.algebra.terms import parse
    from mpipe_core.search.per_batch import BUDGET_MS, Planner
    from mpipe_core.simulation.simulator import simulate
    from mpipe_core.workloads.batch_costs import drawn_batches, microbatch_workload, replicas

    from ..runtime.jobs import schedule_to_dict

    if replicas(workload) != 1:
        raise RunSpecError("the executor runs one data-parallel replica; the workload has "
                           f"{replicas(workload)}")
    ast = parse(term)
    planner = Planner(ast, workload)
    wrapped = ast.name == "per_batch"
    out = []
    for batch in drawn_batches(workload, planner.microbatches, steps):
        packs = batch.of(0)
        if not has_encoder and any(p.tiles for p in packs):
            raise RunSpecError(f"the data's batch {batch.index} has images but the model has no encoder")
        costs = microbatch_workload(workload, packs)
        keys = [f"{batch.index}.{i}" for i in range(len(packs))]  # a pack's key seeds its tensors
        regrouped = False
        if wrapped:
            plan = planner.plan(costs, BUDGET_MS if budget_ms is None else budget_ms, packs)
            schedule, order, how = plan.schedule, plan.order, plan.how
            if plan.packs is not None:  # the step's samples re-composed (`data.regroup`): the slots run those
                packs, keys, regrouped = plan.packs, [f"{batch.index}.r{i}" for i in range(len(plan.packs))], True
            predicted, static = plan.makespan, plan.static_makespan
        else:
            schedule, order, how = planner.static, tuple(range(len(packs))), "static"
            predicted = static = simulate(schedule, costs, check=False, remember=False).makespan
        sdict = schedule_to_dict(schedule)
        identity = [sdict, list(order)] + ([[_pieces(p) for p in packs]] if regrouped else [])
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
        out.append({
            "schedule": sdict,
            "packs": [pack_entry(packs[i], keys[i]) for i in order],
            "plan": {"step": batch.index, "how": how, "digest": digest, "order": list(order),
                     "regrouped": regrouped,
                     "predicted_makespan": predicted, "static_makespan": static,
                     "tiles": [packs[i].tiles for i in order], "tokens": [packs[i].tokens for i in order]},
        })
    return out


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
