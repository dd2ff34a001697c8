"""Trace files as `mpipe import-trace` and the app receive them: paths (files or
folders) or uploaded (name, bytes) pairs, plain JSON or gzip, within bounds.

* A folder is searched (recursively, in name order) for `*.json` and
  `*.json.gz`; torchtitan's layout `{dump_folder}/profile_traces/iteration_N/
  rank{R}_trace.json` is read as one profiling window per `iteration_N`
  folder (its steps follow each other in N order).
* Each file may hold at most `trace_limit()` bytes once decompressed (256 MiB
  unless `$MPIPE_TRACE_LIMIT_MB` says otherwise); a regular file larger than
  that on disk is refused before it is read.  A gzip file that inflates more
  than `MAX_RATIO` times its own size past the first 16 MiB is refused as a
  gzip bomb, without inflating the rest.
* The digest (sha256) covers every file's profiling window, base name (any
  folder and `.gz` dropped) and decompressed bytes, sorted by window then
  name: the same traces give the same digest however they were packed,
  wherever they lay and in whatever order they came.
"""
from __future__ import annotations

import hashlib
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.inputs import MIB

DEFAULT_LIMIT_MB = 256
MAX_RATIO = 200  # real traces compress 5-20x; a bomb of zeros ~1000x
RATIO_GRACE = 16 * MIB
MAX_FILES = 4096
CHUNK = 1 * MIB
ITERATION = re.compile(r"iteration_(\d+)\Z")
Progress = Callable[[str], None]


def megabytes_limit(variable: str, default_mb: float) -> int:
    """A size bound in bytes from the environment variable `variable` (in MB), else
    `default_mb`; one error line naming the variable when it is not a number in range."""
    text = os.environ.get(variable, "")
    try:
        mb = float(text) if text else default_mb
    except ValueError:
        raise MpipeError(f"${variable}: '{text[:20]}' is not a number") from None
    if not 0 < mb <= 1024 * 1024:
        raise MpipeError(f"${variable} must be in (0, 1048576], not {text[:20]}")
    return int(mb * MIB)


def trace_limit() -> int:
    """Bytes one trace file may hold (decompressed): $MPIPE_TRACE_LIMIT_MB or 256 MiB."""
    return megabytes_limit("MPIPE_TRACE_LIMIT_MB", DEFAULT_LIMIT_MB)


@dataclass
class TraceFile:
    name: str  # as shown in messages: the path given, or the upload's name
    data: bytes  # decompressed
    group: str = ""  # its profiling window (`iteration_N`), "" when none
    order: int = 0  # the window's N (sort key)
    rank: int | None = None  # an Ascend profiler folder's rank (its profiler_info_<rank>.json)
    kind: str = "chrome"  # "chrome" (Kineto, Megatron's JSON) or "ascend" (a trace_view.json)
    step_csv: tuple[str, bytes] | None = None  # the step_trace_time.csv beside an Ascend trace


def _limit_text(limit: int) -> str:
    return f"{round(limit / MIB, 3):g} MB"


def _inflate(raw: bytes, name: str, limit: int) -> bytes:
    """Decompress gzip in chunks; refuse past `limit` or a bomb's ratio."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out: list[bytes] = []
    size = 0
    view = memoryview(raw)
    try:
        for i in range(0, len(raw), CHUNK):
            piece = view[i:i + CHUNK]
            size_in = len(piece)
            while piece:
                got = d.decompress(piece, CHUNK)
                piece = d.unconsumed_tail
                size += len(got)
                out.append(got)
                read = i + size_in - len(piece)  # compressed bytes consumed so far
                if size > limit:
                    raise MpipeError(f"{name}: decompresses to more than the limit of {_limit_text(limit)} "
                                     f"(set $MPIPE_TRACE_LIMIT_MB for larger traces)")
                if size > RATIO_GRACE and size > MAX_RATIO * max(1, read):
                    raise MpipeError(f"{name}: inflates more than {MAX_RATIO} times its compressed size "
                                     f"(a gzip bomb?); refused")
        out.append(d.flush())
    except zlib.error as error:
        raise MpipeError(f"{name}: not a valid gzip file ({error})") from None
    if not d.eof:
        raise MpipeError(f"{name}: the gzip stream is truncated")
    return b"".join(out)


def decode(name: str, raw: bytes, limit: int | None = None) -> bytes:
    """The file's bytes, decompressed if it is gzip (by its magic number)."""
    limit = trace_limit() if limit is None else limit
    if raw[:2] == b"\x1f\x8b":
        return _inflate(raw, name, limit)
    if len(raw) > limit:
        raise MpipeError(f"{name}: larger than the limit of {_limit_text(limit)} "
                         f"(set $MPIPE_TRACE_LIMIT_MB for larger traces)")
    return raw


def _is_trace_name(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".json") or name.endswith(".json.gz")


def _window(path: Path, root: Path) -> tuple[str, int]:
    for part in reversed(path.relative_to(root).parts[:-1]):
        m = ITERATION.match(part)
        if m:
            return part, int(m[1])
    return "", 0


def collect_paths(paths: Sequence[str | Path]) -> list[tuple[Path, str, int]]:
    """(file, window, window order) of every trace file the arguments name."""
    out: list[tuple[Path, str, int]] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_trace_name(p))
            if not found:
                raise MpipeError(f"{path}: no .json or .json.gz files in this folder")
            out.extend((p, *_window(p, path.parent if path.parent != path else path)) for p in found)
        elif path.exists():
            m = ITERATION.match(path.parent.name)
            out.append((path, path.parent.name, int(m[1])) if m else (path, "", 0))
        else:
            raise MpipeError(f"{path}: no such file or folder")
        if len(out) > MAX_FILES:
            raise MpipeError(f"more than {MAX_FILES} trace files")
    return out


def _read_bounded(path: Path, limit: int, progress: Progress | None) -> bytes:
    if not path.is_file():
        raise MpipeError(f"{path}: not a regular file")
    try:
        size = path.stat().st_size
        if size > limit:
            raise MpipeError(f"{path}: {size / MIB:.0f} MB, larger than the limit of {_limit_text(limit)} "
                             f"(set $MPIPE_TRACE_LIMIT_MB for larger traces)")
        if progress is not None and size > 8 * MIB:
            progress(f"reading {path} ({size / MIB:.0f} MB)")
        with open(path, "rb") as stream:
            raw = stream.read(limit + 1)
    except OSError as error:
        raise MpipeError(f"{path}: cannot read ({error.strerror or error})") from None
    return decode(str(path), raw, limit)


def read_paths(paths: Sequence[str | Path], progress: Progress | None = None) -> list[TraceFile]:
    """The trace files the paths name; a folder holding Ascend profiler folders
    (`*_ascend_pt`, `*_ascend_ms`) is read as those, one trace_view.json per rank."""
    from mpipe_core.formats.ascend_folders import find_profiler_folders

    limit = trace_limit()
    files = []
    plain: list[str | Path] = []
    for given in paths:
        folders = find_profiler_folders(Path(given)) if Path(given).is_dir() else []
        if folders:
            files.extend(read_profiler_folders(folders, limit, progress))
        else:
            plain.append(given)
    for path, window, order in collect_paths(plain) if plain else []:
        files.append(TraceFile(str(path), _read_bounded(path, limit, progress), window, order))
    if len(files) > MAX_FILES:
        raise MpipeError(f"more than {MAX_FILES} trace files")
    return files


def read_profiler_folders(folders: Sequence[Path], limit: int, progress: Progress | None) -> list[TraceFile]:
    from mpipe_core.formats.ascend_folders import rank_of, step_trace_of, trace_view_of

    if len(folders) > MAX_FILES:
        raise MpipeError(f"more than {MAX_FILES} profiler folders")
    out = []
    for folder in folders:
        rank = rank_of(folder)
        path = trace_view_of(folder)
        csv = step_trace_of(folder)
        out.append(TraceFile(str(path), _read_bounded(path, limit, progress), rank=rank, kind="ascend",
                             step_csv=None if csv is None else (str(csv), _read_bounded(csv, limit, progress))))
    return out


def read_uploads(uploads: Iterable[tuple[str, bytes]], progress: Progress | None = None) -> list[TraceFile]:
    """Uploaded files (the app): (name, bytes); a name's `iteration_N/` part is its window."""
    limit = trace_limit()
    files = []
    for name, raw in uploads:
        if progress is not None and len(raw) > 8 * MIB:
            progress(f"reading {name} ({len(raw) / MIB:.0f} MB)")
        window, order = "", 0
        for part in reversed(name.replace("\\", "/").split("/")[:-1]):
            m = ITERATION.match(part)
            if m:
                window, order = part, int(m[1])
                break
        files.append(TraceFile(name, decode(name, raw, limit), window, order))
        if len(files) > MAX_FILES:
            raise MpipeError(f"more than {MAX_FILES} trace files")
    return files


def digest(files: Sequence[TraceFile]) -> str:
    """sha256 of the files' contents (decompressed) and base names, in window and name order:
    the same traces give the same digest however they were packed or where they lay."""
    h = hashlib.sha256()
    def base(f: TraceFile) -> str:
        name = f.name.replace("\\", "/").rsplit("/", 1)[-1]
        name = name[:-3] if name.lower().endswith(".gz") else name
        return name if f.rank is None else f"rank{f.rank}/{name}"  # every Ascend folder's is trace_view.json

    for f in sorted(files, key=lambda f: (f.order, f.group, base(f))):
        h.update(f.group.encode("utf-8", "replace") + b"/")
        h.update(base(f).encode("utf-8", "replace") + b"\0")
        h.update(len(f.data).to_bytes(8, "big"))
        h.update(f.data)
        if f.step_csv is not None:
            h.update(b"step_trace_time.csv\0" + len(f.step_csv[1]).to_bytes(8, "big") + f.step_csv[1])
    return h.hexdigest()


def summary_only_folders(path: Path) -> bool:
    """Whether `path` is (or holds) Ascend profiler folders with step summaries but no trace_view.json:
    a job exported as summaries only, imported as a run summary."""
    from mpipe_core.formats.ascend_folders import OUTPUT, STEP_TRACE, TRACE_VIEW, find_profiler_folders

    if not path.is_dir():
        return False
    folders = find_profiler_folders(path)
    if any((f / OUTPUT / TRACE_VIEW).is_file() for f in folders):
        return False
    return cluster_summary_in(path) is not None or any((f / OUTPUT / STEP_TRACE).is_file() for f in folders)


CLUSTER_SUMMARY = "cluster_step_trace_time.csv"


def cluster_summary_in(path: Path) -> Path | None:
    """msprof-analyze's output in a job's folder (its `cluster_analysis_output/`), if there is one."""
    found = sorted(p for p in path.rglob(CLUSTER_SUMMARY) if p.is_file())
    if len(found) > 1:
        raise MpipeError(f"{path}: {len(found)} {CLUSTER_SUMMARY} files ({', '.join(map(str, found[:2]))}); "
                         f"give the one to import")
    return found[0] if found else None


def read_step_summaries(paths: Sequence[str | Path], progress: Progress | None = None) -> list[TraceFile]:
    """Step summary files: .csv files as given, or each profiler folder's step_trace_time.csv (its rank
    read from its profiler_info_<rank>.json)."""
    from mpipe_core.formats.ascend_folders import find_profiler_folders, rank_of, step_trace_of

    limit = trace_limit()
    out = []
    for given in paths:
        path = Path(given)
        cluster = cluster_summary_in(path) if path.is_dir() else None
        if cluster is not None:  # msprof-analyze's summary of the whole job (with dp/pp/tp indexes) wins
            if progress is not None:
                progress(f"reading {cluster} (msprof-analyze's summary of the job; the ranks' own "
                         f"step_trace_time.csv files are not read)")
            out.append(TraceFile(str(cluster), _read_bounded(cluster, limit, progress)))
        elif path.is_dir():
            folders = find_profiler_folders(path)
            if not folders:
                raise MpipeError(f"{path}: no *_ascend_pt or *_ascend_ms profiler folders in this folder")
            for n, folder in enumerate(folders, 1):
                csv = step_trace_of(folder)
                if csv is None:
                    raise MpipeError(f"{folder}: no ASCEND_PROFILER_OUTPUT/step_trace_time.csv")
                if progress is not None and (n % 64 == 0 or n == len(folders)):
                    progress(f"[{n}/{len(folders)}] reading {csv}")
                out.append(TraceFile(str(csv), _read_bounded(csv, limit, progress), rank=rank_of(folder)))
        elif path.exists():
            out.append(TraceFile(str(path), _read_bounded(path, limit, progress)))
        else:
            raise MpipeError(f"{path}: no such file or folder")
        if len(out) > MAX_FILES:
            raise MpipeError(f"more than {MAX_FILES} step summary files")
    return out
