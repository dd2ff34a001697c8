"""Re-composing a step's microbatches (data/regroup.py): the rule worked by hand,
its refusals, and on drawn data the same samples within the packing limits."""
from hypothesis import given, settings, strategies as st

from mpipe_core.data.packing import Pack, Packing, Tokens, pack, single
from mpipe_core.data.regroup import regroup
from mpipe_core.data.samples import Sample

TOKENS = Tokens(per_tile=10, per_frame=5)
RULE = Packing(max_tiles=6, max_tokens=100, buffer=2)


def s(name, tiles=(), text=0, frames=0):
    return Sample(tuple(tiles), text, frames, name)


def packed(*pieces):
    p = single(pieces[0], TOKENS)
    for piece in pieces[1:]:
        p = p.join(piece, TOKENS)
    return p


def test_the_rule_worked_by_hand():
    # Drawn: all the tiles in one microbatch (6 tiles, 70 tokens), none in the other (0, 90).
    drawn = (packed(s("a1", [3], 10), s("a2", [3])), packed(s("b1", [], 60), s("b2", [], 30)))
    # Means: 3 tiles, 80 tokens.  Larger shares: a1 1.0, a2 1.0, b1 0.75, b2 0.375.
    # a1 -> 0 (a tie: the first); a2 -> 1 (6/3 in 0 against 1.0); b1 -> 1 (1.125 against 1.25);
    # b2 -> 0 (it passes 100 tokens in 1).  Each keeps its pieces in draw order.
    again = regroup(drawn, TOKENS, RULE)
    assert [[p.origin for p in pk.pieces] for pk in again] == [["a1", "b2"], ["a2", "b1"]]
    assert [(pk.tiles, pk.tokens) for pk in again] == [(3, 70), (3, 90)]


def test_with_shares_a_device_s_tiles_count_against_its_microbatches_mean():
    drawn = (packed(s("a", [4])), packed(s("b", [4])), packed(s("c", [], 40)), packed(s("d", [], 40), s("e", [], 8)))
    # Means: 2 tiles, 42 tokens.  Each microbatch alone: a -> 0, b -> 1 (4.0 in 0 against 2.0), c -> 2,
    # d -> 3, e -> 2 (2.0 in 0 and 1, 1.14 in 2 and 3, equally light: the first): slots 0 and 1 hold all
    # 8 tiles.
    alone = regroup(drawn, TOKENS, RULE)
    assert [[p.origin for p in pk.pieces] for pk in alone] == [["a"], ["b"], ["c", "e"], ["d"]]
    # Shares (0, 1) and (2, 3), 4 tiles a share on average: a -> 0; b -> 2 (its share at 1.0, not 2.0);
    # c -> 1 (1.0, as 3: the first); d -> 3; e -> 1 (1.14 everywhere; 1 and 3 the lighter).  Each device
    # encodes 4 tiles.
    again = regroup(drawn, TOKENS, RULE, shares=((0, 1), (2, 3)))
    assert [[p.origin for p in pk.pieces] for pk in again] == [["a"], ["c", "e"], ["b"], ["d"]]


def test_no_regrouping_where_a_piece_fits_nowhere_or_nothing_can_move():
    # 50, 50 then 34, 33 fill both to 84 and 83: the last 33 fits neither (100 tokens).
    drawn = (packed(s("x", [], 34), s("y", [], 33), s("z", [], 33)), packed(s("u", [], 50), s("v", [], 50)))
    assert regroup(drawn, TOKENS, RULE) is None
    assert regroup((packed(s("one", [2], 5)),), TOKENS, RULE) is None  # one microbatch
    assert regroup((packed(s("p", [2])), packed(s("q", [], 9))), TOKENS, RULE) is None  # a piece each


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.tuples(st.lists(st.integers(1, 4), max_size=2), st.integers(0, 60), st.integers(0, 2)),
                      min_size=8, max_size=60),
       M=st.integers(2, 6))
def test_the_same_samples_within_the_limits(sizes, M):
    samples = [s(f"s{i}", tiles, text, frames) for i, (tiles, text, frames) in enumerate(sizes)]
    packs = list(pack(samples, TOKENS, RULE))[:M]
    again = regroup(tuple(packs), TOKENS, RULE)
    if again is None:
        return
    assert len(again) == len(packs) and all(pk.pieces for pk in again)
    assert sorted(p.origin for pk in again for p in pk.pieces) == sorted(p.origin for pk in packs for p in pk.pieces)
    assert all(pk.tiles <= RULE.max_tiles and pk.tokens <= RULE.max_tokens for pk in again)
    assert all(isinstance(pk, Pack) for pk in again)
    assert sum(pk.tokens for pk in again) == sum(pk.tokens for pk in packs)
