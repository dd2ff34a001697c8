"""Unpacking an uploaded archive (`app.archive_upload`): a good .zip and .tar.gz
come out whole, and each hostile archive (a `..` or absolute member, a
symbolic or hard link, a device file, a bomb, an archive inside the archive,
too many members, too deep) is one clear message and writes nothing outside
the folder it was given."""
from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from app import archive_upload
from app.archive_upload import extract_archive
from mpipe_core.errors import MpipeError


def _zip(members: list[tuple[str, bytes]], modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if modes and name in modes:
                info.external_attr = modes[name] << 16
            z.writestr(info, data)
    return buf.getvalue()


def _tar(members: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                t.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                t.addfile(info, io.BytesIO(m[1]))
    return buf.getvalue()


def _special(name: str, kind: bytes, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.fixture
def box(tmp_path):
    """(the folder handed to the extraction, a snapshot function of everything around it)."""
    around = tmp_path / "around"
    around.mkdir()
    (around / "keep.txt").write_text("mine")
    dest = around / "upload"
    dest.mkdir()

    def outside() -> list[str]:
        return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if dest not in p.parents and p != dest)

    return dest, outside


GOOD = [("job/a_ascend_pt/profiler_info_0.json", b'{"rank_id": 0}'),
        ("job/a_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json", b"[]")]


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_a_good_archive_comes_out_whole_with_progress(box, kind):
    dest, outside = box
    before = outside()
    data = _zip(GOOD) if kind == "zip" else _tar(GOOD)
    lines: list[str] = []
    extract_archive(f"job.{kind}", data, dest, progress=lines.append)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == sorted(n for n, _ in GOOD)
    assert (dest / GOOD[0][0]).read_bytes() == GOOD[0][1]
    assert lines[-1].startswith("unpacked 2 member(s)")
    assert outside() == before


HOSTILE = {
    "traversal-zip": ("job.zip", lambda: _zip([("job/../../escaped.json", b"{}")]),
                      "job.zip: member 'job/../../escaped.json' points outside the archive's folder (..); refused "
                      "(nothing unpacked)"),
    "traversal-tar": ("job.tar.gz", lambda: _tar([("../escaped.json", b"{}")]),
                      "job.tar.gz: member '../escaped.json' points outside the archive's folder (..); refused "
                      "(nothing unpacked)"),
    "absolute": ("job.tar.gz", lambda: _tar([("/tmp/escaped.json", b"{}")]),
                 "job.tar.gz: member '/tmp/escaped.json' has an absolute path; refused (nothing unpacked)"),
    "windows-absolute": ("job.zip", lambda: _zip([("C:\\escaped.json", b"{}")]),
                         "job.zip: member 'C:\\escaped.json' has an absolute path; refused (nothing unpacked)"),
    "symlink-tar": ("job.tar.gz", lambda: _tar([_special("job/link", tarfile.SYMTYPE, "/etc/passwd")]),
                    "job.tar.gz: member 'job/link' is a symbolic link; refused"),
    "hardlink-tar": ("job.tar.gz", lambda: _tar([("job/a.json", b"{}"), _special("job/b.json", tarfile.LNKTYPE,
                                                                                   "job/a.json")]),
                     "job.tar.gz: member 'job/b.json' is a hard link; refused"),
    "symlink-zip": ("job.zip", lambda: _zip([("job/link", b"/etc/passwd")], {"job/link": stat.S_IFLNK | 0o777}),
                    "job.zip: member 'job/link' is a symbolic link; refused"),
    "device": ("job.tar.gz", lambda: _tar([_special("job/null", tarfile.CHRTYPE)]),
               "job.tar.gz: member 'job/null' is not a regular file or folder (a device file or FIFO?); refused"),
    "fifo": ("job.tar.gz", lambda: _tar([_special("job/pipe", tarfile.FIFOTYPE)]),
             "job.tar.gz: member 'job/pipe' is not a regular file or folder (a device file or FIFO?); refused"),
    "bomb": ("job.zip", lambda: _zip([("job/zeros.json", b"\0" * (20 << 20))]),
             "job.zip: unpacks to more than 200 times its size (an archive bomb?); refused"),
    "inner-archive": ("job.tar.gz", lambda: _tar([("job/inner.zip", _zip(GOOD))]),
                      "job.tar.gz: member 'job/inner.zip' is an archive inside the archive; unpack it and upload its "
                      "contents instead"),
    "inner-archive-renamed": ("job.zip", lambda: _zip([("job/trace.json", _zip(GOOD))]),
                              "job.zip: member 'job/trace.json' is an archive inside the archive; unpack it and upload "
                              "its contents instead"),
    "twice": ("job.tar.gz", lambda: _tar([("job/a.json", b"{}"), ("job/a.json", b"{}")]),
              "job.tar.gz: member 'job/a.json' appears twice"),
    "deep": ("job.zip", lambda: _zip([("/".join(["d"] * 17) + "/a.json", b"{}")]),
             "job.zip: member '" + "/".join(["d"] * 17) + "/a.json' is 18 levels deep; the limit is 16"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_archive_is_one_message_and_writes_nothing_outside_its_folder(box, case):
    dest, outside = box
    before = outside()
    name, build, message = HOSTILE[case]
    with pytest.raises(MpipeError) as refused:
        extract_archive(name, build(), dest)
    assert refused.value.message == message
    assert "\n" not in refused.value.message
    assert outside() == before


def test_the_total_size_and_member_count_are_bounded(box, monkeypatch):
    dest, outside = box
    before = outside()
    monkeypatch.setenv("MPIPE_ARCHIVE_LIMIT_MB", "1")
    with pytest.raises(MpipeError) as refused:
        extract_archive("job.tar.gz", _tar([("job/big.json", b"x" * (2 << 20))]), dest)
    assert refused.value.message == ("job.tar.gz: unpacks to more than 1 MB (set $MPIPE_ARCHIVE_LIMIT_MB for larger "
                                     "archives); refused")
    monkeypatch.delenv("MPIPE_ARCHIVE_LIMIT_MB")
    monkeypatch.setattr(archive_upload, "MAX_MEMBERS", 3)
    with pytest.raises(MpipeError) as refused:
        extract_archive("many.zip", _zip([(f"job/{i}.json", b"{}") for i in range(4)]), dest / "many")
    assert refused.value.message == "many.zip: more than 3 members"
    assert outside() == before
