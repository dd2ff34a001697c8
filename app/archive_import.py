"""A job's whole profiler output uploaded as one archive (`.zip`, `.tar.gz`):
unpacked within bounds into a temporary folder of its own
(`archive_upload.extract_archive`), imported from there as
`mpipe import-trace FOLDER` would import it (a run summary when it holds step
summaries only), and removed afterwards.  No Streamlit here: the import form
(`trace_upload`) shows the progress lines and the outcome."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from .archive_upload import extract_archive

UNPACK_SHARE = 0.3  # of the progress bar: unpacking, then importing
_TEMP = re.compile(r"\S*/mpipe-upload-[^/\s]+/")


def import_archive(db, archive: str, data: bytes, *, term: str | None, name: str | None = None,
                   pattern: str | None = None, workload: Any = None, actor=None,
                   unpacking: Callable[[str], None] | None = None,
                   importing: Callable[[str], None] | None = None) -> tuple[Any, str]:
    """(the stored run, what it is in words).  MpipeError (one line, paths named from the
    archive's root) for anything refused; nothing is saved then."""
    from mpipe_core.errors import MpipeError
    from storage import get_version
    from storage.imported_runs import import_step_summary, import_traces, is_step_summary_import

    schedule = name
    try:
        with tempfile.TemporaryDirectory(prefix="mpipe-upload-") as folder:
            root = extract_archive(archive, data, Path(folder), progress=unpacking)
            if is_step_summary_import([root]) or _only_summaries(root):
                sources = [root] if is_step_summary_import([root]) else sorted(root.rglob("*.csv"))
                run, summary, shown = import_step_summary(db, sources, term=term, workload=workload, name=schedule,
                                                          progress=importing, actor=actor)
                return run, (f"{shown} (a run summary ({summary.format}) of {len(summary.ranks)} ranks, "
                             f"{len(summary.steps)} step(s))")
            run, trace, inferred = import_traces(db, [root], term=term, workload=workload, name=schedule,
                                                 label_pattern=pattern, progress=importing, actor=actor)
            ops = ", ".join(map(str, trace.ops_per_rank[:16])) + (" ..." if trace.ranks > 16 else "")
            return run, (f"{get_version(db, run.ref).term} ({'inferred from the ranks’ op orders' if inferred else 'given'}"
                         f"), {trace.ranks} ranks, {len(trace.steps)} step(s), ops per rank {ops}")
    except MpipeError as error:  # the same error, its paths named from the archive's root
        error.message = _TEMP.sub("", error.message)
        error.args = (error.message,)
        raise


def _only_summaries(root: Path) -> bool:
    """An archive of .csv step summaries and nothing to read as traces."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return bool(files) and all(p.suffix.lower() == ".csv" for p in files)
