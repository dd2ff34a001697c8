"""What an operator configures for sign-in and roles, read and checked without
Streamlit, so `mpipe app` refuses a bad file in one line before it starts.

Sign-in is Streamlit's OpenID Connect (`st.login`): an `[auth]` table in
`.streamlit/secrets.toml` (in the current folder or the home folder, where
Streamlit looks), or in the file `mpipe app --auth FILE` names.

Roles come from the roles file (`mpipe app --roles FILE`)::

    claim = "mpipe_roles"        # an ID-token claim naming roles (default "mpipe_roles"; "" for none)
    unknown = "none"             # a signed-in user named nowhere: "none" (default) or a role

    [users]                      # by email or subject; this wins over the claim
    "olga@example.org" = "operator"
    "dan@example.org" = "designer"
    "left-the-team@example.org" = "none"

A user's role is the one `[users]` gives them, else the highest role the
claim names (a text or a list; other values are ignored), else `unknown`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mpipe_core.errors import MpipeError
from storage.access import NO_ROLE, ROLES, highest_role

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

AUTH_ENV = "MPIPE_APP_AUTH"  # how the app was started: one of MODES (set by `mpipe app`)
ROLES_ENV = "MPIPE_ROLES_FILE"
SIGN_IN, OPEN, LOCAL = "signin", "open", "local"
MODES = (SIGN_IN, OPEN, LOCAL)
DEFAULT_CLAIM = "mpipe_roles"
PROVIDER_KEYS = ("client_id", "client_secret", "server_metadata_url")
ROLES_FILE_KEYS = ("claim", "unknown", "users")
MAX_FILE_BYTES = 1 << 20


class AccessConfigError(MpipeError):
    """A sign-in or roles file that cannot be used."""


def default_secrets_files() -> list[Path]:
    """Where Streamlit reads secrets by default, in its order (later ones win)."""
    return [Path.home() / ".streamlit" / "secrets.toml", Path.cwd() / ".streamlit" / "secrets.toml"]


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise AccessConfigError(f"{what} {path}: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise AccessConfigError(f"{what} {path}: larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise AccessConfigError(f"{what} {path}: not TOML ({error})") from None


# --- sign-in ([auth]) -----------------------------------------------------------------------

def providers(auth: Mapping[str, Any]) -> list[str | None]:
    """The providers an [auth] table configures: None for the one written in [auth]
    itself, then each named table ([auth.google], ...)."""
    named = [k for k, v in auth.items() if isinstance(v, Mapping)]
    return ([None] if "client_id" in auth else []) + sorted(named)


def check_auth_section(auth: Any, where: str) -> list[str | None]:
    """Refuse an [auth] table Streamlit could not sign anyone in with; its providers."""
    if not isinstance(auth, Mapping):
        raise AccessConfigError(f"{where}: [auth] must be a table")
    missing = [k for k in ("redirect_uri", "cookie_secret") if not isinstance(auth.get(k), str) or not auth[k]]
    if missing:
        raise AccessConfigError(f"{where}: [auth] lacks {' and '.join(missing)}")
    if not auth["redirect_uri"].endswith("/oauth2callback"):
        raise AccessConfigError(f"{where}: [auth] redirect_uri must end in /oauth2callback, "
                                f"not {auth['redirect_uri'][:80]!r}")
    found = providers(auth)
    if not found:
        raise AccessConfigError(f"{where}: [auth] names no provider (give {', '.join(PROVIDER_KEYS)} "
                                f"in [auth], or in a table such as [auth.google])")
    for name in found:
        table = auth if name is None else auth[name]
        lacking = [k for k in PROVIDER_KEYS if not isinstance(table.get(k), str) or not table[k]]
        if lacking:
            raise AccessConfigError(f"{where}: [{'auth' if name is None else 'auth.' + name}] lacks "
                                    f"{', '.join(lacking)}")
    return found


def read_auth_file(path: Path) -> dict[str, Any]:
    """The checked [auth] table of the file `mpipe app --auth` names."""
    doc = _read_toml(path, "sign-in file")
    if "auth" not in doc:
        raise AccessConfigError(f"sign-in file {path}: no [auth] table")
    check_auth_section(doc["auth"], f"sign-in file {path}")
    return doc["auth"]


def configured_auth(files: list[Path] | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The secrets file among `files` (default: Streamlit's) whose [auth] Streamlit
    would use (the last one that has it), checked; None when none has [auth]."""
    found = None
    for path in files if files is not None else default_secrets_files():
        if path.is_file():
            doc = _read_toml(path, "secrets file")
            if "auth" in doc:
                found = path, doc["auth"]
    if found is not None:
        check_auth_section(found[1], f"secrets file {found[0]}")
    return found


# --- roles ----------------------------------------------------------------------------------

def _role_name(value: Any, where: str, *, none_ok: bool = False) -> str:
    choices = (*ROLES, NO_ROLE) if none_ok else ROLES
    if not isinstance(value, str) or value not in choices:
        raise AccessConfigError(f"{where}: unknown role {str(value)[:40]!r} (choose from {', '.join(choices)})")
    return value


@dataclass(frozen=True)
class RolesConfig:
    claim: str = DEFAULT_CLAIM
    unknown: str = NO_ROLE
    users: dict[str, str] = field(default_factory=dict)

    def role_for(self, user: Mapping[str, Any]) -> str:
        """The role of a signed-in user with these ID-token claims."""
        for key in (identity_of(user), user.get("sub")):
            if isinstance(key, str) and key in self.users:
                return self.users[key]
        if self.claim:
            value = user.get(self.claim)
            values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
            role = highest_role(v.strip().lower() for v in values if isinstance(v, str))
            if role != NO_ROLE:
                return role
        return self.unknown


def identity_of(user: Mapping[str, Any]) -> str:
    """Who a signed-in user is: their email (unless the provider says it is not
    verified), else their subject."""
    email = user.get("email")
    if isinstance(email, str) and email and user.get("email_verified") is not False:
        return email
    return str(user.get("sub") or "")


def load_roles(path: Path | None) -> RolesConfig:
    """The roles file, checked (no file: everyone gets what the claim says, else no role)."""
    if path is None:
        return RolesConfig()
    where = f"roles file {path}"
    doc = _read_toml(path, "roles file")
    unknown_keys = sorted(set(doc) - set(ROLES_FILE_KEYS))
    if unknown_keys:
        raise AccessConfigError(f"{where}: unknown key {unknown_keys[0]!r} (keys: {', '.join(ROLES_FILE_KEYS)})")
    claim = doc.get("claim", DEFAULT_CLAIM)
    if not isinstance(claim, str):
        raise AccessConfigError(f"{where}: claim must be a text (the claim's name, or \"\" for none)")
    unknown = _role_name(doc.get("unknown", NO_ROLE), f"{where}: unknown", none_ok=True)
    users = doc.get("users", {})
    if not isinstance(users, Mapping):
        raise AccessConfigError(f"{where}: [users] must be a table of \"identity\" = \"role\"")
    # "none" in [users] locks one person out at once, whatever their claim says.
    return RolesConfig(claim, unknown, {str(k): _role_name(v, f"{where}: users.{k!r}", none_ok=True)
                                        for k, v in users.items()})


def roles_file_from_env() -> Path | None:
    value = os.environ.get(ROLES_ENV)
    return Path(value) if value else None
