"""`mpipe data convert`: a dataset's LLaVA-style annotations as data records
(JSON lines) for a workload's `data` section (docs/data.md).  The rules are
`mpipe_core.data.convert`'s; this module reads the files (image sizes with
Pillow, under --images only)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from mpipe_core.errors import MpipeError


def register(subparsers) -> None:
    p = subparsers.add_parser("data", help="data for per-batch planning (docs/data.md)",
                              description="Data for a workload's `data` section (docs/data.md).")
    sub = p.add_subparsers(dest="data_command", required=True, parser_class=type(p))
    c = sub.add_parser(
        "convert", help="LLaVA-style annotations -> data records (JSON lines)",
        description="Convert LLaVA-style annotations (a JSON list of records with `image` or `images`, and "
                    "`conversations`) to the data records {\"images\": k, \"tiles\": [...], \"text_tokens\": n} "
                    "a workload's data section reads, tiles per image by a tokenization preset.  Image sizes "
                    "come from the record (`image_size`, `image_sizes`) or from the files under --images.")
    c.add_argument("annotations", help="the annotation file (JSON)")
    c.add_argument("--preset", required=True, choices=("internvl", "llava-onevision", "qwen2-vl"),
                   help="the tokenization whose tiles per image to count")
    c.add_argument("--images", default=None, metavar="DIR",
                   help="the folder the records' image paths are relative to (sizes read with Pillow)")
    c.add_argument("-o", "--output", default=None, metavar="PATH", help="write the records here (default stdout)")
    c.set_defaults(handler=cmd_convert)


def image_sizes_under(root: Path):
    """`read_sizes` for the converter: each path's size, read from its file under `root`."""
    base = root.resolve()
    if not base.is_dir():
        raise MpipeError(f"--images {root}: not a folder")

    def read(paths: list[str], where: str) -> list[tuple[int, int]]:
        try:
            from PIL import Image
        except ImportError:
            raise MpipeError("reading image sizes needs Pillow (pip install pillow)") from None
        out = []
        for name in paths:
            file = (base / name).resolve()
            if not file.is_relative_to(base):
                raise MpipeError(f"{where}: image path '{name}' lies outside --images {root}")
            try:
                with Image.open(file) as image:
                    out.append(image.size)
            except (OSError, Image.DecompressionBombError) as error:
                reason = getattr(error, "strerror", None) or str(error).split(" at 0x")[0]
                raise MpipeError(f"{where}: cannot read the image {name} under {root} ({reason})") from None
        return out

    return read


def cmd_convert(args) -> int:
    from mpipe_core.data.convert import MAX_ANNOTATION_FILE, convert_annotations
    from mpipe_core.workloads.inputs import load_document, read_bounded

    raw = read_bounded(args.annotations, MAX_ANNOTATION_FILE, "the annotation file")
    doc = load_document(raw, args.annotations)
    read_sizes = image_sizes_under(Path(args.images)) if args.images is not None else None
    lines = [json.dumps(record) + "\n" for record in convert_annotations(doc, args.annotations, args.preset,
                                                                         read_sizes)]
    if args.output is None:
        sys.stdout.writelines(lines)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as out:
            out.writelines(lines)
    except OSError as error:
        raise MpipeError(f"-o {args.output}: cannot write ({error.strerror or error})") from None
    print(f"{len(lines)} records -> {args.output}", file=sys.stderr)
    return 0
