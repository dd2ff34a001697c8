"""Who is using the app and what they may do.

`mpipe app` says how it lets people in ($MPIPE_APP_AUTH, `access_config.MODES`):

* `signin`: everyone signs in through Streamlit's OpenID Connect (`st.login`)
  and gets a role from the roles file or an ID-token claim
  (`access_config.RolesConfig`); their identity is the author of what they write.
* `open` (`--no-auth`): no sign-in; every page says that anyone who reaches
  it may do everything.
* `local` (the default, this machine only): the local user, with every right.

`gate()` runs first on every page (main.py).  `actor()` is who acts, computed
afresh for each request (a changed roles file applies at the next click);
`app.database.database()` hands it to the storage layer, whose one
authorization check refuses and records what the role may not do.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import streamlit as st

from storage.access import LOCAL, NO_ROLE, ROLES, Actor, local_actor
from storage.models import NAME_LENGTH

from .access_config import (
    AUTH_ENV, MODES, OPEN, SIGN_IN, AccessConfigError, RolesConfig, identity_of, load_roles, providers,
    roles_file_from_env)
from .formatting import plain

_REFUSED = "_auth.refused"  # refusal messages to show at the top of the next page run
_roles_cache: dict[Path, tuple[tuple[int, int], RolesConfig]] = {}


def mode() -> str:
    """How this app lets people in: "signin", "open" or "local"."""
    value = os.environ.get(AUTH_ENV)
    if value in MODES:
        return value
    return SIGN_IN if _auth_section() else "local"  # started by `streamlit run` itself


def _auth_section() -> Mapping | None:
    try:
        section = st.secrets.get("auth")
    except Exception:  # no secrets file at all
        return None
    return section if isinstance(section, Mapping) else None


def _roles() -> RolesConfig:
    """The roles file, read again whenever it changed (AccessConfigError if it is broken)."""
    path = roles_file_from_env()
    if path is None:
        return RolesConfig()
    try:
        stat = path.stat()
    except OSError as error:
        raise AccessConfigError(f"roles file {path}: {error.strerror or error}") from None
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _roles_cache.get(path)
    if cached is None or cached[0] != stamp:
        cached = (stamp, load_roles(path))
        _roles_cache[path] = cached
    return cached[1]


def actor() -> Actor:
    """Who acts in this request, with the role they have now."""
    if mode() != SIGN_IN:
        return local_actor(via="app")
    user = st.user.to_dict()
    if not user.get("is_logged_in"):
        return Actor("(not signed in)", NO_ROLE, "app")
    name = identity_of(user)[:NAME_LENGTH] or "(no identity)"
    try:
        role = _roles().role_for(user)
    except AccessConfigError:
        role = NO_ROLE  # a broken roles file gives nobody anything (gate() says why)
    return Actor(name, role, "app")


def may(action: str) -> bool:
    """Whether the user may do `action` (the page hides what they may not)."""
    return actor().may(action)


def role_text(who: Actor) -> str:
    if who.role == LOCAL:
        return "every right (no sign-in)"
    return who.role if who.role in ROLES else "no role"


def needs(action: str, doing: str) -> str:
    """What a page says where it hides a control: `doing` needs which role."""
    from storage.access import PERMISSIONS, permission_of

    who = actor()
    return (f"{doing} needs the {PERMISSIONS[permission_of(action)]} role; you are signed in as "
            f"{who.name} ({role_text(who)}).")


def not_offered(actions) -> str:
    """What a page says under controls it does not draw for the user's role."""
    from storage.access import PERMISSIONS, permission_of

    who = actor()
    parts = ", ".join(f"{a} ({PERMISSIONS[permission_of(a)]})" for a in actions)
    return f"Signed in as {who.name} ({role_text(who)}): {parts} need the role in brackets."


def note_refusal(message: str) -> None:
    st.session_state.setdefault(_REFUSED, []).append(message)


def refusal_pending() -> bool:
    return bool(st.session_state.get(_REFUSED))


def _show_refusals() -> None:
    for message in st.session_state.pop(_REFUSED, []):
        st.error(plain(message), icon=":material/block:")


def _sign_in_page() -> None:
    st.title("Mpipe")
    st.write("This team server signs you in before you see its schedules and runs.")
    names = providers(_auth_section() or {})
    for name in names:
        label = "Sign in" if name is None or len(names) == 1 else f"Sign in with {name}"
        if st.button(label, key=f"auth.login.{name or 'default'}", type="primary"):
            if name is None:
                st.login()  # the provider written in [auth] itself
            else:
                st.login(name)


def gate() -> None:
    """Run first on every page: the sign-in page (and nothing else) until the user
    signs in; who they are and a sign-out button; the banner of an app served
    without sign-in; refusals of the last click."""
    current = mode()
    if current == OPEN:
        st.warning("Sign-in is off (mpipe app --no-auth): anyone who can reach this app can do everything "
                   "here: change and archive the library, import, launch and cancel runs.",
                   icon=":material/lock_open:")
    if current == SIGN_IN:
        if _auth_section() is None:
            st.error("This app was started with sign-in, but Streamlit finds no [auth] settings "
                     "(.streamlit/secrets.toml, or mpipe app --auth FILE).")
            st.stop()
        if not st.user.is_logged_in:
            _sign_in_page()
            st.stop()
        who = actor()
        with st.sidebar:
            st.caption(plain(f"Signed in as {who.name} · {role_text(who)}"))
            if st.button("Sign out", key="auth.logout"):
                st.logout()
        if who.role == NO_ROLE:
            try:
                _roles()
            except AccessConfigError as error:
                st.error(plain(f"The server's roles file cannot be used ({error.message}); until its operator "
                               f"fixes it, nobody has a role."))
            else:
                st.info(plain(f"You are signed in as {who.name}, but you have no role on this server. "
                              f"Ask its operator for one (viewer, designer or operator)."))
            st.stop()
    _show_refusals()
