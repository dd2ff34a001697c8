"""The import form's archive upload: a job's whole profiler output (its
`*_ascend_pt` folders, a `cluster_step_trace_time.csv`, Kineto traces) as one
`.zip` / `.tar.gz`, unpacked within bounds into a temporary folder of its own
(`archive_upload.extract_archive`), imported from there as
`mpipe import-trace FOLDER` would import it, and removed afterwards.  The
status box's bar follows the unpacking (the first third), then the import."""
from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st

from mpipe_core.errors import MpipeError

from . import auth, state, widgets
from .archive_upload import extract_archive
from .formatting import plain
from .trace_upload import IMPORTED, UPLOAD_GENERATION, UploadProgress, _checked, form_message

UNPACK_SHARE = 0.3


def import_archive(db, upload, *, term: str | None, name: str | None, pattern: str | None, workload,
                   workload_label: str | None) -> None:
    from storage import get_version
    from storage.imported_runs import import_step_summary, import_traces, is_step_summary_import

    if not _checked(term, pattern):
        return
    with st.status(plain(f"Importing {upload.name}, {upload.size / 1e6:.1f} MB..."), expanded=True) as box:
        bar = st.progress(0.0, text=plain(f"received {upload.name}"))
        lines: list[str] = []
        log = st.empty()

        def phase(lo: float, hi: float):
            def show(fraction: float, line: str) -> None:
                lines.append(line)
                bar.progress(min(1.0, lo + (hi - lo) * fraction), text=plain(line))
                log.code("\n".join(lines[-8:]), language=None)
            return UploadProgress(show)

        try:
            with tempfile.TemporaryDirectory(prefix="mpipe-upload-") as folder:
                root = extract_archive(upload.name, upload.getvalue(), Path(folder),
                                       progress=phase(0.0, UNPACK_SHARE))
                importing = phase(UNPACK_SHARE, 1.0)
                if is_step_summary_import([root]) or _only_summaries(root):
                    sources = [root] if is_step_summary_import([root]) else sorted(root.rglob("*.csv"))
                    run, summary, shown_term = import_step_summary(db, sources, term=term, workload=workload,
                                                                   name=name, progress=importing,
                                                                   actor=auth.actor())
                    what = (f"a run summary ({summary.format}) of {len(summary.ranks)} ranks, "
                            f"{len(summary.steps)} step(s)")
                else:
                    run, trace, inferred = import_traces(db, [root], term=term, workload=workload, name=name,
                                                         label_pattern=pattern, progress=importing,
                                                         actor=auth.actor())
                    shown_term = get_version(db, run.ref).term
                    what = (f"{'inferred from the ranks’ op orders' if inferred else 'given'}, {trace.ranks} "
                            f"ranks, {len(trace.steps)} step(s), ops per rank "
                            f"{', '.join(map(str, trace.ops_per_rank[:16]))}"
                            + (" ..." if trace.ranks > 16 else ""))
        except MpipeError as error:
            box.update(label="Import refused: nothing was saved", state="error", expanded=True)
            st.error(plain(widgets.ui_message(form_message(_relative(error.message)))))
            return
        bar.progress(1.0, text=plain(f"stored run #{run.id}"))
        box.update(label=plain(f"Imported run #{run.id}"), state="complete", expanded=False)
    st.session_state[IMPORTED] = (
        f"Imported run #{run.id} ({run.ref}) from {upload.name}: {shown_term} ({what})"
        + (f", workload {workload_label}" if workload_label else "") + ". It is shown below.")
    st.session_state[UPLOAD_GENERATION] = st.session_state.get(UPLOAD_GENERATION, 0) + 1
    state.select_run(run.id)
    st.rerun()


def _only_summaries(root: Path) -> bool:
    """An archive of .csv step summaries and nothing to read as traces."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return bool(files) and all(p.suffix.lower() == ".csv" for p in files)


def _relative(message: str) -> str:
    """Messages name paths inside the temporary folder: name them from the archive's root instead."""
    import re

    return re.sub(r"\S*/mpipe-upload-[^/\s]+/", "", message)
