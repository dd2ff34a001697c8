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
