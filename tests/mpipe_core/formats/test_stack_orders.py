"""The orders the exporters claim Megatron runs are the ones Mpipe simulates:
Megatron's interleaved 1F1B (as megatron/core/pipeline_parallel/schedules.py
at d98e8a64ddf3 describes it, written again here from that description) with
the microbatch group the exporters write is Mpipe's `interleaved`, op for op."""
from __future__ import annotations

import pytest

from mpipe_core.algebra.generators import interleaved, one_f_one_b
from mpipe_core.algebra.generators.common import check_rounds


def megatron_interleaved(p: int, m: int, v: int, group: int) -> list[list[tuple[str, int, int]]]:
    """Each rank's (kind, chunk, microbatch) order under Megatron's interleaved schedule.

    `get_schedule_table`: microbatches in groups of `group`, each group through
    chunks 0..v-1 (a smaller last group takes the rest); the k-th forward runs
    table[k], the k-th backward table[k] with the chunk mirrored.  Rank r runs
    min(total, 2(p-r-1) + (v-1)*group) warm-up forwards (`get_pp_rank_microbatches`),
    then forward k+warmup followed by backward k, then the remaining backwards.
    Local chunk c of rank r is model chunk c*p + r."""
    table = []
    for start in range(0, m, group):
        members = range(start, m) if start + group >= m else range(start, start + group)
        table += [(mb, chunk) for chunk in range(v) for mb in members]
    orders = []
    for r in range(p):
        total = m * v
        warmup = min(total, 2 * (p - r - 1) + (v - 1) * group)
        fwd = [("F", table[k][1] * p + r, table[k][0]) for k in range(total)]
        bwd = [("BW", (v - 1 - table[k][1]) * p + r, table[k][0]) for k in range(total)]
        order = fwd[:warmup]
        for k in range(total - warmup):
            order += [fwd[k + warmup], bwd[k]]
        order += bwd[total - warmup:]
        orders.append(order)
    return orders


def _ours(schedule) -> list[list[tuple[str, int, int]]]:
    return [[(op.kind, op.chunk, op.mb) for op in order] for order in schedule.orders]


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 16, 2), (4, 6, 3), (8, 32, 4), (3, 9, 2), (4, 4, 4)])
def test_megatron_s_interleaved_order_with_the_written_group_is_mpipe_s(p, m, v):
    group = check_rounds("interleaved", p, m)  # what --microbatch-group-size-per-virtual-pipeline-stage gets
    assert megatron_interleaved(p, m, v, group) == _ours(interleaved(p, m, v))


def test_megatron_s_default_group_differs_where_the_exporters_write_it():
    # p=4, m=6: one round of 6; Megatron's default group (PP = 4) would run another order
    assert megatron_interleaved(4, 6, 2, 4) != _ours(interleaved(4, 6, 2))


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 5)])
def test_megatron_s_1f1b_is_mpipe_s(p, m):
    # without interleaving: p-r-1 warm-up forwards, then pairs, then the cool-down (one chunk per rank)
    orders = []
    for r in range(p):
        warmup = min(m, p - r - 1)
        order = [("F", r, k) for k in range(warmup)]
        for k in range(m - warmup):
            order += [("F", r, k + warmup), ("BW", r, k)]
        orders.append(order + [("BW", r, k) for k in range(m - warmup, m)])
    assert orders == _ours(one_f_one_b(p, m))
