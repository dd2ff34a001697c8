"""A schedule for torchtitan: the CSV its `--parallelism.pipeline_parallel_schedule_csv`
loads (torch's `_PipelineScheduleRuntime._load_csv`, compute only: torch adds
the sends and receives itself) and a TOML snippet of the options that go with it.

The snippet's `module_fqns_per_model_part` gives each stage (chunk, in stage
order) its modules, from the schedule's layer split (`partition`, `balanced`,
else the workload's even split).  The FQN template names the model's modules
in model order, comma-separated; an entry with `{}` stands for one module per
layer (the first such entry is a folded encoder's layers when `balanced`
folded one, the other the LLM's), any other entry is a module that goes with
the layer after it (or, at the end, with the last stage).  The default is
torchtitan's Llama: `tok_embeddings,layers.{},norm,output`.

`pipeline_parallel_schedule` only decides, with a CSV, how torchtitan places
stages on ranks: looped (`1F1B` with one stage per rank, else
`Interleaved1F1B`) or in a V (`ZBVZeroBubble`).

A `recompute(...)` of every LLM layer becomes `[activation_checkpoint]`
`mode = "full"` (or `"selective"` with `selective_ac_option = "op"`); one of
some layers only, of folded encoder layers, and `encoder_batch(..., k)` (the
encoder runs inside stage 0's module, once per microbatch) are refused.
"""
from __future__ import annotations

from typing import Any

from mpipe_core.errors import MpipeError
from mpipe_core.formats.layer_split import LOOP, need_layers, refuse, split_of
from mpipe_core.formats.torch_csv import to_torch_csv

FORMAT = "torchtitan"
LLAMA_FQNS = "tok_embeddings,layers.{},norm,output"
CSV_NAME, TOML_NAME = "schedule.csv", "torchtitan.toml"


def _template(text: str, folded: bool) -> list[tuple[str, str]]:
    """[("module", fqn) | ("llm" | "encoder", pattern)] in model order."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    layered = [p for p in parts if "{}" in p]
    if any(p.count("{}") > 1 for p in parts) or not 1 <= len(layered) <= 2:
        raise MpipeError(f"--fqn-template '{text[:80]}': give one entry with {{}} for the LLM's layers "
                         f"(and one before it for a folded encoder's), e.g. {LLAMA_FQNS}")
    if folded and len(layered) != 2:
        raise MpipeError(f"--fqn-template '{text[:80]}': balanced(...) folded encoder layers into the stages; "
                         f"name them with a second {{}} entry before the LLM's, e.g. "
                         f"vision.blocks.{{}},{LLAMA_FQNS}")
    out, seen = [], 0
    for p in parts:
        if "{}" in p:
            seen += 1
            out.append(("encoder" if len(layered) == 2 and seen == 1 else "llm", p))
        else:
            out.append(("module", p))
    return out


def module_fqns(llm: list[int], encoder: list[int] | None, template: str = LLAMA_FQNS) -> list[list[str]]:
    """Each stage's module FQNs: stage c holds its share of the encoder's layers
    and of the LLM's, in order; a plain module goes with the next layer."""
    items = _template(template, encoder is not None)
    owner = {"llm": [c for c, k in enumerate(llm) for _ in range(k)],
             "encoder": [c for c, k in enumerate(encoder or []) for _ in range(k)]}
    sequence: list[tuple[int | None, str]] = []  # (stage or None for a plain module, fqn)
    for kind, pattern in items:
        if kind == "module":
            sequence.append((None, pattern))
        else:
            sequence.extend((stage, pattern.replace("{}", str(i))) for i, stage in enumerate(owner[kind]))
    stages: list[list[str]] = [[] for _ in llm]
    pending: list[str] = []
    for stage, fqn in sequence:
        if stage is None:
            pending.append(fqn)
        else:
            stages[stage] += pending + [fqn]
            pending = []
    stages[-1] += pending
    return stages


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"


def torchtitan_files(ev: Any, csv_path: str = CSV_NAME, template: str = LLAMA_FQNS) -> tuple[dict[str, str], list[str]]:
    """{file name: text} (the CSV and the TOML snippet) and notes."""
    split = split_of(ev, FORMAT)
    if split.encoder_batch > 1:
        raise refuse(FORMAT, "encoder_batch", "torchtitan runs the encoder inside stage 0's module, once per "
                                              "microbatch")
    if split.encoder_recompute:
        raise refuse(FORMAT, "recompute of the folded encoder layers",
                     "torchtitan's activation_checkpoint covers the LLM's layers only")
    if split.recompute is not None and split.recompute[0] not in ("full", "selective"):
        raise refuse(FORMAT, "recompute of some layers only",
                     "torchtitan's activation_checkpoint.mode recomputes every layer (full or selective)")
    try:
        csv_text, notes = to_torch_csv(ev.schedule)
    except MpipeError as error:
        raise refuse(FORMAT, "this schedule", error.message) from None
    p, v = split.devices, split.chunks // split.devices
    name = "ZBVZeroBubble" if split.placement != LOOP else ("1F1B" if v == 1 else "Interleaved1F1B")
    m = ev.schedule.pipelines[0].microbatches
    lines = [f"# Mpipe: {ev.term}",
             "# CSV written by `mpipe export --format torchtitan`; torchtitan runs it with _PipelineScheduleRuntime.",
             "[parallelism]",
             f"pipeline_parallel_degree = {p}",
             f'pipeline_parallel_schedule = "{name}"  # with a CSV: only how stages are placed on ranks',
             f'pipeline_parallel_schedule_csv = "{csv_path}"',
             "pipeline_parallel_microbatch_size = 1",
             ]
    if split.llm is not None:
        fqns = module_fqns(need_layers(split, FORMAT), split.encoder, template)
        lines.append("module_fqns_per_model_part = [")
        lines += [f"  {_toml_list(stage)},  # stage {c} on rank {_rank(c, p, split.placement)}"
                  for c, stage in enumerate(fqns)]
        lines.append("]")
    else:
        notes.append("the workload does not say how many LLM layers there are: no module_fqns_per_model_part "
                     "(torchtitan then splits the layers evenly)")
    lines += ["", "[training]",
              f"local_batch_size = {m}  # {m} microbatches = local_batch_size / pipeline_parallel_microbatch_size"]
    if split.recompute is not None:
        mode = split.recompute[0]
        lines += ["", "[activation_checkpoint]", f'mode = "{mode}"'] + \
                 (['selective_ac_option = "op"'] if mode == "selective" else [])
        notes.append(f'recompute: activation_checkpoint.mode = "{mode}" (in {TOML_NAME})')
    if split.fused_encoders:
        notes.append(f"the {', '.join(split.fused_encoders)} encoder runs inside stage 0's module in torchtitan; "
                     f"its ops are not in the CSV")
    return {CSV_NAME: csv_text, TOML_NAME: "\n".join(lines) + "\n"}, notes


def _rank(chunk: int, p: int, placement: str) -> int:
    if placement == LOOP:
        return chunk % p
    return chunk if chunk < p else 2 * p - 1 - chunk
