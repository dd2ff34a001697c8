"""An uploaded archive of a job's profiler output (`.zip`, `.tar.gz`/`.tgz`,
`.tar`) unpacked into the upload's own temporary folder, within bounds.

    with tempfile.TemporaryDirectory() as folder:
        root = extract_archive(name, data, Path(folder), progress=print)
        import_traces(db, [root], ...)

Nothing is written outside `dest`, and nothing is trusted about the archive:

* a member whose name is absolute (`/…`, `C:…`, `\\…`) or has a `..` part is
  refused, and so is any name that would land outside `dest` once resolved;
* only regular files and folders are unpacked: symbolic and hard links,
  device files and FIFOs are refused (naming the member);
* an archive inside the archive (a `.zip`, `.tar`, `.tgz`, `.tar.gz`, … member,
  or a member that starts like a zip file) is refused: it is not unpacked;
* at most `MAX_MEMBERS` members, `MAX_DEPTH` folders deep, and
  `archive_limit()` bytes unpacked in all (4 GiB, `$MPIPE_ARCHIVE_LIMIT_MB`);
  past the first 16 MiB the unpacked bytes may be at most `MAX_RATIO` times
  the archive's size (a bomb of zeros inflates ~1000x, traces 5-20x).  Sizes
  are counted as the bytes are written, not taken from the archive's headers.

A refusal is one `MpipeError` line naming the archive and the member; the
caller's temporary folder (and what was written into it) is then removed with it.
"""
from __future__ import annotations

import io
import os
import re
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.inputs import MIB

MAX_MEMBERS = 50_000
MAX_DEPTH = 16
MAX_RATIO = 200
RATIO_GRACE = 16 * MIB
DEFAULT_LIMIT_MB = 4096
CHUNK = 1 * MIB
ARCHIVE_NAMES = (".zip", ".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".7z", ".rar", ".jar")
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
Progress = Callable[[str], None]
_DRIVE = re.compile(r"[A-Za-z]:")


def archive_limit() -> int:
    """Bytes an archive may unpack to in all: $MPIPE_ARCHIVE_LIMIT_MB or 4 GiB."""
    from mpipe_core.formats.trace_files import megabytes_limit

    return megabytes_limit("MPIPE_ARCHIVE_LIMIT_MB", DEFAULT_LIMIT_MB)


def is_archive_name(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _safe_parts(archive: str, member: str) -> tuple[str, ...]:
    """The member's path parts, or MpipeError when the name could leave the folder."""
    text = member.replace("\\", "/")
    if text.startswith("/") or _DRIVE.match(text) or "\0" in text:
        raise MpipeError(f"{archive}: member '{member[:120]}' has an absolute path; refused (nothing unpacked)")
    parts = tuple(p for p in PurePosixPath(text).parts if p not in ("", "."))
    if ".." in parts:
        raise MpipeError(f"{archive}: member '{member[:120]}' points outside the archive's folder (..); "
                         f"refused (nothing unpacked)")
    if len(parts) > MAX_DEPTH:
        raise MpipeError(f"{archive}: member '{member[:120]}' is {len(parts)} levels deep; the limit is {MAX_DEPTH}")
    return parts


def _is_inner_archive(name: str, head: bytes) -> bool:
    lower = name.lower()
    return lower.endswith(ARCHIVE_NAMES) or head.startswith(b"PK\x03\x04") or head[257:262] == b"ustar"


class _Writer:
    """Writes members under `dest`, counting what is written against the bounds."""

    def __init__(self, archive: str, dest: Path, packed: int, progress: Progress | None, total_members: int):
        self.archive, self.dest, self.packed = archive, dest.resolve(), packed
        self.limit = archive_limit()
        self.written = 0
        self.members = 0
        self.total = total_members
        self.progress = progress
        self.seen: set[tuple[str, ...]] = set()

    def _target(self, parts: tuple[str, ...]) -> Path:
        target = self.dest.joinpath(*parts)
        resolved = target.resolve()
        if resolved != self.dest and self.dest not in resolved.parents:
            raise MpipeError(f"{self.archive}: member '{'/'.join(parts)[:120]}' would land outside the archive's "
                             f"folder; refused")
        return target

    def count(self, name: str) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise MpipeError(f"{self.archive}: more than {MAX_MEMBERS} members")
        if self.progress is not None and (self.members == self.total or self.members % 64 == 0):
            self.progress(f"[{self.members}/{self.total}] unpacking {name[:100]}" if self.total
                          else f"unpacking member {self.members}: {name[:100]}")

    def folder(self, parts: tuple[str, ...]) -> None:
        if parts:
            self._target(parts).mkdir(parents=True, exist_ok=True)

    def file(self, name: str, parts: tuple[str, ...], chunks: Iterator[bytes]) -> None:
        if not parts:
            raise MpipeError(f"{self.archive}: member '{name[:120]}' has no name")
        if parts in self.seen:
            raise MpipeError(f"{self.archive}: member '{name[:120]}' appears twice")
        self.seen.add(parts)
        target = self._target(parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        self._target(parts)  # the parents made are ours: resolve again
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(target, flags, 0o600)
        first = True
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                if first and _is_inner_archive(name, chunk[:512]):
                    raise MpipeError(f"{self.archive}: member '{name[:120]}' is an archive inside the archive; "
                                     f"unpack it and upload its contents instead")
                first = False
                self.written += len(chunk)
                if self.written > self.limit:
                    raise MpipeError(f"{self.archive}: unpacks to more than {self.limit / MIB:g} MB "
                                     f"(set $MPIPE_ARCHIVE_LIMIT_MB for larger archives); refused")
                if self.written > RATIO_GRACE and self.written > MAX_RATIO * max(1, self.packed):
                    raise MpipeError(f"{self.archive}: unpacks to more than {MAX_RATIO} times its size "
                                     f"(an archive bomb?); refused")
                out.write(chunk)
        if first and _is_inner_archive(name, b""):
            raise MpipeError(f"{self.archive}: member '{name[:120]}' is an archive inside the archive; "
                             f"unpack it and upload its contents instead")


def _read(stream, limit: int = CHUNK) -> Iterator[bytes]:
    while True:
        chunk = stream.read(limit)
        if not chunk:
            return
        yield chunk


def _zip(name: str, data: bytes, writer: _Writer) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError) as error:
        raise MpipeError(f"{name}: not a valid zip file ({error})") from None
    with archive:
        infos = archive.infolist()
        writer.total = len(infos)
        for info in infos:
            writer.count(info.filename)
            parts = _safe_parts(name, info.filename)
            mode = info.external_attr >> 16
            kind = stat.S_IFMT(mode)
            if kind == stat.S_IFLNK:
                raise MpipeError(f"{name}: member '{info.filename[:120]}' is a symbolic link; refused")
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise MpipeError(f"{name}: member '{info.filename[:120]}' is not a regular file or folder "
                                 f"(a device file or FIFO?); refused")
            if info.is_dir():
                writer.folder(parts)
                continue
            try:
                with archive.open(info) as stream:
                    writer.file(info.filename, parts, _read(stream))
            except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError) as error:
                raise MpipeError(f"{name}: member '{info.filename[:120]}' cannot be read ({error})") from None


def _tar(name: str, data: bytes, writer: _Writer) -> None:
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, OSError, EOFError) as error:
        raise MpipeError(f"{name}: not a valid tar archive ({error})") from None
    with archive:
        writer.total = 0  # a tar's count is known only at its end: progress counts up
        try:
            for member in archive:
                writer.count(member.name)
                parts = _safe_parts(name, member.name)
                if member.issym() or member.islnk():
                    raise MpipeError(f"{name}: member '{member.name[:120]}' is a "
                                     f"{'symbolic' if member.issym() else 'hard'} link; refused")
                if member.isdir():
                    writer.folder(parts)
                    continue
                if not member.isfile():
                    raise MpipeError(f"{name}: member '{member.name[:120]}' is not a regular file or folder "
                                     f"(a device file or FIFO?); refused")
                stream = archive.extractfile(member)
                assert stream is not None
                writer.file(member.name, parts, _read(stream))
        except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
            raise MpipeError(f"{name}: the archive is damaged or truncated ({error})") from None


def extract_archive(name: str, data: bytes, dest: Path, progress: Progress | None = None) -> Path:
    """Unpack the archive `name` (its bytes) into `dest` (an empty folder of the caller's);
    returns `dest`.  MpipeError (one line) for anything refused."""
    if not is_archive_name(name):
        raise MpipeError(f"{name}: not a .zip, .tar.gz, .tgz or .tar archive")
    writer = _Writer(name, dest, len(data), progress, 0)
    if name.lower().endswith(".zip"):
        _zip(name, data, writer)
    else:
        _tar(name, data, writer)
    if writer.members == 0:
        raise MpipeError(f"{name}: the archive is empty")
    if progress is not None:
        progress(f"unpacked {writer.members} member(s), {writer.written / MIB:.1f} MB")
    return dest
