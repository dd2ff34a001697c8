"""The drawn data the data-run tests use: eight samples of 0-3 images (one a video)
and a packing that makes microbatches differ from step to step (the queued data
run's test takes the first six)."""
import json

import pytest

SAMPLES = [
    {"images": 1, "tiles": [2], "text_tokens": 6},
    {"images": 2, "tiles": [1, 3], "text_tokens": 5},
    {"images": 0, "tiles": [], "text_tokens": 9},
    {"images": 1, "tiles": [4], "text_tokens": 3},
    {"images": 1, "tiles": [1], "text_tokens": 12},
    {"images": 3, "tiles": [1, 1, 2], "text_tokens": 4},
    {"images": 1, "tiles": [3], "text_tokens": 7},
    {"images": 0, "tiles": [], "text_tokens": 5, "frames": 2},
]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SAMPLES))
    doc = {"samples": "samples.jsonl", "packing": {"max_tiles": 6, "max_tokens": 40, "buffer": 2}}
    (folder / "data.json").write_text(json.dumps(doc))
    return str(folder / "data.json")
