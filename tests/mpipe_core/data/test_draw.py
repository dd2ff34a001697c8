"""Batches drawn from the packed stream: reproducible by seed, dealt to replicas."""
from mpipe_core.data.draw import deal, draw_batches
from mpipe_core.data.packing import Pack
from mpipe_core.data.spec import parse_data


def _shape(batches):
    return [[(p.tiles, p.tokens) for p in b.packs] for b in batches]


def test_the_same_seed_draws_the_same_batches_and_another_seed_others():
    a = draw_batches(parse_data({"preset": "heavy-tailed", "seed": 7}), 8, 3)
    b = draw_batches(parse_data({"preset": "heavy-tailed", "seed": 7}), 8, 3)
    c = draw_batches(parse_data({"preset": "heavy-tailed", "seed": 8}), 8, 3)
    assert _shape(a) == _shape(b)
    assert _shape(a) != _shape(c)
    assert [len(x.packs) for x in a] == [8, 8, 8]
    # batch i is packs 8i..8i+7 of one stream: drawing 1 batch gives the first of 3
    assert _shape(draw_batches(parse_data({"preset": "heavy-tailed", "seed": 7}), 8, 1)) == _shape(a)[:1]


def test_replicas_draw_consecutive_shares_or_balanced_ones():
    packs = tuple(Pack((), tiles, 0) for tiles in (9, 1, 8, 2, 7, 3))
    assert deal(packs, 2, 3, "none", lambda p: p.tiles) == ((0, 1, 2), (3, 4, 5))  # loads 18 and 12
    # heaviest first to the lighter replica with room: 9->r0, 8->r1, 7->r1, 3->r0, 2->r0, 1->r1
    assert deal(packs, 2, 3, "tiles+tokens", lambda p: p.tiles) == ((0, 3, 5), (1, 2, 4))  # 14 and 16


def test_every_drawn_piece_carries_its_place_in_the_stream_and_regroup_keeps_it():
    """A piece's key (what seeds its tensors in a run) is unique over the steps, a cut
    sample's parts share its number, and re-composing a step moves keys with their pieces."""
    from mpipe_core.data.regroup import regroup

    spec = parse_data({"preset": "heavy-tailed", "seed": 7})
    batches = draw_batches(spec, 8, 3)
    keys = [p.key for b in batches for pack in b.packs for p in pack.pieces]
    assert all(keys) and len(set(keys)) == len(keys)
    assert {k.split("/")[0] for k in keys if "/" in k}, "the preset cuts some samples"
    moved = 0
    for b in batches:
        again = regroup(b.packs, spec.tokens, spec.packing)
        if again is None:  # (a piece that fits nowhere else: the drawn packs stay)
            continue
        before = {p.key: p for pack in b.packs for p in pack.pieces}
        after = {p.key: p for pack in again for p in pack.pieces}
        assert after == before  # the same pieces, each with its own key
        where = {p.key: i for i, pack in enumerate(b.packs) for p in pack.pieces}
        moved += sum(where[p.key] != i for i, pack in enumerate(again) for p in pack.pieces)
    assert moved
