"""The Runs page's "Import traces" form: another stack's run uploaded as files.

What `mpipe import-trace` reads (per-rank Chrome/Kineto traces, `.json` or
`.json.gz`, or Megatron's `task_durations.json` + `pp_task_orders.json`),
uploaded instead of named by path, is handed to
`storage.imported_runs.import_traces` as (name, bytes) pairs with the
session's actor: the storage layer authorizes it (the designer's `import`
permission, action `import-trace`) and records it, the core parses it.  The
import's `progress` lines drive a progress bar in a status box; a refusal is
the CLI's own one-line message, with the page's fields named where the CLI
names its flags.  The uploader's per-file limit is the import's
(`trace_files.trace_limit`, `$MPIPE_TRACE_LIMIT_MB`); `mpipe app` starts
Streamlit with the same `server.maxUploadSize`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

import streamlit as st

from mpipe_core.errors import MpipeError, TermError
from mpipe_core.formats.trace_files import MAX_RATIO, trace_limit
from mpipe_core.workloads.inputs import MIB

from . import auth, state, widgets
from .formatting import plain

FILES, FOLDER, ARCHIVE = "Files", "A folder", "An archive (.zip, .tar.gz)"
UPLOAD_GENERATION = "_runs.import.generation"  # bumped after an import: a fresh, empty uploader
IMPORTED = "_runs.imported"  # the success message, shown after the rerun that lists the run
PARSING = re.compile(r"\[(\d+)/(\d+)\] ")
# The CLI's flags, as this form names them (the rest of each message is the CLI's, word for word).
_FIELDS = (
    ("give --label-pattern REGEX", "give a Label pattern (a regex)"),
    ("--label-pattern", "Label pattern"),
    ("give the term with --term", "give the term in the Term field"),
    ("--term ", "Term "),
    ("choose another --name", "choose another Schedule name"),
    # no layout field here: the workload's parallel section is the layout (storage.imported_runs.world_layout)
    ("give --layout tp=..,dp=..,pp=..", "store it with a workload of yours whose parallel section gives tp and dp"),
)


def form_message(message: str) -> str:
    """An import refusal as the form says it: its flags named by the form's fields."""
    for cli, field in _FIELDS:
        message = message.replace(cli, field)
    return message


def upload_limit_mb() -> tuple[int, int]:
    """(the uploader's per-file limit in whole MB, the import's limit in bytes): the
    import's limit rounded up, unless this Streamlit server accepts less."""
    limit = trace_limit()
    server_mb = int(st.get_option("server.maxUploadSize"))
    return min(max(1, math.ceil(limit / MIB)), server_mb), limit


@dataclass
class UploadProgress:
    """`import_traces`' progress lines as a fraction for a progress bar: decoding
    and parsing file n of N take the first 90%, storing the rest."""

    show: Callable[[float, str], None]
    fraction: float = 0.0

    def __call__(self, message: str) -> None:
        parsing = PARSING.match(message)
        if parsing:
            done, total = int(parsing[1]) - 1, max(1, int(parsing[2]))
            self.fraction = 0.05 + 0.85 * done / total
        elif message.startswith("storing"):
            self.fraction = 0.9
        self.show(self.fraction, message)


def _limit_caption(widget_mb: int, limit: int) -> str:
    exact = f"{round(limit / MIB, 3):g} MB"
    text = (f"At most {exact} per file once decompressed (the import's limit; $MPIPE_TRACE_LIMIT_MB on the "
            f"server sets it). A .json.gz that inflates more than {MAX_RATIO} times its size is refused as a "
            f"gzip bomb.")
    if widget_mb < math.ceil(limit / MIB):
        text += (f" This server accepts uploads of at most {widget_mb} MB (Streamlit's server.maxUploadSize; "
                 f"`mpipe app` sets it to the import's limit).")
    return text


def import_form(db) -> None:
    """The form (inside the page's "Import traces" section): only for a role that may import."""
    if not auth.may("import-trace"):
        st.caption(plain(auth.needs("import-trace", "Importing traces")))
        return
    if IMPORTED in st.session_state:
        st.success(plain(st.session_state.pop(IMPORTED)))
    st.caption("Per-rank profiler traces (torch.profiler's export_chrome_trace, torchtitan's "
               "iteration_N/rank{R}_trace.json; torch's PP: ranges, mpipe:<module>:<kind>:<microbatch> labels, "
               "or names a label pattern matches) or Megatron's simulator output (task_durations.json and "
               "pp_task_orders.json). The run is stored like any run; docs/trace-import.md has the rules.")
    try:
        widget_mb, limit = upload_limit_mb()
    except MpipeError as error:
        widgets.show_error(error)
        return
    what = st.radio("Upload", [FILES, FOLDER, ARCHIVE], horizontal=True, key="runs.import.what",
                    help="A folder keeps torchtitan's layout: each iteration_N subfolder is one profiling window. "
                         "An archive holds a job's whole profiler output, e.g. its *_ascend_pt folders")
    generation = st.session_state.get(UPLOAD_GENERATION, 0)
    if what == ARCHIVE:
        archive = st.file_uploader(
            "A job's profiler output as one archive (.zip, .tar.gz, .tgz, .tar)", type=["zip", "tar.gz", "tgz", "tar"],
            max_upload_size=widget_mb, key=f"runs.import.archive.{generation}",
            help="Ascend *_ascend_pt / *_ascend_ms folders (trace_view.json, or step_trace_time.csv only: a run "
                 "summary, the term required), msprof-analyze's cluster_step_trace_time.csv, or Kineto traces")
        uploads = [archive] if archive is not None else []
        st.caption(plain(archive_caption()))
    else:
        uploads = st.file_uploader(
            "Trace files (.json, .json.gz)" if what == FILES else "A folder of traces (.json, .json.gz)",
            type=["json", "json.gz"], accept_multiple_files=True if what == FILES else "directory",
            max_upload_size=widget_mb, key=f"runs.import.files.{generation}",
            help="One file per rank (or Megatron's two files); the rank comes from distributedInfo.rank, else "
                 "rank<N> in the file name")
    st.caption(plain(_limit_caption(widget_mb, limit)))
    cols = st.columns(3)
    term = cols[0].text_input("Term (optional)", key="runs.import.term",
                              placeholder="inferred from the ranks' op orders",
                              help="The schedule that ran, checked against the traces; needed for a layer "
                                   "split (partition(...)), which a trace does not show").strip()
    name = cols[1].text_input("Schedule name (optional)", key="runs.import.name", placeholder="imported-<digest>",
                              help="The run is filed as a version of this schedule").strip()
    pattern = cols[2].text_input("Label pattern (optional)", key="runs.import.pattern",
                                 placeholder="e.g. (?P<kind>fwd|bwd)_mb(?P<microbatch>\\d+)",
                                 help="A regex with named groups kind and microbatch (optional chunk, module) "
                                      "for ranges other stacks name; torch's PP: ranges and mpipe: labels "
                                      "are always read").strip()
    own = st.checkbox("Store it with a workload of mine", key="runs.import.own_workload",
                      help="Default: unit costs, with the encoders the traces timed (trainable when a backward "
                           "of theirs was timed); compare and calibrate it afterwards")
    choice = widgets.workload_picker(db, key="runs.import.wl") if own else None
    ready = bool(uploads) and (choice is not None or not own)
    if widgets.write_button("Import traces", "import-trace", key="runs.import.go", type="primary",
                            target=name or "traces", schedule=name or None, disabled=not ready):
        options = dict(term=term or None, name=name or None, pattern=pattern or None,
                       workload=choice.save_as if choice is not None else None,
                       workload_label=choice and choice.label)
        _import(db, uploads, archive=what == ARCHIVE, **options)


def archive_caption() -> str:
    from .archive_upload import MAX_DEPTH, MAX_MEMBERS, archive_limit

    return (f"Unpacked into a temporary folder of its own, then imported as `mpipe import-trace FOLDER`: at most "
            f"{archive_limit() / MIB:g} MB unpacked ($MPIPE_ARCHIVE_LIMIT_MB), {MAX_MEMBERS:,} members, "
            f"{MAX_DEPTH} folders deep. Links, device files, absolute or '..' paths and archives inside the "
            f"archive are refused.")


def _checked(term: str | None, pattern: str | None) -> bool:
    """The term and the pattern refused before any file is read, as the CLI does."""
    from mpipe_core.algebra.terms import parse
    from mpipe_core.formats.label_pattern import LabelPattern

    try:
        if pattern is not None:
            LabelPattern(pattern, source="Label pattern")
        if term is not None:
            parse(term)
    except TermError as error:
        widgets.show_error(error, term, what="Term")
        return False
    except MpipeError as error:
        st.error(plain(form_message(error.message)))
        return False
    return True


def _import(db, uploads, *, term: str | None, name: str | None, pattern: str | None, workload,
            workload_label: str | None, archive: bool = False) -> None:
    """Import the uploaded files (or one archive of a job's output, `archive_import`) in a status box
    whose bar follows the import's progress lines; the new run is then selected."""
    from storage.imported_runs import import_traces

    if not _checked(term, pattern):
        return
    size = sum(u.size for u in uploads)
    what = uploads[0].name if archive else f"{len(uploads)} file(s)"
    with st.status(plain(f"Importing {what}, {size / 1e6:.1f} MB..."), expanded=True) as box:
        bar = st.progress(0.0, text=plain(f"received {what}"))
        lines: list[str] = []
        log = st.empty()

        def phase(lo: float, hi: float) -> UploadProgress:
            def show(fraction: float, line: str) -> None:
                lines.append(line)
                bar.progress(min(1.0, lo + (hi - lo) * fraction), text=plain(line))
                log.code("\n".join(lines[-8:]), language=None)
            return UploadProgress(show)

        try:
            if archive:
                from .archive_import import UNPACK_SHARE, import_archive

                run, said = import_archive(db, uploads[0].name, uploads[0].getvalue(), term=term, name=name,
                                           pattern=pattern, workload=workload, actor=auth.actor(),
                                           unpacking=phase(0.0, UNPACK_SHARE), importing=phase(UNPACK_SHARE, 1.0))
            else:
                run, trace, inferred = import_traces(
                    db, [(u.name, u.getvalue()) for u in uploads], term=term, workload=workload, name=name,
                    label_pattern=pattern, progress=phase(0.0, 1.0), actor=auth.actor())
                said = None
        except MpipeError as error:
            box.update(label="Import refused: nothing was saved", state="error", expanded=True)
            st.error(plain(widgets.ui_message(form_message(error.message))))
            return
        bar.progress(1.0, text=plain(f"stored run #{run.id}"))
        box.update(label=plain(f"Imported run #{run.id}"), state="complete", expanded=False)
    from storage import get_version

    if said is None:
        said = (f"{get_version(db, run.ref).term} ({'inferred from the ranks’ op orders' if inferred else 'given'}), "
                f"{trace.ranks} ranks, {len(trace.steps)} step(s), ops per rank "
                f"{', '.join(map(str, trace.ops_per_rank))}")
    st.session_state[IMPORTED] = (
        f"Imported run #{run.id} ({run.ref}){' from ' + uploads[0].name if archive else ''}: {said}"
        + (f", workload {workload_label}" if workload_label else "") + ". It is shown below.")
    st.session_state[UPLOAD_GENERATION] = st.session_state.get(UPLOAD_GENERATION, 0) + 1
    state.select_run(run.id)
    st.rerun()  # the run list, the picker and the run's view, with the new run selected
