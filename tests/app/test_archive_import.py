"""An archive of a job's Ascend profiler output imported as the import form
does it (`app.archive_import`): the traces inside a .zip become a run with
its communication rows; a refusal names paths from the archive's root (never
the temporary folder) and saves nothing; the temporary folder is gone after."""
from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

import pytest
from ascend_layout import write_job
from kineto_traces import pipelining_traces

from app.archive_import import import_archive
from mpipe_core.errors import MpipeError
from storage import list_runs
from storage.step_figures import comm_for, step_figures_for

pytestmark = pytest.mark.databases("sqlite")
TERM = "1f1b(p=2, m=4)"


def zipped(folder: Path, skip: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and (skip is None or path.name != skip):
                z.write(path, path.relative_to(folder.parent))
    return buf.getvalue()


@pytest.fixture
def job(tmp_path):
    return write_job(pipelining_traces(TERM, lambda op, step: 10.0, sends=True), tmp_path / "job")


def test_an_archive_of_profiler_folders_imports_as_its_traces(db, job):
    unpacked, imported = [], []
    leftovers = set(Path(tempfile.gettempdir()).glob("mpipe-upload-*"))
    run, said = import_archive(db, "job.zip", zipped(job), term=None, unpacking=unpacked.append,
                               importing=imported.append)
    assert said.startswith(f"{TERM} (inferred from the ranks’ op orders), 2 ranks, 2 step(s)")
    assert unpacked[-1].startswith("[") or unpacked[-1].startswith("unpacked")
    assert any(line.startswith("[1/2] parsing ") for line in imported)
    assert len(comm_for(db, run.id)) == 16 and len(step_figures_for(db, run.id)) == 4
    assert set(Path(tempfile.gettempdir()).glob("mpipe-upload-*")) == leftovers  # removed afterwards


def test_a_refusal_names_the_archive_s_own_paths_and_saves_nothing(db, job):
    with pytest.raises(MpipeError) as refused:
        import_archive(db, "job.zip", zipped(job, skip="profiler_info_1.json"), term=None)
    folder = next(p.name for p in job.iterdir() if p.name.startswith("node01"))
    assert refused.value.message == (f"job/{folder}: no profiler_info_<rank>.json in this profiler folder; "
                                     f"cannot tell its rank")
    assert list_runs(db) == []
    json.dumps(refused.value.message)  # one plain line


def test_a_512_rank_archive_drives_the_progress_bar_from_unpacking_to_storing(db):
    from test_app_ascend_upload import job_archive

    from app.archive_import import UNPACK_SHARE
    from app.trace_upload import UploadProgress

    shown: list[tuple[float, str]] = []

    def phase(lo: float, hi: float) -> UploadProgress:
        return UploadProgress(lambda fraction, line: shown.append((lo + (hi - lo) * fraction, line)))

    run, said = import_archive(db, "job.zip", job_archive("zip"), term="1f1b(p=4, m=8)",
                               unpacking=phase(0.0, UNPACK_SHARE), importing=phase(UNPACK_SHARE, 1.0))
    assert said.startswith("1f1b(p=4, m=8) (a run summary (cluster_step_trace_time) of 512 ranks, 3 step(s))")
    fractions = [f for f, _ in shown]
    assert fractions == sorted(fractions)  # the bar only moves forward
    unpacking = [line for _, line in shown if "unpacking" in line]
    assert len(unpacking) >= 1025 // 64 and unpacking[-1].startswith("[1025/1025] unpacking ")
    assert shown[-1][1] == "storing 1536 step figures of 512 ranks" and shown[-1][0] > 0.9
