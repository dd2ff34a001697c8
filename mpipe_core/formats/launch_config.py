"""A whole layout (a workload document with its `parallel` section and a term)
as each training stack's launch configuration: what `mpipe plan --emit` and
`mpipe export --format megatron|mindspeed-mm|torchtitan-toml` write.

* megatron: Megatron-LM's launch arguments (flag names as
  megatron/training/arguments.py and megatron/core/model_parallel_config.py
  define them, NVIDIA/Megatron-LM at d98e8a64ddf3): the parallel sizes, the
  microbatch and global batch, sequence parallelism, the distributed
  optimizer, virtual stages (interleaved's v as
  --num-layers-per-virtual-pipeline-stage, or in the layout string for an
  uneven split) with --microbatch-group-size-per-virtual-pipeline-stage (the
  interleaved order's round size), recompute, and
  --pipeline-model-parallel-layout for an uneven split (`megatron_layout`).
  Megatron runs its own 1F1B / interleaved order and places no encoder, so
  another order (`stack_orders`) or an encoder placement is refused, naming it.
* mindspeed-mm: the parallel fields of its launch script (TP, PP, CP, MBS,
  GBS, and the Megatron flags it passes through, --virtual-pipeline-model-
  parallel-size for interleaved) and the model config's `pipeline_num_layers`
  for the vision encoder and the text decoder: one entry per stage, or with
  virtual stages one list per virtual stage (`pipeline_num_layers[vp][pp]`,
  as mindspeed_mm/models/vlm_model.py reads it).  `encoder_batch` is refused
  (MindSpeed-MM's encoder MBS scale needs its hetero-parallel form).
* torchtitan: the job TOML (`torchtitan.torchtitan_files`) with the layout's
  tensor, context and data parallel degrees in [parallelism], and the
  schedule CSV it names (the order itself).

`LAUNCH_TARGETS` is the one table of targets: `plan --emit`, `plan
--runnable-by`, `export --format` and the app read it, so a target added there
(`register`) is offered everywhere.  A refusal says which other target can
run the same layout, and never names one that refuses it too.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from mpipe_core.errors import MpipeError
from mpipe_core.formats.layer_split import megatron_recompute, need_layers, refuse, split_of
from mpipe_core.formats.stack_orders import (MEGATRON_ORDERS, MEGATRON_WHY, MINDSPEED_DEFAULT_WHY, MINDSPEED_WHY,
                                             ORDER_KEEPING, microbatch_group, require_order)


def _layout(document: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    from mpipe_core.workloads.analytic import parallel_section

    model = document.get("model")
    mbs = model.get("microbatch_size", 1) if isinstance(model, dict) else 1
    return parallel_section(document), int(mbs)


def _evaluate(document: Mapping[str, Any], term: str):
    from mpipe_core.api import evaluate

    return evaluate(term, dict(document))


def megatron_arguments(ev: Any, global_batch: int, fmt: str = "megatron") -> list[str]:
    """Megatron-LM's launch arguments for an evaluation of an analytic workload."""
    doc = ev.workload.source
    if doc is None or "model" not in doc:
        raise refuse(fmt, "this workload", "its costs are explicit: there is no parallel section to write")
    par, mbs = _layout(doc)
    split = split_of(ev, fmt)
    if split.fused_encoders or split.encoder is not None:
        names = split.fused_encoders or list(split.encoder_layers)
        raise refuse(fmt, f"the {', '.join(names)} encoder", "Megatron-LM's launch arguments place no encoder")
    require_order(ev, split, fmt, MEGATRON_ORDERS, MEGATRON_WHY)
    layers = need_layers(split, fmt)
    p = split.devices
    args = [f"--tensor-model-parallel-size {par['tp']}", f"--pipeline-model-parallel-size {p}",
            f"--context-parallel-size {par['cp']}", f"--micro-batch-size {mbs}",
            f"--global-batch-size {global_batch}"]
    v = split.chunks // p
    if len(set(layers)) > 1:  # the layout string also sets the virtual stages (one of the two, arguments.py)
        from mpipe_core.formats.megatron_layout import layout_string

        args.append(f"--pipeline-model-parallel-layout '{layout_string(layers)}'")
    elif v > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {layers[0]}")
    if v > 1:
        args.append(f"--microbatch-group-size-per-virtual-pipeline-stage {microbatch_group(ev, split, fmt)}")
    if par["sp"]:
        args.append("--sequence-parallel")
    if par["distributed_optimizer"]:
        args.append("--use-distributed-optimizer")
    if par["overlap_grad_reduce"]:
        args.append("--overlap-grad-reduce")
    if par["tp_comm_overlap"]:
        args.append("--tp-comm-overlap")
    for note in megatron_recompute(split, fmt):
        option = note.removeprefix("recompute: pass ")
        args += ["--" + part.removeprefix("--") for part in option.split(" --")]
    return [a for a in args if a]


def mindspeed_mm(ev: Any, global_batch: int) -> str:
    """MindSpeed-MM: the launch script's parallel fields and the model config's pipeline_num_layers."""
    from mpipe_core.formats.mindspeed import stage_layers

    fmt = "mindspeed-mm"
    doc = ev.workload.source
    if doc is None or "model" not in doc:
        raise refuse(fmt, "this workload", "its costs are explicit: there is no parallel section to write")
    par, mbs = _layout(doc)
    split = split_of(ev, fmt)
    require_order(ev, split, fmt, MEGATRON_ORDERS, MINDSPEED_WHY, MINDSPEED_DEFAULT_WHY)
    vit, llm, notes = stage_layers(split, fmt)
    if split.encoder_batch > 1:
        raise refuse(fmt, "encoder_batch", "MindSpeed-MM's --hetero-encoder-mbs-scale needs --hetero-parallel, "
                                           "which takes TP, PP and CP from the model config and 1 from the launch "
                                           "script (mindspeed_mm/patchs/validate_args_patch.py); Mpipe does not "
                                           "write that form")
    p, v = split.devices, split.chunks // split.devices
    extra = []
    if v > 1:
        extra += [f"--virtual-pipeline-model-parallel-size {v}",
                  f"--microbatch-group-size-per-virtual-pipeline-stage {microbatch_group(ev, split, fmt)}"]
        vit = [vit[i * p:(i + 1) * p] for i in range(v)]  # pipeline_num_layers[vp][pp]: chunk vp*PP + pp
        llm = [llm[i * p:(i + 1) * p] for i in range(v)]
    extra += ["--sequence-parallel"] if par["sp"] else []
    extra += ["--use-distributed-optimizer"] if par["distributed_optimizer"] else []
    for note in notes:
        if note.startswith("recompute: pass "):
            extra.append(note.removeprefix("recompute: pass "))
    out = {
        "launch": {"TP": par["tp"], "PP": p, "CP": par["cp"], "MBS": mbs, "GBS": global_batch,
                   "extra_arguments": " ".join(extra)},
        "model": {"image_encoder": {"vision_encoder": {"pipeline_num_layers": vit}},
                  "text_decoder": {"pipeline_num_layers": llm}},
    }
    notes = [n for n in notes if not n.startswith("recompute:")]
    if notes:
        out["notes"] = notes
    return json.dumps(out, indent=2) + "\n"


def torchtitan_toml(ev: Any, global_batch: int) -> str:
    from mpipe_core.formats.torchtitan import torchtitan_files

    files, _ = torchtitan_files(ev)
    toml = next(text for name, text in files.items() if name.endswith(".toml"))
    return with_layout(toml, ev, global_batch)


def global_batch_of(ev: Any) -> int:
    """dp x microbatch size x microbatches: the global batch an evaluation's layout runs."""
    doc = ev.workload.source
    if doc is None or "model" not in doc:
        return ev.schedule.pipelines[0].microbatches
    par, mbs = _layout(doc)
    return par["dp"] * mbs * ev.schedule.pipelines[0].microbatches


def with_layout(toml: str, ev: Any, global_batch: int) -> str:
    """torchtitan's TOML with an analytic workload's tensor, context and data parallel degrees and batch."""
    import re

    doc = ev.workload.source
    if doc is None or "model" not in doc:
        return toml

    par, mbs = _layout(doc)
    shard, replicate = (par["dp"], 1) if par["distributed_optimizer"] else (1, par["dp"])
    degrees = (f"tensor_parallel_degree = {par['tp']}\ncontext_parallel_degree = {par['cp']}\n"
               f"data_parallel_shard_degree = {shard}\ndata_parallel_replicate_degree = {replicate}\n")
    toml = toml.replace("[parallelism]\n", "[parallelism]\n" + degrees, 1)
    toml = toml.replace("pipeline_parallel_microbatch_size = 1", f"pipeline_parallel_microbatch_size = {mbs}")
    m = ev.schedule.pipelines[0].microbatches
    toml = re.sub(r"local_batch_size = \d+[^\n]*", f"local_batch_size = {global_batch // par['dp']}  # {m} "
                  f"microbatches of {mbs} per data-parallel rank\nglobal_batch_size = {global_batch}", toml)
    return toml


@dataclass(frozen=True)
class LaunchTarget:
    """A stack `plan --emit` can write for: its name, the stack's own name, its
    files ({file name: text}) for an evaluation and a global batch, and two
    quick checks that need no evaluation (a search ranks only what passes them
    with `--runnable-by`): whether a term's combinators can be run at all, and
    why a workload cannot be (None: it can)."""
    name: str
    label: str
    files: Callable[[Any, int], dict[str, str]]
    calls_allowed: Callable[[list[str]], bool] = lambda calls: True
    workload_refusal: Callable[[Mapping[str, Any]], str | None] = lambda document: None


def _megatron_calls() -> Callable[[list[str]], bool]:
    """A term of Megatron's own orders and combinators that keep them (`stack_orders`)."""
    def allowed(calls: list[str]) -> bool:
        return any(c in MEGATRON_ORDERS for c in calls) and all(c in MEGATRON_ORDERS or c in ORDER_KEEPING
                                                                 for c in calls)
    return allowed


def _torchtitan_calls(calls: list[str]) -> bool:
    from mpipe_core.formats.layer_split import PLACERS, SHAPERS

    return not any(c in PLACERS or c in SHAPERS for c in calls)


def _no_encoders(document: Mapping[str, Any]) -> str | None:
    encoders = document.get("encoders") or []
    if not encoders:
        return None
    names = [e.get("name", "encoder") if isinstance(e, dict) else str(e) for e in encoders]
    return f"Megatron-LM's launch arguments place no encoder, and the workload has {', '.join(names)}"


def _megatron_files(ev: Any, global_batch: int) -> dict[str, str]:
    return {"megatron_args.txt": " \\\n".join(megatron_arguments(ev, global_batch)) + "\n"}


def _mindspeed_mm_files(ev: Any, global_batch: int) -> dict[str, str]:
    return {"mindspeed_mm.json": mindspeed_mm(ev, global_batch)}


def _torchtitan_files(ev: Any, global_batch: int) -> dict[str, str]:
    from mpipe_core.formats.torchtitan import CSV_NAME, TOML_NAME, torchtitan_files

    files, _ = torchtitan_files(ev)
    return {TOML_NAME: with_layout(files[TOML_NAME], ev, global_batch), CSV_NAME: files[CSV_NAME]}


LAUNCH_TARGETS: dict[str, LaunchTarget] = {}


def register(target: LaunchTarget) -> None:
    """Offer another launch target (to `plan --emit`, `--runnable-by`, `export` and the app)."""
    LAUNCH_TARGETS[target.name] = target


for _target in (LaunchTarget("megatron", "Megatron-LM", _megatron_files, _megatron_calls(), _no_encoders),
                LaunchTarget("mindspeed-mm", "MindSpeed-MM", _mindspeed_mm_files, _megatron_calls()),
                LaunchTarget("torchtitan", "torchtitan", _torchtitan_files, _torchtitan_calls)):
    register(_target)


def may_run(target: str, term: str) -> bool:
    """Whether `target` may run `term` (its combinators only; `launch_files` decides)."""
    from mpipe_core.algebra.terms import parse
    from mpipe_core.formats.layer_split import calls_of

    return _target(target).calls_allowed(calls_of(parse(term)))


def _target(name: str) -> LaunchTarget:
    if name not in LAUNCH_TARGETS:
        raise ValueError(f"unknown target {name!r}")
    return LAUNCH_TARGETS[name]


def launch_files(ev: Any, global_batch: int, target: str) -> dict[str, str]:
    """`target`'s files for the evaluation; a refusal names the other targets
    that can run the same layout (none that refuse it too)."""
    try:
        return _target(target).files(ev, global_batch)
    except MpipeError as error:
        others = [name for name in LAUNCH_TARGETS if name != target and refusal_of(ev, global_batch, name) is None]
        if not others:
            raise
        raise MpipeError(f"{error.message} ({' and '.join(others)} can run it)") from None


def refusal_of(ev: Any, global_batch: int, target: str) -> str | None:
    """Why `target` cannot run the evaluation's layout, or None when it can."""
    try:
        _target(target).files(ev, global_batch)
    except MpipeError as error:
        return error.message
    return None


def as_text(files: Mapping[str, str]) -> str:
    """One file's text as it is; several, each under a `# name` line."""
    if len(files) == 1:
        return next(iter(files.values()))
    return "\n".join(f"# {name}\n{text}" for name, text in files.items())


def emit(document: Mapping[str, Any], term: str, global_batch: int, target: str) -> str:
    """The layout as `target`'s launch configuration (text)."""
    ev = _evaluate(document, term)
    return emit_evaluation(ev, global_batch, target)


def emit_evaluation(ev: Any, global_batch: int, target: str) -> str:
    return as_text(launch_files(ev, global_batch, target))
