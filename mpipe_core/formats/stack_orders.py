"""Which pipeline orders the training stacks run, and the check that a term's
order is one of them, so that a stack config never launches an order other
than the one Mpipe simulated.

What each stack runs, as read in its source:

* Megatron-LM (NVIDIA/Megatron-LM at d98e8a64ddf3,
  megatron/core/pipeline_parallel/schedules.py): two orders.
  `forward_backward_pipelining_without_interleaving` is 1F1B with
  `p - r - 1` warm-up forwards on rank r: Mpipe's `1f1b`.
  `forward_backward_pipelining_with_interleaving` is interleaved 1F1B: its
  `get_schedule_table` takes microbatches in groups of
  `config.microbatch_group_size_per_vp_stage` (the flag
  `--microbatch-group-size-per-virtual-pipeline-stage`,
  megatron/core/model_parallel_config.py; default: the pipeline size), each
  group through every virtual stage in turn, after
  `2(p - r - 1) + (v - 1) * group` warm-up forwards
  (`get_pp_rank_microbatches`): Mpipe's `interleaved(p, m, v)` with the group
  its round size (`check_rounds`).  It raises when the group is smaller than
  the pipeline size or larger than M, and arguments.py refuses virtual stages
  on a pipeline size of 1.  Virtual stages come from
  `--num-layers-per-virtual-pipeline-stage` or, with an uneven split,
  `--pipeline-model-parallel-layout` (megatron/training/arguments.py allows
  one of the two).  No zero-bubble, GPipe, breadth-first or V order: those
  are refused.
* MindSpeed-MM (Ascend/MindSpeed-MM at 57069cd55a8a, on Megatron Core 0.12.1)
  runs Megatron's two orders; its VLM model builds stage `vp * PP + pp` from
  `pipeline_num_layers[vp][pp]` (mindspeed_mm/models/vlm_model.py) and turns
  virtual stages on with `--virtual-pipeline-model-parallel-size`
  (mindspeed_mm/arguments.py; validate_args_patch.py requires it to equal
  the length of `pipeline_num_layers`).  MindSpeed (Ascend/MindSpeed at
  028de58ca629) adds one pipeline order, `--schedules-method dualpipev`
  (mindspeed/features_manager/pipeline_parallel/dualpipev_feature.py), that
  MindSpeed-MM wires to its MoE text decoder only, never to the VLM model's
  looped stages; no branch of MindSpeed has a zero-bubble option
  (`--enable-zero-bubble` is sail-sg's zero-bubble fork of Megatron).
* torchtitan loads any compute order as torch's CSV (`torch_csv`), so it has
  no list here.
"""
from __future__ import annotations

from typing import Any

from mpipe_core.formats.layer_split import Split, refuse
from mpipe_core.ir.ops import LLM

MEGATRON_ORDERS = ("1f1b", "interleaved")
# Combinators that leave the LLM's order as its generator wrote it (they change layers or costs).
ORDER_KEEPING = ("partition", "balanced", "recompute", "per_batch")

MEGATRON_WHY = "Megatron-LM runs 1F1B and interleaved 1F1B only (megatron/core/pipeline_parallel/schedules.py)"
MINDSPEED_WHY = {
    "zbv": "MindSpeed-MM's VLM model places stage s on rank s mod PP; MindSpeed's V order, --schedules-method "
           "dualpipev, is DualPipeV, and MindSpeed-MM runs it for its MoE text decoder only",
    "dualpipev": "MindSpeed-MM's VLM model places stage s on rank s mod PP; MindSpeed's --schedules-method "
                 "dualpipev is wired to its MoE text decoder only",
}
MINDSPEED_DEFAULT_WHY = ("MindSpeed-MM runs Megatron's 1F1B and interleaved 1F1B (MindSpeed adds no zero-bubble, "
                         "GPipe or breadth-first order)")


def _generator_call(node: Any) -> Any:
    from mpipe_core.algebra.generators import GENERATORS

    stack = [node]
    while stack:
        n = stack.pop()
        if getattr(n, "name", None) in GENERATORS:
            return n
        stack.extend(getattr(n, "args", ()))
        stack.extend(v for _, v in getattr(n, "kwargs", ()))
    return None


def _llm_orders(orders: Any) -> list[list[tuple[str, int, int]]]:
    return [[(op.kind, op.chunk, op.mb) for op in order if op.module == LLM] for order in orders]


def require_order(ev: Any, split: Split, fmt: str, runs: tuple[str, ...], why: str | dict[str, str],
                  default_why: str = "") -> None:
    """Refuse, naming the part, unless the term's LLM order is one of `runs`'
    generators exactly as that generator writes it (what the stack will run)."""
    from mpipe_core.algebra.generators import GENERATORS

    if split.generator not in runs:
        reason = why.get(split.generator, default_why) if isinstance(why, dict) else why
        raise refuse(fmt, split.generator or "this schedule (no generator)", reason)
    call = _generator_call(ev.ast)
    own = GENERATORS[call.name](**dict(call.kwargs))
    if _llm_orders(own.orders) != _llm_orders(ev.schedule.orders):
        from mpipe_core.formats.layer_split import calls_of

        part = next((n for n in calls_of(ev.ast) if n not in ORDER_KEEPING and n not in GENERATORS),
                    "this order")
        raise refuse(fmt, part, f"it changes {split.generator}'s order, and the stack runs {split.generator}'s own")


def microbatch_group(ev: Any, split: Split, fmt: str) -> int:
    """Megatron's --microbatch-group-size-per-virtual-pipeline-stage for an
    interleaved order: its round size, refused where Megatron refuses it."""
    from mpipe_core.algebra.generators.common import check_rounds

    p, m = split.devices, ev.schedule.pipelines[0].microbatches
    if p == 1:
        raise refuse(fmt, "interleaved on one pipeline stage", "Megatron runs virtual stages only with a pipeline "
                                                              "size above 1 (megatron/training/arguments.py)")
    group = check_rounds("interleaved", p, m)
    if group < p:
        raise refuse(fmt, f"interleaved with {m} microbatches on {p} stages",
                     f"Megatron's interleaved schedule takes microbatches in groups of PP to M "
                     f"(--microbatch-group-size-per-virtual-pipeline-stage), and M={m} < PP={p}")
    return group
