"""LLaVA-style annotation JSON -> data records (JSON lines) for a workload's `data` section.

python scripts/convert_llava.py ANNOTATIONS.json --preset internvl|llava-onevision|qwen2-vl [--images DIR]

Image sizes come from each record (`image_size` / `image_sizes`) or from the files
under --images (Pillow).  Rules and limits: docs/data.md, mpipe_core/data/convert.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mpipe_core.data.convert import TILERS, convert, image_paths, record_sizes  # noqa: E402
from mpipe_core.data.samples import parse_record  # noqa: E402
from mpipe_core.errors import MpipeError  # noqa: E402


def sizes_from_files(paths: list[str], root: Path | None, where: str) -> list[tuple[int, int]]:
    if root is None:
        raise MpipeError(f"{where}: no image_size in the record: give --images DIR to read the files")
    try:
        from PIL import Image
    except ImportError:
        raise MpipeError("reading image sizes needs Pillow (pip install pillow)") from None
    out = []
    for name in paths:
        try:
            with Image.open(root / name) as image:
                out.append(image.size)
        except OSError as error:
            raise MpipeError(f"{where}: cannot read {root / name} ({error})") from None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("annotations", type=Path)
    parser.add_argument("--preset", required=True, choices=TILERS)
    parser.add_argument("--images", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        try:
            records = json.loads(args.annotations.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise MpipeError(f"{args.annotations}: cannot read annotations ({error})") from None
        if not isinstance(records, list):
            raise MpipeError(f"{args.annotations}: expected a JSON list of records")
        for i, record in enumerate(records):
            where = f"{args.annotations}[{i}]"
            sizes = record_sizes(record) if isinstance(record, dict) else None
            if sizes is None:
                sizes = sizes_from_files(image_paths(record), args.images, where) if image_paths(record) else []
            out = convert(record, where, args.preset, sizes)
            parse_record(out, where)  # within the record limits
            print(json.dumps(out))
    except MpipeError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
