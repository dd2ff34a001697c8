"""The LLaVA-annotation converter's tile rules and records (`mpipe data convert`;
its bad input is in tests/mpipe_cli/malformed_corpus.py)."""
import json

import pytest

from mpipe_cli.main import main
from mpipe_core.data.convert import convert_annotations, internvl_tiles, onevision_tiles, qwen2_vl_tiles
from mpipe_core.data.samples import parse_records
from mpipe_core.errors import WorkloadError


def test_tile_rules_by_hand():
    assert internvl_tiles(448, 448) == 1  # square: 1x1 (ties go to the larger grid only for big images)
    assert internvl_tiles(1792, 1792) == 9  # square and large: 3x3 covers it more than half
    assert internvl_tiles(896, 448) == 2  # 2:1 -> 2x1
    assert internvl_tiles(5000, 400) == 12  # very wide: 12x1
    assert onevision_tiles(384, 384) == 1 and onevision_tiles(768, 768) == 5 and onevision_tiles(4000, 4000) == 10
    assert qwen2_vl_tiles(448, 448) == 256  # 16 x 16 cells
    assert qwen2_vl_tiles(28, 28) == 4  # at least 4 cells
    assert qwen2_vl_tiles(8000, 8000) <= 16384


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_converts_records_with_sizes_and_refuses_one_without(tmp_path, capsys):
    notes = tmp_path / "a.json"
    notes.write_text(json.dumps([
        {"id": 1, "image": "x.jpg", "image_size": [896, 448],
         "conversations": [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A cat."}]},
        {"id": 2, "conversations": [{"from": "human", "value": "Hello there"}]},
    ]))
    code, out, err = _cli(capsys, "data", "convert", str(notes), "--preset", "internvl")
    assert (code, err) == (0, "")
    assert [json.loads(line) for line in out.splitlines()] == [
        {"images": 1, "tiles": [2], "text_tokens": 7},  # 2:1 -> 2 tiles; 19 + 6 characters / 4 -> 7
        {"images": 0, "tiles": [], "text_tokens": 3},  # 11 characters
    ]
    assert len(parse_records(out, "converted")) == 2  # what a data section reads
    notes.write_text(json.dumps([{"image": "y.jpg", "conversations": []}]))
    code, out, err = _cli(capsys, "data", "convert", str(notes), "--preset", "qwen2-vl")
    assert (code, out, err) == (2, "", f"error: {notes}[0]: no image_size in the record: give --images DIR to "
                                      f"read the files\n")


def test_sizes_are_read_from_the_files_under_images(tmp_path, capsys):
    from PIL import Image

    (tmp_path / "img" / "sub").mkdir(parents=True)
    Image.new("RGB", (1792, 1792)).save(tmp_path / "img" / "sub" / "a.png")
    Image.new("RGB", (300, 200)).save(tmp_path / "img" / "b.png")
    notes = tmp_path / "a.json"
    notes.write_text(json.dumps([{"images": ["sub/a.png", "b.png"], "conversations": [{"value": "abcdefgh"}]},
                                 {"image": "b.png", "image_size": [896, 448], "video": "v.mp4", "frames": 8,
                                  "text_tokens": 40}]))
    out_file = tmp_path / "d.jsonl"
    code, out, err = _cli(capsys, "data", "convert", str(notes), "--preset", "internvl", "--images",
                          str(tmp_path / "img"), "-o", str(out_file))
    assert (code, out, err) == (0, "", f"2 records -> {out_file}\n")
    assert [json.loads(x) for x in out_file.read_text().splitlines()] == [
        {"images": 2, "tiles": [9, 6], "text_tokens": 2},  # 1792 px square: 3x3; 3:2 -> 3x2
        {"images": 1, "tiles": [2], "text_tokens": 40, "frames": 8},  # the record's size wins over the file
    ]


def test_the_pure_converter_asks_for_sizes_it_is_not_given():
    asked = []

    def sizes(paths, where):
        asked.append((paths, where))
        return [(384, 384)] * len(paths)

    doc = [{"images": ["p.jpg", "q.jpg"], "text_tokens": 5}, {"image": "r.jpg", "image_size": [768, 768]}]
    assert list(convert_annotations(doc, "notes", "llava-onevision", sizes)) == [
        {"images": 2, "tiles": [1, 1], "text_tokens": 5}, {"images": 1, "tiles": [5], "text_tokens": 0}]
    assert asked == [(["p.jpg", "q.jpg"], "notes[0]")]
    with pytest.raises(WorkloadError) as caught:
        list(convert_annotations(doc, "notes", "siglip"))
    assert caught.value.message == ("unknown tokenization preset 'siglip' (known: internvl, llava-onevision, "
                                    "qwen2-vl)")
