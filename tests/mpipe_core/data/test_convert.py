"""The LLaVA-annotation converter's tile rules and records (scripts/convert_llava.py)."""
import json
import subprocess
import sys
from pathlib import Path

from mpipe_core.data.convert import internvl_tiles, onevision_tiles, qwen2_vl_tiles

ROOT = Path(__file__).resolve().parents[3]


def test_tile_rules_by_hand():
    assert internvl_tiles(448, 448) == 1  # square: 1x1 (ties go to the larger grid only for big images)
    assert internvl_tiles(1792, 1792) == 9  # square and large: 3x3 covers it more than half
    assert internvl_tiles(896, 448) == 2  # 2:1 -> 2x1
    assert internvl_tiles(5000, 400) == 12  # very wide: 12x1
    assert onevision_tiles(384, 384) == 1 and onevision_tiles(768, 768) == 5 and onevision_tiles(4000, 4000) == 10
    assert qwen2_vl_tiles(448, 448) == 256  # 16 x 16 cells
    assert qwen2_vl_tiles(28, 28) == 4  # at least 4 cells
    assert qwen2_vl_tiles(8000, 8000) <= 16384


def test_the_script_converts_records_with_sizes_and_refuses_one_without(tmp_path):
    notes = tmp_path / "a.json"
    notes.write_text(json.dumps([
        {"id": 1, "image": "x.jpg", "image_size": [896, 448],
         "conversations": [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A cat."}]},
        {"id": 2, "conversations": [{"from": "human", "value": "Hello there"}]},
    ]))
    done = subprocess.run([sys.executable, str(ROOT / "scripts/convert_llava.py"), str(notes), "--preset",
                           "internvl"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"images": 1, "tiles": [2], "text_tokens": 7},  # 2:1 -> 2 tiles; 19 + 6 characters / 4 -> 7
        {"images": 0, "tiles": [], "text_tokens": 3},  # 11 characters
    ]
    notes.write_text(json.dumps([{"image": "y.jpg", "conversations": []}]))
    done = subprocess.run([sys.executable, str(ROOT / "scripts/convert_llava.py"), str(notes), "--preset",
                           "qwen2-vl"], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (2, f"error: {notes}[0]: no image_size in the record: give --images "
                                                 f"DIR to read the files\n")
