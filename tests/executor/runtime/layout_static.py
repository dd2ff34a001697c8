"""Measured static memory per rank against the simulator's figure for a run's layout
(`executor.analysis.layout_memory`) and against the unsharded one: what the layout
memory tests (ZeRO-1, encoder_shard, tp) assert on."""
from executor.analysis.layout_memory import layout_metrics
from executor.analysis.memory_check import compare_memory
from mpipe_core.api import evaluate
from mpipe_core.runs.layout import RunLayout
from mpipe_core.workloads.workload import load_workload


def static_ratios(doc: dict, term: str, layout: dict, memory) -> tuple[list[float], list[float]]:
    """(predicted / measured static bytes per device for the layout, the same unsharded) of a
    profiled workload `doc` and a run's measured `memory`."""
    ev = evaluate(term, load_workload(doc))
    sharded = compare_memory(layout_metrics(ev, RunLayout.from_dict(layout)), ev.workload.memory_unit,
                             memory, ev.workload.name)
    whole = compare_memory(ev.metrics, ev.workload.memory_unit, memory, ev.workload.name)
    return [sharded.static_ratio(d) for d in sharded.devices], [whole.static_ratio(d) for d in whole.devices]
