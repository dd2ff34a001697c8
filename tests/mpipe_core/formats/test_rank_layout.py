"""Global ranks of a tp x cp x dp x pp world against ranks computed by hand, and
Megatron's documented example of its groups; bad layouts and orders refused in
one exact line."""
from __future__ import annotations

import pytest

from mpipe_core.errors import MpipeError
from mpipe_core.formats.rank_layout import layout_from_parallel, one_pipeline, parse_layout, parse_order


def test_the_default_order_puts_tp_fastest():
    layout = parse_layout("tp=8,dp=4,pp=8")
    # 3 + 8 * (0 + 1 * (2 + 4 * 5)) = 179
    assert layout.rank_of({"tp": 3, "dp": 2, "pp": 5}) == 179
    assert layout.coords(179) == {"tp": 3, "cp": 0, "dp": 2, "pp": 5}
    assert layout.world == 256
    # with cp: 1 + 2 * (1 + 2 * (0 + 2 * 1)) = 11
    with_cp = parse_layout("tp=2,cp=2,dp=2,pp=2")
    assert with_cp.rank_of({"tp": 1, "cp": 1, "dp": 0, "pp": 1}) == 11
    assert with_cp.coords(11) == {"tp": 1, "cp": 1, "dp": 0, "pp": 1}


def test_every_rank_maps_back_to_itself():
    for text, order in (("tp=2,cp=3,dp=2,pp=4", None), ("tp=4,dp=3,pp=2", "pp-dp-tp"), ("dp=2,pp=3", "dp-pp")):
        layout = parse_layout(text, order)
        assert [layout.rank_of(layout.coords(r)) for r in range(layout.world)] == list(range(layout.world))


def test_megatrons_documented_groups():
    # Megatron-LM's initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4 (so dp=2) give the
    # pipeline groups [g0, g4, g8, g12], [g1, g5, g9, g13], [g2, g6, g10, g14], [g3, g7, g11, g15].
    layout = parse_layout("tp=2,pp=4")  # dp left out: the rest, as Megatron derives it
    assert one_pipeline([(0, "f")], layout, 16).layout.dp == 2
    want = {0: [0, 4, 8, 12], 1: [1, 5, 9, 13], 6: [2, 6, 10, 14], 15: [3, 7, 11, 15]}
    for lowest, ranks in want.items():
        assert one_pipeline([(lowest, "f")], layout, 16).ranks == ranks


def test_the_pipeline_kept_is_the_lowest_ranks():
    layout = parse_layout("tp=2,dp=2,pp=2")
    files = [(5, "rank5"), (1, "rank1"), (4, "rank4"), (0, "rank0")]
    got = one_pipeline(files, layout, 8)
    assert (got.slice, got.ranks, got.ignored, got.ignored_files) == ("tp0/dp0", [0, 4], [1, 5], 2)
    assert got.note() == ("kept pipeline tp0/dp0 (tp=2, dp=2, pp=2, order tp-cp-dp-pp): ranks 0, 4 as stages "
                          "0..1; 2 file(s) of other pipelines ignored (ranks 1, 5)")
    # slice tp1/dp1: 1 + 2 * 1 = 3, and 3 + 4 = 7
    assert one_pipeline([(7, "a"), (3, "b")], layout, 8).ranks == [3, 7]
    # another order: tp-pp-dp, rank = tp + 2 * (pp + 2 * dp); rank 5 is tp1, pp0, dp1
    other = parse_layout("tp=2,dp=2,pp=2", "tp-pp-dp")
    assert one_pipeline([(5, "a")], other, 8).ranks == [5, 7]
    assert one_pipeline([(5, "a")], other, 8).slice == "tp1/dp1"


def test_pp_left_out_is_the_rest_of_the_world():
    got = one_pipeline([(3, "f")], parse_layout("tp=4,dp=2"), 64)
    assert got.layout.pp == 8
    assert got.ranks == [3 + 8 * s for s in range(8)]


def test_megatrons_order_with_ep_is_the_default():
    assert parse_order("tp-cp-ep-dp-pp") == ("tp", "cp", "dp", "pp")
    assert parse_layout("tp=2,dp=2,pp=2", "tp-cp-ep-dp-pp").order == parse_layout("tp=2,dp=2,pp=2").order


def test_the_workloads_parallel_section():
    layout = layout_from_parallel({"tp": 2, "sp": True, "dp": 4})
    assert (layout.tp, layout.dp, layout.pp, layout.source) == (2, 4, None, "the workload's parallel section "
                                                                           "(tp=2, dp=4)")
    assert layout_from_parallel({"tp": 1, "dp": 1}) is None  # one pipeline: nothing to map
    assert layout_from_parallel(None) is None


@pytest.mark.parametrize("text, order, message", [
    ("tp8", None, "--layout tp8: expected NAME=N pairs joined by commas, such as tp=8,dp=4,pp=8, not 'tp8'"),
    ("tp=8,ep=2", None, "--layout tp=8,ep=2: unknown dimension 'ep' (tp, cp, dp, pp)"),
    ("tp=8", None, "--layout tp=8: give pp or dp (the one left out is the rest of the world size)"),
    ("tp=2,tp=4", None, "--layout tp=2,tp=4: tp given twice"),
    ("tp=0,pp=2", None, "--layout tp=0,pp=2: tp=0 is not a whole number from 1 to 1048576"),
    ("tp=2,dp=x", None, "--layout tp=2,dp=x: dp=x is not a whole number from 1 to 1048576"),
    ("tp=2,dp=2,pp=2", "tp-xp-pp", "--order tp-xp-pp: unknown dimension 'xp' (name tp, cp, ep, dp, pp joined by "
                                   "'-', fastest-varying first, e.g. tp-cp-dp-pp)"),
    ("tp=2,dp=2,pp=2", "tp-dp-tp-pp", "--order tp-dp-tp-pp: tp named twice"),
    ("tp=2,dp=2,pp=2", "tp-pp", "--order tp-pp leaves out dp (dp=2); name every dimension wider than 1"),
])
def test_bad_layouts_and_orders(text, order, message):
    with pytest.raises(MpipeError) as got:
        parse_layout(text, order)
    assert got.value.message == message


def test_a_layout_that_does_not_fit_the_world():
    with pytest.raises(MpipeError) as got:
        one_pipeline([(0, "rank0_trace.json")], parse_layout("tp=2,dp=2,pp=2"), 64, "rank0_trace.json")
    assert got.value.message == ("--layout tp=2,dp=2,pp=2 makes 8 ranks, but the traces' world size is 64 "
                                 "(rank0_trace.json)")
    with pytest.raises(MpipeError) as got:
        one_pipeline([(0, "rank0_trace.json")], parse_layout("tp=3,dp=2"), 64, "rank0_trace.json")
    assert got.value.message == ("--layout tp=3,dp=2: tp*cp*dp = 6 does not divide the traces' world size 64 "
                                 "(rank0_trace.json)")
    with pytest.raises(MpipeError) as got:
        one_pipeline([(0, "rank0_trace.json")], parse_layout("tp=2,dp=2"), None)
    assert got.value.message == ("--layout tp=2,dp=2 gives no pp and the traces name no world size "
                                 "(distributedInfo.world_size): give pp too")
    with pytest.raises(MpipeError) as got:
        one_pipeline([(0, "rank0_trace.json")], parse_layout("tp=3,pp=2"), 64, "rank0_trace.json")
    assert got.value.message == ("--layout tp=3,pp=2: tp*cp*pp = 6 does not divide the traces' world size 64 "
                                 "(rank0_trace.json)")
    with pytest.raises(MpipeError) as got:
        one_pipeline([(0, "rank0_trace.json"), (9, "rank9_trace.json")], parse_layout("tp=2,dp=2,pp=2"), None)
    assert got.value.message == "rank9_trace.json: rank 9 is outside the world of --layout tp=2,dp=2,pp=2 (8 ranks)"
