"""Who may change the library and the run queue: roles, the actions each
allows, and the one check every write makes before it writes.

Roles are nested: a designer may do all a viewer may, an operator all a
designer may.

    viewer     reads everything, changes nothing
    designer   + save (schedules and workloads), fork, tag, describe, import
    operator   + launch, cancel, archive (and restore), calibrate (and profile)

An `Actor` is who is acting and with which role.  The app signs people in and
gives each session its actor (`Database.acting_as`); the CLI and the Python
API act as the local user (`$MPIPE_USER`, else the login name) with every
right: on a shared database their boundary is what the database's own
permissions let their database user do.

Every write function of the storage layer calls `authorize` right before it
writes: a request for an action the actor's role does not allow is refused
with `PermissionDeniedError` and recorded in the audit trail as refused,
whatever the caller's interface showed.
"""
from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from storage.audit import record_refusal
from storage.errors import PermissionDeniedError
from storage.models import NAME_LENGTH

if TYPE_CHECKING:
    from storage.db import Database

ROLES = ("viewer", "designer", "operator")
NO_ROLE = "none"  # signed in, but no role on this server: reads nothing either
LOCAL = "local"  # the local user (CLI, Python API, the app without sign-in): every right
# Each permission, and the lowest role that has it.
PERMISSIONS = {
    "save": "designer", "fork": "designer", "tag": "designer", "describe": "designer", "import": "designer",
    "launch": "operator", "cancel": "operator", "archive": "operator", "calibrate": "operator",
}
# Audit actions whose permission is another's.
ACTION_PERMISSION = {"save-workload": "save", "restore": "archive", "profile": "calibrate",
                     "import-trace": "import"}
# What the refusal message says the actor asked to do.
_DOING = {
    "save": "save schedules", "save-workload": "save workloads", "fork": "fork schedules",
    "tag": "tag schedules", "describe": "describe schedules", "import": "import libraries",
    "launch": "launch runs", "cancel": "cancel runs", "archive": "archive schedules",
    "restore": "restore archived schedules", "calibrate": "calibrate workloads from runs",
    "profile": "profile models", "import-trace": "import traces",
}


def current_user() -> str:
    """Who is acting locally: $MPIPE_USER, else the login name."""
    user = os.environ.get("MPIPE_USER")
    if user:
        return user[:NAME_LENGTH]
    try:
        return getpass.getuser()[:NAME_LENGTH]
    except Exception:  # no login name (some containers)
        return "unknown"


def permission_of(action: str) -> str:
    """The permission an audit action needs ("restore" needs "archive")."""
    permission = ACTION_PERMISSION.get(action, action)
    if permission not in PERMISSIONS:
        raise ValueError(f"unknown action {action!r}")
    return permission


def role_allows(role: str, action: str) -> bool:
    """Whether `role` may do `action` (LOCAL may do everything, NO_ROLE nothing)."""
    permission = permission_of(action)
    if role == LOCAL:
        return True
    if role not in ROLES:
        return False
    return ROLES.index(role) >= ROLES.index(PERMISSIONS[permission])


def highest_role(roles) -> str:
    """The most capable of `roles` (names other than the three are ignored); NO_ROLE if none."""
    known = [r for r in roles if r in ROLES]
    return max(known, key=ROLES.index) if known else NO_ROLE


@dataclass(frozen=True)
class Actor:
    """Who acts, with which role, through which interface ("app" or "cli")."""

    name: str
    role: str = LOCAL
    via: str = "cli"

    @property
    def signed_in(self) -> bool:
        """A person the app signed in (their name is the author of what they write)."""
        return self.role != LOCAL

    def may(self, action: str) -> bool:
        return role_allows(self.role, action)


def local_actor(via: str = "cli") -> Actor:
    return Actor(current_user(), LOCAL, via)


def acting(db: Database, actor: Actor | None = None) -> Actor:
    """The actor of a write: the one given, else the database handle's, else the local user."""
    return actor or getattr(db, "actor", None) or local_actor()


def author_of(actor: Actor, author: str | None) -> str:
    """The author recorded on what `actor` writes: a signed-in person is always
    themselves; the local user may name another author (`--author`)."""
    if actor.signed_in:
        return actor.name
    return author or actor.name


def authorize(db: Database, action: str, target: str, *, actor: Actor | None = None,
              schedule: str | None = None, run_id: int | None = None,
              details: dict[str, Any] | None = None) -> Actor:
    """The actor, if its role allows `action`; otherwise the refusal is recorded in
    the audit trail (its own transaction: nothing else is written) and raised."""
    who = acting(db, actor)
    if who.may(action):
        return who
    record_refusal(db, who, action, target, schedule=schedule, run_id=run_id, details=details)
    needed = PERMISSIONS[permission_of(action)]
    raise PermissionDeniedError(
        f"refused: {who.name} ({who.role if who.role in ROLES else 'no role'}) may not "
        f"{_DOING.get(action, action)}; that needs the {needed} role ({target})")
