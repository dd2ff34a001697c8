"""A job's Ascend profiler output found on disk: one `*_ascend_pt` (torch_npu)
or `*_ascend_ms` (MindSpore) folder per process, side by side.

    <host>_<pid>_<timestamp>_ascend_pt/
        profiler_info_<rank>.json            the rank (its `rank_id`, else the name's number)
        ASCEND_PROFILER_OUTPUT/
            trace_view.json                   the timeline (`ascend_trace`)
            step_trace_time.csv               per step: computing, communication, free, bubble (`step_summary`)

The folder's name says nothing about the rank: the ranks of a job's folders
sort in any order.  Reading is bounded as for Kineto files (`trace_files`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from mpipe_core.errors import MpipeError

PROFILER_FOLDER = re.compile(r".+_ascend_(pt|ms)\Z")
INFO_NAME = re.compile(r"profiler_info_(\d+)\.json\Z")
OUTPUT = "ASCEND_PROFILER_OUTPUT"
TRACE_VIEW = "trace_view.json"
STEP_TRACE = "step_trace_time.csv"
MAX_INFO_BYTES = 1 << 20


def is_profiler_folder(path: Path) -> bool:
    return path.is_dir() and bool(PROFILER_FOLDER.match(path.name))


def find_profiler_folders(path: Path) -> list[Path]:
    """`path` itself when it is one, else the profiler folders below it (name order)."""
    if is_profiler_folder(path):
        return [path]
    return sorted(p for p in path.rglob("*") if is_profiler_folder(p))


def rank_of(folder: Path) -> int:
    """The rank a profiler folder recorded: `profiler_info_<rank>.json`'s `rank_id`, else its name."""
    infos = sorted(p for p in folder.iterdir() if p.is_file() and INFO_NAME.match(p.name))
    if not infos:
        raise MpipeError(f"{folder}: no profiler_info_<rank>.json in this profiler folder; cannot tell its rank")
    if len(infos) > 1:
        raise MpipeError(f"{folder}: {len(infos)} profiler_info_<rank>.json files "
                         f"({', '.join(p.name for p in infos[:3])}); one folder is one rank")
    info = infos[0]
    named = int(INFO_NAME.match(info.name)[1])  # type: ignore[index]
    if info.stat().st_size > MAX_INFO_BYTES:
        raise MpipeError(f"{info}: larger than {MAX_INFO_BYTES >> 20} MB; not a profiler_info file")
    try:
        doc = json.loads(info.read_bytes())
    except (ValueError, OSError) as error:
        raise MpipeError(f"{info}: not valid JSON ({error})") from None
    rank = doc.get("rank_id") if isinstance(doc, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        if rank != named:
            raise MpipeError(f"{info}: rank_id {rank} but the file is named for rank {named}")
        return rank
    return named


def trace_view_of(folder: Path) -> Path:
    path = folder / OUTPUT / TRACE_VIEW
    if not path.is_file():
        raise MpipeError(f"{folder}: no {OUTPUT}/{TRACE_VIEW} (was the profiler's export run?)")
    return path


def step_trace_of(folder: Path) -> Path | None:
    path = folder / OUTPUT / STEP_TRACE
    return path if path.is_file() else None
