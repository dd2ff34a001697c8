"""A whole layout (a workload document with its `parallel` section and a term)
as each training stack's launch configuration: what `mpipe plan --emit` and
`mpipe export --format megatron|mindspeed-mm|torchtitan-toml` write.

* megatron: Megatron-LM's launch arguments (flag names as
  megatron/training/arguments.py defines them): the parallel sizes, the
  microbatch and global batch, sequence parallelism, the distributed
  optimizer, virtual stages (interleaved's v as
  --num-layers-per-virtual-pipeline-stage), recompute, and
  --pipeline-model-parallel-layout for an uneven split (`megatron_layout`).
  Megatron runs its own 1F1B / interleaved order and places no encoder, so
  another generator or an encoder placement is refused, naming it.
* mindspeed-mm: the parallel fields of its launch script (TP, PP, CP, MBS,
  GBS, and the same Megatron flags it passes through) and the model config's
  `pipeline_num_layers` per stage for the vision encoder and the text decoder
  (`mindspeed.mindspeed_placement`'s refusals apply).
* torchtitan: the job TOML (`torchtitan.torchtitan_files`) with the layout's
  tensor, context and data parallel degrees in [parallelism].
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from mpipe_core.errors import MpipeError
from mpipe_core.formats.layer_split import megatron_recompute, need_layers, refuse, split_of

TARGETS = ("megatron", "mindspeed-mm", "torchtitan")
MEGATRON_ORDERS = {"1f1b": 1, "interleaved": None}  # generator -> chunks per rank (None: its v)


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
        raise refuse(fmt, f"the {', '.join(names)} encoder", "Megatron-LM's launch arguments place no encoder "
                                                                "(use --emit mindspeed-mm)")
    if split.generator not in MEGATRON_ORDERS:
        raise refuse(fmt, split.generator, "Megatron-LM runs 1F1B or interleaved 1F1B only")
    layers = need_layers(split, fmt)
    p = split.devices
    args = [f"--tensor-model-parallel-size {par['tp']}", f"--pipeline-model-parallel-size {p}",
            f"--context-parallel-size {par['cp']}", f"--micro-batch-size {mbs}",
            f"--global-batch-size {global_batch}"]
    v = split.chunks // p
    if v > 1:
        if len(set(layers)) != 1:
            raise refuse(fmt, "an uneven split with virtual stages",
                         "--num-layers-per-virtual-pipeline-stage gives every virtual stage the same layers")
        args.append(f"--num-layers-per-virtual-pipeline-stage {layers[0]}")
    elif len(set(layers)) > 1:
        from mpipe_core.formats.megatron_layout import layout_string

        args.append(f"--pipeline-model-parallel-layout '{layout_string(layers)}'")
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
    from mpipe_core.formats.mindspeed import mindspeed_placement

    fmt = "mindspeed-mm"
    doc = ev.workload.source
    if doc is None or "model" not in doc:
        raise refuse(fmt, "this workload", "its costs are explicit: there is no parallel section to write")
    par, mbs = _layout(doc)
    try:
        text, notes = mindspeed_placement(ev)
    except MpipeError as error:
        raise MpipeError(error.message.replace("mindspeed-placement", fmt)) from None
    placement = json.loads(text)["layer_placement"]
    split = split_of(ev, fmt)
    extra = ["--sequence-parallel"] if par["sp"] else []
    extra += ["--use-distributed-optimizer"] if par["distributed_optimizer"] else []
    for note in megatron_recompute(split, fmt):
        extra.append(note.removeprefix("recompute: pass "))
    out = {
        "launch": {"TP": par["tp"], "PP": split.devices, "CP": par["cp"], "MBS": mbs, "GBS": global_batch,
                   "extra_arguments": " ".join(extra)},
        "model": {"image_encoder": {"vision_encoder": {"pipeline_num_layers": placement["vit_layer_placement"]}},
                  "text_decoder": {"pipeline_num_layers": placement["llm_layer_placement"]}},
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


def emit(document: Mapping[str, Any], term: str, global_batch: int, target: str) -> str:
    """The layout as `target`'s launch configuration (text)."""
    ev = _evaluate(document, term)
    return emit_evaluation(ev, global_batch, target)


def emit_evaluation(ev: Any, global_batch: int, target: str) -> str:
    if target == "megatron":
        return " \\\n".join(megatron_arguments(ev, global_batch)) + "\n"
    if target == "mindspeed-mm":
        return mindspeed_mm(ev, global_batch)
    if target == "torchtitan":
        return torchtitan_toml(ev, global_batch)
    raise ValueError(f"unknown target {target!r}")
