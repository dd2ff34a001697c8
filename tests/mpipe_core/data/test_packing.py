"""The packing rule (InternVL's PackedDataset, data/packing.py) on hand-written
samples, and the data section's bad input."""
import pytest

from mpipe_core.data.packing import Packing, Tokens, pack
from mpipe_core.data.samples import Sample, parse_records
from mpipe_core.data.spec import parse_data
from mpipe_core.errors import WorkloadError

TOKENS = Tokens(per_tile=10, per_frame=5)
RULE = Packing(max_tiles=6, max_tokens=100, buffer=2)


def s(name, tiles=(), text=0, frames=0):
    return Sample(tuple(tiles), text, frames, name)


def test_first_fit_emission_cuts_and_the_buffer_limit_as_worked_by_hand():
    samples = [s("s1", [2], 20),  # 2 tiles, 40 tokens
               s("s2", [3], 30),  # 3 tiles, 60 tokens: joins s1 -> exactly 100 tokens -> emitted
               s("s3", [1], 10),  # opens a pack
               s("s4", [4], 5),  # joins s3: 5 tiles, 65 tokens
               s("s5", [], 50),  # 115 tokens with s3+s4: a pack of its own (0 tiles, after it)
               s("s6", [6], 0),  # fits no open pack; 6 tiles -> emitted at once
               s("s7", [3, 3, 3], 30)]  # 9 tiles: cut at image boundaries into 3+3 and 3 (+ the text)
    packs = list(pack(samples, TOKENS, RULE))
    held = [[p.origin for p in pk.pieces] for pk in packs]
    assert held == [["s1", "s2"], ["s6"], ["s7 (part 1)"],
                    ["s3", "s4"],  # three open packs > buffer 2: the one with most tiles goes
                    ["s7 (part 2)"], ["s5"]]  # the end of the stream: what is open, most tiles first
    assert [(pk.tiles, pk.tokens) for pk in packs] == [(5, 100), (6, 60), (6, 60), (5, 65), (3, 60), (0, 50)]
    assert packs[2].pieces[0].tiles == (3, 3) and packs[2].pieces[0].text_tokens == 0
    assert packs[4].pieces[0].tiles == (3,) and packs[4].pieces[0].text_tokens == 30


def test_a_text_past_the_token_limit_is_cut_at_it_and_frames_count_as_tiles():
    packs = list(pack([s("long", [], 150)], TOKENS, RULE))
    assert [(pk.tiles, pk.tokens) for pk in packs] == [(0, 100)]
    # 4 frames of 5 tokens and an image of 2 tiles: 6 tiles, 40 tokens -> full on tiles
    packs = list(pack([s("video", [], 0, frames=4), s("img", [2], 0)], TOKENS, RULE))
    assert [(pk.tiles, pk.tokens, pk.frames) for pk in packs] == [(6, 40, 4)]


def test_a_new_pack_goes_after_open_packs_with_as_many_tiles():
    rule = Packing(max_tiles=4, max_tokens=40, buffer=10)
    # a (3 tiles) and b (3 tiles) cannot share; c (1 tile) joins the first that fits: a
    packs = list(pack([s("a", [3]), s("b", [3]), s("c", [1])], Tokens(10, 10), rule))
    assert [[p.origin for p in pk.pieces] for pk in packs] == [["a", "c"], ["b"]]


def _record_error(tmp_path, line: str) -> str:
    path = tmp_path / "d.jsonl"
    path.write_text('{"images": 1, "tiles": [2], "text_tokens": 5}\n' + line + "\n")
    with pytest.raises(WorkloadError) as caught:
        parse_data({"samples": str(path), "packing": {"max_tiles": 48, "max_tokens": 16384}})
    return caught.value.message.replace(str(path), "FILE")


def test_records_with_negative_or_missing_counts_or_past_their_limits_are_refused(tmp_path):
    assert _record_error(tmp_path, '{"images": -1, "tiles": [], "text_tokens": 3}') == \
        "FILE:2: images: expected a whole number from 0 to 1024, got -1"
    assert _record_error(tmp_path, '{"images": 1, "tiles": [2]}') == \
        'FILE:2: missing \'text_tokens\' (a record is {"images": k, "tiles": [t1, ...], "text_tokens": n})'
    assert _record_error(tmp_path, '{"images": 1, "tiles": [20000], "text_tokens": 3}') == \
        "FILE:2: tiles[0]: expected a whole number from 1 to 16384, got 20000"
    assert _record_error(tmp_path, '{"images": 2, "tiles": [1], "text_tokens": 3}') == \
        "FILE:2: tiles: has 1 entries but images says 2"
    assert _record_error(tmp_path, '{"images": 0, "tiles": [], "text_tokens": 3, "frames": -2}') == \
        "FILE:2: frames: expected a whole number from 0 to 4096, got -2"


def test_packing_limits_smaller_than_one_image_are_refused(tmp_path):
    with pytest.raises(WorkloadError) as caught:
        parse_data({"preset": "internvl", "packing": {"max_tiles": 8, "max_tokens": 16384}})
    assert caught.value.message == \
        "data.packing.max_tiles: 8 is smaller than one image (12 tiles, the largest image the mix draws)"
    with pytest.raises(WorkloadError) as caught:
        parse_data({"preset": "internvl", "packing": {"max_tiles": 48, "max_tokens": 2048}})
    assert caught.value.message == ("data.packing.max_tokens: 2048 is smaller than one image (12 tiles, 3072 "
                                    "tokens, the largest image the mix draws)")
    path = tmp_path / "d.jsonl"
    path.write_text('{"images": 2, "tiles": [1, 5], "text_tokens": 5}\n')
    with pytest.raises(WorkloadError) as caught:
        parse_data({"samples": str(path), "packing": {"max_tiles": 4, "max_tokens": 16384}})
    assert caught.value.message == f"data.packing.max_tiles: 4 is smaller than one image (5 tiles, at {path}:1)"


def test_records_parse_with_their_origin():
    samples = parse_records('{"images": 2, "tiles": [3, 1], "text_tokens": 7, "frames": 0}\n\n'
                            '{"images": 0, "tiles": [], "text_tokens": 9, "frames": 4}\n', "x.jsonl")
    assert samples == (Sample((3, 1), 7, 0, "x.jsonl:1"), Sample((), 9, 4, "x.jsonl:3"))
