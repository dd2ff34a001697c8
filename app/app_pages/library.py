"""Library: the team's shared schedules — search, versions and diffs, fork, tag,
archive, open in the Designer, export and import JSON."""
import json

import pandas as pd
import streamlit as st

from app import views
from mpipe_core.errors import MpipeError
from mpipe_core.presets import PRESETS, preset_document
from storage import (
    archive_schedule,
    diff_versions,
    dump_library,
    export_library,
    fork_schedule,
    get_schedule,
    history,
    import_library,
    list_schedules,
    saved_workload_name,
    tag_schedule,
)

st.title("Schedule library")
db = views.database_or_stop()
st.caption(f"Shared database: `{db.display_url}` — everyone using it sees the same schedules.")


def open_in_designer(version) -> None:
    """Put a saved version's term and workload into the Designer's widgets."""
    views.set_kept("designer.term", version.term)
    body, label = version.workload, version.workload_label
    if body is None:
        views.set_kept("wl.source", "Preset")
        views.set_kept("wl.preset", "uniform")
    elif saved_workload_name(label) is not None:
        views.set_kept("wl.source", "Saved")
        views.set_kept("wl.saved", saved_workload_name(label))
    elif label in PRESETS and body == preset_document(label):
        views.set_kept("wl.source", "Preset")
        views.set_kept("wl.preset", label)
    else:
        views.set_kept("wl.source", "JSON")
        views.set_kept("wl.json", json.dumps(body, indent=2))


cols = st.columns([3, 2, 2, 1])
search = cols[0].text_input("Search name or description", key="lib.search")
tag = cols[1].text_input("Tag", key="lib.tag")
author = cols[2].text_input("Author", key="lib.author")
archived = cols[3].checkbox("Archived too", key="lib.archived")

try:
    schedules = list_schedules(db, search=search.strip() or None, tag=tag.strip() or None,
                               author=author.strip() or None, include_archived=archived)
except MpipeError as error:
    st.error(error.message)
    st.stop()

if not schedules:
    st.info("No schedules match." if (search or tag or author) else
            "The library is empty: save a schedule from the Designer, or import a JSON export below.")
else:
    st.dataframe(pd.DataFrame([{
        "name": s.name + (" (archived)" if s.archived else ""), "versions": s.version_count,
        "makespan": views.fmt(s.latest.metric("makespan")),
        "bubble": views.fmt(s.latest.metric("bubble_ratio"), ".1%"),
        "efficiency": views.fmt(s.latest.metric("efficiency"), ".1%"),
        "tags": ", ".join(s.tags), "author": s.author, "updated": views.when(s.updated_at),
        "term": s.latest.term, "workload": s.latest.workload_label,
    } for s in schedules]), hide_index=True, key="lib.table")

    names = [s.name for s in schedules]
    name = st.selectbox("Schedule", names, key="lib.selected")
    info = get_schedule(db, name)
    versions = history(db, name)
    st.subheader(name + (" (archived)" if info.archived else ""))
    st.markdown(
        (f"{info.description}  \n" if info.description else "")
        + f"by **{info.author}**, {info.version_count} version(s)"
        + (f", tags: {', '.join(f'`{t}`' for t in info.tags)}" if info.tags else ", no tags")
        + (f", forked from **{info.forked_from}**" if info.forked_from else ""))

    t_versions, t_diff, t_fork, t_tags, t_archive = st.tabs(["Versions", "Diff", "Fork", "Tags", "Archive"])
    with t_versions:
        st.dataframe(pd.DataFrame([{
            "version": v.number, "created": views.when(v.created_at), "author": v.author,
            "makespan": views.fmt(v.metric("makespan")), "bubble": views.fmt(v.metric("bubble_ratio"), ".1%"),
            "message": v.message, "term": v.term, "workload": v.workload_label,
        } for v in reversed(versions)]), hide_index=True, key="lib.versions")
        refs = [v.ref for v in reversed(versions)]
        ref = st.selectbox("Version", refs, key="lib.version")
        version = versions[[v.ref for v in versions].index(ref)]
        st.code(version.term, language=None)
        st.caption(f"workload {version.workload_label} · makespan {views.fmt(version.metric('makespan'))} · "
                   f"bubble {views.fmt(version.metric('bubble_ratio'), '.1%')}"
                   + (f" · parent {version.parent}" if version.parent else ""))
        if st.button("Open in the Designer", key="lib.open"):
            open_in_designer(version)
            st.switch_page("app_pages/designer.py")
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
            st.error(error.message)
        else:
            if diff.term_diff:
                st.code("\n".join(diff.term_diff), language="diff")
            else:
                st.caption(f"Same term: `{diff.a.term}`")
            if diff.workload_changed:
                st.caption(f"Workload changed: {diff.a.workload_label} → {diff.b.workload_label}")
            rows = []
            for key, (va, vb, delta) in diff.metrics.items():
                spec = ".1%" if key in ("bubble_ratio", "efficiency") else ".4g"
                rows.append({"metric": key, diff.a.ref: views.fmt(va, spec), diff.b.ref: views.fmt(vb, spec),
                             "change": (("+" if isinstance(delta, (int, float)) and delta > 0 else "")
                                        + views.fmt(delta, spec))})
            st.dataframe(pd.DataFrame(rows), hide_index=True, key="lib.diff")
    with t_fork:
        with st.form("lib.fork"):
            source = st.selectbox("Fork version", [v.ref for v in reversed(versions)], key="lib.fork_source")
            new_name = st.text_input("New schedule name", key="lib.fork_name")
            message = st.text_input("Message", key="lib.fork_message")
            if st.form_submit_button("Fork"):
                try:
                    forked = fork_schedule(db, source, new_name.strip(), message=message or None)
                except MpipeError as error:
                    st.error(error.message)
                else:
                    st.success(f"Forked {forked.parent} into {forked.ref}")
    with t_tags:
        with st.form("lib.tags"):
            add = st.text_input("Add tags (comma separated)", key="lib.tags_add")
            remove = st.multiselect("Remove tags", list(info.tags), key="lib.tags_remove")
            if st.form_submit_button("Apply"):
                try:
                    tags = tag_schedule(db, name, add=[t.strip() for t in add.split(",") if t.strip()],
                                        remove=remove)
                except MpipeError as error:
                    st.error(error.message)
                else:
                    st.success(f"Tags of {name}: {', '.join(tags) or 'none'}")
    with t_archive:
        st.caption("Archiving hides a schedule from listings; its versions and runs stay.")
        label = "Restore" if info.archived else "Archive"
        if st.button(f"{label} {name}", key="lib.archive"):
            try:
                archive_schedule(db, name, restore=info.archived)
            except MpipeError as error:
                st.error(error.message)
            else:
                st.rerun()

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
        st.error(error.message)
    else:
        st.download_button("Download JSON", text, file_name="mpipe-library.json", mime="application/json",
                           key="lib.download")
with imp:
    st.subheader("Import")
    upload = st.file_uploader("An exported library (JSON)", type=["json"], key="lib.upload")
    rename = st.checkbox("Rename conflicting names (NAME-2, ...) instead of refusing", key="lib.rename")
    if upload is not None and st.button("Import", key="lib.import"):
        try:
            doc = json.loads(upload.getvalue().decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            st.error(f"{upload.name} is not JSON: {error}")
        else:
            try:
                result = import_library(db, doc, rename=rename)
            except MpipeError as error:
                st.error(error.message)
            else:
                lines = [f"Imported {len(result.schedules)} schedule(s) and "
                         f"{len(result.workloads) - len(result.reused_workloads)} workload(s)."]
                lines += [f"{old} → {new}" for old, new in result.renamed.items()]
                lines += [f"{ref}: fork origin not in this library, lineage link dropped" for ref in result.unlinked]
                st.success("  \n".join(lines))
