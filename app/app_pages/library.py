"""Library: the team's shared schedules — search, versions and diffs, fork, tag,
archive, open in the Designer, export and import JSON, and who changed what.
Controls the user's role may not use are not drawn (`app.auth`)."""
import pandas as pd
import streamlit as st

from app import auth, state, widgets
from app.database import database_or_stop
from app.evaluation import app_max_ops, dies_per_npu, parallel_degrees, version_label, version_units
from app.formatting import FITS_WORD, device_count, devices_total, fmt, pct, plain, signed, when
from mpipe_core.errors import MpipeError
from mpipe_core.workloads.inputs import LIBRARY_FILE_LIMIT, MIB, load_document
from storage import (
    archive_schedule,
    describe_schedule,
    diff_versions,
    dump_library,
    eval_command,
    export_library,
    fork_schedule,
    get_schedule,
    history,
    import_library,
    list_audit,
    list_runs,
    list_schedules,
    saved_workload_name,
    tag_schedule,
)

st.title("Schedule library")
db = database_or_stop()
st.caption(plain(f"Shared database: {db.display_url} — everyone using it sees the same schedules."))


LIBRARY_ACTIONS = ("save", "save-workload", "fork", "tag", "describe", "archive", "restore", "import")
NOTICE = "lib.notice"  # a success message to show after the rerun that refreshes the lists


SELECT_NEXT = "_lib.select_next"  # a schedule to select on the next run (its widget is drawn already now)


def done(message: str, select: str | None = None) -> None:
    """Show `message` on the next run, and rerun so every list on the page is fresh."""
    st.session_state[NOTICE] = message
    if select is not None:
        st.session_state[SELECT_NEXT] = select
    st.rerun()


if NOTICE in st.session_state:
    # Each line as typed (names and tags are user text), one per line.
    st.success("  \n".join(plain(line) for line in st.session_state.pop(NOTICE).splitlines()))
if SELECT_NEXT in st.session_state:
    st.session_state["lib.selected"] = st.session_state.pop(SELECT_NEXT)

# A link from a run (?schedule=NAME&version=NAME@N) opens that schedule and version once.
_link = (st.query_params.get("schedule"), st.query_params.get("version"))
if _link[0] and st.session_state.get("_lib.link_seen") != _link:
    st.session_state["_lib.link_seen"] = _link
    st.session_state["lib.selected"] = _link[0]
    if _link[1]:
        st.session_state["lib.version"] = _link[1]


def _version_runs(ref: str) -> None:
    """The runs of this version, each a link to it on the Runs page."""
    runs = [r for r in list_runs(db, schedule=ref.split("@")[0], limit=200) if r.ref == ref]
    if not runs:
        st.caption("No runs of this version yet (launch one on the Runs page).")
        return
    st.caption(plain(f"Runs of {ref}:"))
    cols = st.columns(min(4, len(runs)))
    for i, r in enumerate(runs[:12]):
        cols[i % len(cols)].page_link("app_pages/runs.py", label=f"run #{r.id} ({r.status})",
                                      icon=":material/play_arrow:", query_params={"run": str(r.id)})

# What the diff calls each metric, and how it is written.
_TIME, _MEMORY, _FRACTION, _COUNT = "time", "memory", "fraction", "count"
DIFF_METRICS = {"makespan": ("makespan", _TIME), "bubble_ratio": ("bubble ratio", _FRACTION),
                "efficiency": ("efficiency vs lower bound", _FRACTION), "lower_bound": ("lower bound", _TIME),
                "peak_memory": ("peak memory (max)", _MEMORY), "devices": ("devices", _COUNT),
                "ops": ("ops", _COUNT)}


def _diff_rows(diff) -> list[dict]:
    """The metrics of two versions in words, with units, and the change: percentage
    points for ratios, none where the two workloads' units differ (storage's
    `diff_versions` gives no change then; the page says why)."""
    units = [version_units(diff.a), version_units(diff.b)]
    rows = []
    for key, (label, kind) in DIFF_METRICS.items():
        if key not in diff.metrics:
            continue
        va, vb, delta = diff.metrics[key]
        if kind == _FRACTION:
            shown = [pct(va), pct(vb)]
            change = f"{delta * 100:+.1f} pp" if isinstance(delta, (int, float)) else "–"
        elif kind in (_TIME, _MEMORY):
            which = 0 if kind == _TIME else 1
            unit_a, unit_b = units[0][which], units[1][which]
            shown = [fmt(va, unit_a), fmt(vb, unit_b)]
            change = (signed(delta, unit_a) if delta is not None else
                      "– (the workloads' units differ)" if unit_a != unit_b else "–")
        elif key == "devices" and isinstance(va, int) and isinstance(vb, int):
            # In all: each pipeline device is tp devices, the pipeline replicated dp times.
            deg_a, deg_b = parallel_degrees(diff.a.workload), parallel_degrees(diff.b.workload)
            shown = [device_count(va, deg_a, dies_per_npu(diff.a.workload)),
                     device_count(vb, deg_b, dies_per_npu(diff.b.workload))]
            change = signed(devices_total(vb, deg_b) - devices_total(va, deg_a))
        else:
            shown = [fmt(va), fmt(vb)]
            change = signed(delta)
        # (a version diffed with itself keeps both columns)
        rows.append({"metric": label, diff.a.ref: shown[0],
                     diff.b.ref if diff.b.ref != diff.a.ref else f"{diff.b.ref} (again)": shown[1], "change": change})
    return rows


cols = st.columns([3, 2, 2, 1])
search = cols[0].text_input("Search", key="lib.search",
                            help="Matches a schedule's name or description, or any version's term or message")
tag = cols[1].text_input("Tag", key="lib.tag")
author = cols[2].text_input("Author", key="lib.author")
archived = cols[3].checkbox("Archived too", key="lib.archived")

try:
    schedules = list_schedules(db, search=search.strip() or None, tag=tag.strip() or None,
                               author=author.strip() or None, include_archived=archived)
except MpipeError as error:
    widgets.show_error(error)
    st.stop()

if not schedules:
    st.info("No schedules match." if (search or tag or author) else
            "The library is empty: save a schedule from the Designer, or import a JSON export below.")
else:
    st.dataframe(pd.DataFrame([{
        "name": s.name + (" (archived)" if s.archived else ""), "versions": s.version_count,
        "description": s.description, "makespan": fmt(s.latest.metric("makespan"), version_units(s.latest)[0]),
        "bubble": pct(s.latest.metric("bubble_ratio")), "efficiency": pct(s.latest.metric("efficiency")),
        "fits": FITS_WORD[s.latest.metric("fits") if s.latest.metric("fits") in (True, False) else None],
        "tags": ", ".join(s.tags), "author": s.author, "updated": when(s.updated_at),
        "term": s.latest.term, "workload": version_label(s.latest),
    } for s in schedules]), hide_index=True, key="lib.table", width="stretch")

    names = [s.name for s in schedules]
    name = st.selectbox("Schedule", names, key="lib.selected")
    info = get_schedule(db, name)
    versions = history(db, name)
    # User text (names, descriptions, authors, tags) is shown as plain text, never as markup:
    # an imported description with an image would make every viewer's browser fetch it.
    st.subheader(plain(name) + (" (archived)" if info.archived else ""))
    if info.description:
        st.text(info.description)
    st.caption(plain(f"by {info.author}, {info.version_count} version(s)"
                     + (f", tags: {', '.join(info.tags)}" if info.tags else ", no tags")
                     + (f", forked from {info.forked_from}" if info.forked_from else "")))

    # Tabs of the writes the user's role allows, then the schedule's audit trail.
    writes = {"Fork": "fork", "Tags": "tag", "Description": "describe", "Archive": "archive"}
    shown_tabs = ["Versions", "Diff", *[t for t, action in writes.items() if auth.may(action)], "Activity"]
    tabs = dict(zip(shown_tabs, st.tabs(shown_tabs)))
    hidden = [action for t, action in writes.items() if t not in tabs]
    if hidden:
        st.caption(plain(auth.not_offered(hidden)))
    t_versions, t_diff = tabs["Versions"], tabs["Diff"]
    with t_versions:
        st.dataframe(pd.DataFrame([{
            "version": v.number, "created": when(v.created_at), "author": v.author,
            "makespan": fmt(v.metric("makespan"), version_units(v)[0]), "bubble": pct(v.metric("bubble_ratio")),
            "fits": FITS_WORD[v.metric("fits") if v.metric("fits") in (True, False) else None],
            "message": v.message, "term": v.term, "workload": version_label(v),
        } for v in reversed(versions)]), hide_index=True, key="lib.versions", width="stretch")
        refs = [v.ref for v in reversed(versions)]
        ref = st.selectbox("Version", refs, key="lib.version")
        version = versions[[v.ref for v in versions].index(ref)]
        st.code(version.term, language=None)
        st.caption(plain(f"workload {version_label(version)} · makespan "
                         f"{fmt(version.metric('makespan'), version_units(version)[0])} · "
                         f"bubble {pct(version.metric('bubble_ratio'))}"
                         + (f" · parent {version.parent}" if version.parent else "")))
        st.caption("The same figures from the command line:")
        st.code(eval_command(version, db.display_url), language="bash", wrap_lines=True)
        cols = st.columns(2)
        if cols[0].button("Open in the Designer", key="lib.open"):
            state.open_in_designer(version.term, version.workload, version.workload_label)
            st.switch_page("app_pages/designer.py")
        _version_runs(version.ref)
    with t_diff:
        if len(versions) < 2:
            st.info("One version only; save another (Designer → 'New version of an existing schedule') "
                    "to diff, or compare with any version of another schedule by reference.")
        refs = [v.ref for v in versions]
        c = st.columns(2)
        a = c[0].text_input("From", value=refs[-2] if len(refs) > 1 else refs[-1], key=f"lib.diff_a.{name}")
        b = c[1].text_input("To", value=refs[-1], key=f"lib.diff_b.{name}")
        try:
            diff = diff_versions(db, a.strip(), b.strip())
        except MpipeError as error:
            widgets.show_error(error)
        else:
            if diff.term_diff:
                st.code("\n".join(diff.term_diff), language="diff")
            else:
                st.caption(plain(f"Same term: {diff.a.term}"))
            if diff.workload_changed:
                st.caption(plain(f"Workload changed: {version_label(diff.a)} → {version_label(diff.b)}"))
            st.dataframe(pd.DataFrame(_diff_rows(diff)), hide_index=True, key="lib.diff", width="stretch")
            st.caption("Bubble ratio and efficiency change in percentage points (pp); times and memory in "
                       "each version's workload units.")
    if "Fork" in tabs:
        with tabs["Fork"]:
            source = st.selectbox("Fork version", [v.ref for v in reversed(versions)], key="lib.fork_source")
            new_name = st.text_input("New schedule name", key="lib.fork_name")
            message = st.text_input("Message", key="lib.fork_message")
            if widgets.write_button("Fork", "fork", key="lib.fork", target=new_name.strip() or source,
                                    schedule=new_name.strip() or None):
                try:
                    forked = fork_schedule(db, source, new_name.strip(), message=message or None)
                except MpipeError as error:
                    widgets.show_error(error)
                else:
                    done(f"Forked {forked.parent} into {forked.ref}", select=forked.ref.split("@")[0])
    if "Tags" in tabs:
        with tabs["Tags"]:
            add = st.text_input("Add tags (comma separated)", key="lib.tags_add")
            remove = st.multiselect("Remove tags", list(info.tags), key="lib.tags_remove")
            if widgets.write_button("Apply", "tag", key="lib.tags_apply", target=name, schedule=name):
                try:
                    tags = tag_schedule(db, name, add=[t.strip() for t in add.split(",") if t.strip()],
                                        remove=remove)
                except MpipeError as error:
                    widgets.show_error(error)
                else:
                    done(f"Tags of {name}: {', '.join(tags) or 'none'}")
    if "Description" in tabs:
        with tabs["Description"]:
            text = st.text_area("Description", value=info.description, key=f"lib.description.{name}",
                                help="What this schedule is for; search finds it")
            if widgets.write_button("Save description", "describe", key="lib.describe", target=name, schedule=name):
                try:
                    describe_schedule(db, name, text.strip())
                except MpipeError as error:
                    widgets.show_error(error)
                else:
                    done(f"Description of {name} saved")
    if "Archive" in tabs:
        with tabs["Archive"]:
            st.caption("Archiving hides a schedule from listings; its versions and runs stay.")
            label = "Restore" if info.archived else "Archive"
            if widgets.write_button(plain(f"{label} {name}"), "restore" if info.archived else "archive",
                                    key="lib.archive", target=name, schedule=name):
                try:
                    archive_schedule(db, name, restore=info.archived)
                except MpipeError as error:
                    widgets.show_error(error)
                else:
                    done(f"{name} {'restored' if info.archived else 'archived'}")
    with tabs["Activity"]:
        widgets.audit_table(list_audit(db, schedule=name, limit=100), key="lib.activity",
                            empty="Nothing recorded for this schedule yet.")

st.divider()
exp, imp = st.columns(2, gap="large")
with exp:
    st.subheader("Export")
    scope = st.radio("What", ["Whole library", "Selected schedule"], horizontal=True, key="lib.export_scope",
                     disabled=not schedules)
    names_to_export = [st.session_state["lib.selected"]] if (
        scope == "Selected schedule" and schedules and "lib.selected" in st.session_state) else None
    try:
        text = dump_library(export_library(db, names_to_export))
    except MpipeError as error:
        widgets.show_error(error)
    else:
        st.download_button("Download JSON", text, file_name="mpipe-library.json", mime="application/json",
                           key="lib.download")
with imp:
    st.subheader("Import")
    if not auth.may("import"):
        st.caption(plain(auth.needs("import", "Importing")))
    else:
        # The uploader's caption states the limit we enforce (Streamlit's default says 200 MB).
        upload = st.file_uploader("An exported library (JSON)", type=["json"], key="lib.upload",
                                  max_upload_size=LIBRARY_FILE_LIMIT // MIB)
        rename = st.checkbox("Rename conflicting names (NAME-2, ...) instead of refusing", key="lib.rename")
        if upload is not None and widgets.write_button("Import", "import", key="lib.import", target=upload.name):
            try:
                data = upload.getvalue()
                if len(data) > LIBRARY_FILE_LIMIT:
                    raise MpipeError(f"{upload.name}: larger than the limit of {LIBRARY_FILE_LIMIT // MIB} MB")
                doc = load_document(data, upload.name, kind="JSON")
                result = import_library(db, doc, rename=rename, max_ops=app_max_ops(), source=upload.name)
            except MpipeError as error:
                widgets.show_error(error)
            else:
                lines = [f"Imported {len(result.schedules)} schedule(s) and "
                         f"{len(result.workloads) - len(result.reused_workloads)} workload(s)."]
                lines += [f"{old} → {new}" for old, new in result.renamed.items()]
                lines += [f"{ref}: fork origin not in this library, lineage link dropped" for ref in result.unlinked]
                lines += [f"{note}: stored as recomputed" for note in result.recomputed]
                done("\n".join(lines))

with st.expander("Recent activity in the library"):
    widgets.audit_table(list_audit(db, actions=LIBRARY_ACTIONS, limit=50), key="lib.recent")

