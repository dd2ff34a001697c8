"""The database handle: one engine per server process, shared by every session,
acting for the user of the request at hand (`app.auth.actor`)."""
from __future__ import annotations

import streamlit as st

from mpipe_core.errors import MpipeError

from .formatting import plain


@st.cache_resource(show_spinner=False)
def _open_database(url: str):
    from storage import open_database

    return open_database(url)


def database():
    """The shared database ($MPIPE_DB_URL, else the per-user SQLite file), acting as
    the user of this request: every write made through it is theirs, and refused
    by the storage layer if their role does not allow it."""
    from storage import resolve_db_url

    from .auth import actor

    return _open_database(resolve_db_url()).acting_as(actor())


def database_or_stop():
    """The database, or an inline error and the end of this page's run."""
    try:
        return database()
    except MpipeError as error:
        st.error(plain(f"Cannot open the database: {error.message}"))
        st.stop()


def database_or_none(purpose: str):
    """The database, or None with a warning that `purpose` is unavailable."""
    try:
        return database()
    except MpipeError as error:
        st.warning(plain(f"The library is not available ({error.message}); {purpose}."))
        return None
