"""`mpipe app`'s sign-in options: serving beyond this machine without sign-in is
refused in one line naming --no-auth, bad sign-in and roles files are one-line
errors before anything starts, and the roles file decides who gets what."""
from __future__ import annotations

import argparse
import socket

import pytest
from app_helpers import start_app_process

from app.access_config import RolesConfig, configured_auth, identity_of, load_roles
from mpipe_cli.app_commands import access_settings, is_loopback
from mpipe_cli.main import main
from bounds import EVENT_S

REFUSED = ("error: --host {host} listens beyond this machine and sign-in is not configured, so anyone who "
           "reaches it could change the library and launch runs; configure sign-in (--auth FILE, or [auth] in "
           ".streamlit/secrets.toml), or pass --no-auth to allow it on purpose\n")
AUTH = '''[auth]
redirect_uri = "https://mpipe.example.org/oauth2callback"
cookie_secret = "a-long-random-secret"
client_id = "mpipe"
client_secret = "s3cret"
server_metadata_url = "https://id.example.org/.well-known/openid-configuration"
'''


@pytest.fixture(autouse=True)
def _no_secrets_around(tmp_path, monkeypatch):
    """No .streamlit/secrets.toml of the user's or of the checkout is found."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "mpipe.example.org"])
def test_binding_beyond_loopback_without_sign_in_is_refused_in_one_line(tmp_path, capsys, host):
    assert main(["app", "--host", host, "--no-worker", "--db", str(tmp_path / "a.db")]) == 2
    assert capsys.readouterr().err == REFUSED.format(host=host)
    assert not (tmp_path / "a.db").exists()  # refused before anything was opened or started


def test_loopback_addresses_are_this_machine_only():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.org", ""))


def _args(*argv: str) -> argparse.Namespace:
    return argparse.Namespace(**{"host": "127.0.0.1", "auth": None, "no_auth": False, "roles": None,
                                 **dict(zip(argv[::2], argv[1::2]))})


def test_how_the_app_lets_people_in(tmp_path):
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH)
    roles = tmp_path / "roles.toml"
    roles.write_text('[users]\n"olga@example.org" = "operator"\n')
    mode, env, extra, note = access_settings(_args())
    assert (mode, env, extra) == ("local", {"MPIPE_APP_AUTH": "local"}, [])
    mode, env, extra, note = access_settings(_args("host", "0.0.0.0", "auth", str(auth), "roles", str(roles)))
    assert mode == "signin" and extra == ["--secrets.files", str(auth)]
    assert env == {"MPIPE_APP_AUTH": "signin", "MPIPE_ROLES_FILE": str(roles)}
    assert note == f"sign-in required (provider default, from {auth}); roles from {roles}"
    mode, env, _, note = access_settings(_args("host", "0.0.0.0", "no_auth", True))
    assert mode == "open" and note.startswith("sign-in off (--no-auth)")
    # [auth] in .streamlit/secrets.toml of the current folder is Streamlit's own: found, nothing to pass.
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text(AUTH)
    mode, _, extra, _ = access_settings(_args("host", "0.0.0.0"))
    assert (mode, extra) == ("signin", [])


@pytest.mark.parametrize("text, message", [
    (None, "sign-in file {path}: No such file or directory"),
    ("x = ", "sign-in file {path}: not TOML (Invalid value (at end of document))"),
    ("[other]\na = 1\n", "sign-in file {path}: no [auth] table"),
    ('[auth]\nredirect_uri = "https://h/oauth2callback"\n', "sign-in file {path}: [auth] lacks cookie_secret"),
    (AUTH.replace("/oauth2callback", "/callback"),
     "sign-in file {path}: [auth] redirect_uri must end in /oauth2callback, not 'https://mpipe.example.org/callback'"),
    ('[auth]\nredirect_uri = "https://h/oauth2callback"\ncookie_secret = "s"\n',
     "sign-in file {path}: [auth] names no provider (give client_id, client_secret, server_metadata_url in "
     "[auth], or in a table such as [auth.google])"),
    ('[auth]\nredirect_uri = "https://h/oauth2callback"\ncookie_secret = "s"\n[auth.google]\nclient_id = "c"\n',
     "sign-in file {path}: [auth.google] lacks client_secret, server_metadata_url"),
])
def test_a_bad_sign_in_file_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "auth.toml"
    if text is not None:
        path.write_text(text)
    assert main(["app", "--auth", str(path), "--no-worker", "--db", str(tmp_path / "a.db")]) == 2
    assert capsys.readouterr().err == f"error: {message.format(path=path)}\n"


@pytest.mark.parametrize("text, message", [
    ('[users]\n"a@x" = "admin"\n', "roles file {path}: users.'a@x': unknown role 'admin' "
                                   "(choose from viewer, designer, operator, none)"),
    ('unknown = "root"\n', "roles file {path}: unknown: unknown role 'root' (choose from viewer, designer, "
                           "operator, none)"),
    ('groups = 1\n', "roles file {path}: unknown key 'groups' (keys: claim, unknown, users)"),
    ('claim = 3\n', 'roles file {path}: claim must be a text (the claim\'s name, or "" for none)'),
    ('users = "a"\n', 'roles file {path}: [users] must be a table of "identity" = "role"'),
])
def test_a_bad_roles_file_is_one_line(tmp_path, capsys, text, message):
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH)
    path = tmp_path / "roles.toml"
    path.write_text(text)
    assert main(["app", "--auth", str(auth), "--roles", str(path), "--no-worker", "--db", str(tmp_path / "a.db")]) == 2
    assert capsys.readouterr().err == f"error: {message.format(path=path)}\n"


def test_roles_need_sign_in(tmp_path, capsys):
    roles = tmp_path / "roles.toml"
    roles.write_text("")
    assert main(["app", "--roles", str(roles), "--no-worker"]) == 2
    assert capsys.readouterr().err == ("error: --roles needs sign-in: give --auth FILE, or an [auth] table in "
                                       ".streamlit/secrets.toml\n")
    assert main(["app", "--roles", str(roles), "--no-auth", "--no-worker"]) == 2
    assert capsys.readouterr().err == "error: --roles needs sign-in, which --no-auth turns off\n"
    with pytest.raises(SystemExit) as usage:
        main(["app", "--auth", str(roles), "--no-auth"])
    assert usage.value.code == 2
    assert "argument --no-auth: not allowed with argument --auth" in capsys.readouterr().err


def test_who_gets_which_role(tmp_path):
    path = tmp_path / "roles.toml"
    path.write_text('claim = "groups"\nunknown = "viewer"\n[users]\n"olga@example.org" = "operator"\n'
                    '"sub-123" = "designer"\n')
    roles = load_roles(path)
    assert roles.role_for({"email": "olga@example.org", "groups": ["viewer"]}) == "operator"  # the file wins
    assert roles.role_for({"email": "x@example.org", "sub": "sub-123"}) == "designer"  # by subject too
    assert roles.role_for({"email": "g@example.org", "groups": ["staff", "designer", "viewer"]}) == "designer"
    assert roles.role_for({"email": "g@example.org", "groups": "Operator"}) == "operator"
    assert roles.role_for({"email": "g@example.org", "groups": ["staff"]}) == "viewer"  # unknown
    assert roles.role_for({"email": "g@example.org", "mpipe_roles": ["operator"]}) == "viewer"  # not the claim
    default = RolesConfig()  # no roles file: the mpipe_roles claim, else no role at all
    assert default.role_for({"email": "a@b", "mpipe_roles": ["designer"]}) == "designer"
    assert default.role_for({"email": "a@b"}) == "none"
    assert load_roles(None) == default
    # An unverified email is not an identity: the subject is.
    assert identity_of({"email": "boss@example.org", "email_verified": False, "sub": "u1"}) == "u1"
    assert identity_of({"email": "boss@example.org", "sub": "u1"}) == "boss@example.org"
    assert roles.role_for({"email": "olga@example.org", "email_verified": False, "sub": "u9"}) == "viewer"
    path.write_text('[users]\n"olga@example.org" = "none"\n')
    assert load_roles(path).role_for({"email": "olga@example.org", "mpipe_roles": "operator"}) == "none"


def test_the_last_secrets_file_with_auth_is_the_one_streamlit_uses(tmp_path):
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text(AUTH)
    second.write_text('[other]\nx = 1\n')
    assert configured_auth([first, second])[0] == first
    second.write_text(AUTH.replace("mpipe.example.org", "other.example.org"))
    assert configured_auth([first, second])[0] == second
    assert configured_auth([tmp_path / "missing.toml"]) is None


@pytest.mark.slow
def test_no_auth_serves_every_interface_and_says_so(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, lines, ready = start_app_process(["--host", "0.0.0.0", "--no-auth", "--no-worker", "--port", str(port),
                                            "--db", str(tmp_path / "a.db")])
    try:
        assert ready.wait(EVENT_S), "".join(lines)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.2", port)) == 0  # another address of this machine
        text = "".join(lines)
        assert ("warning: --no-auth: listening on 0.0.0.0 without sign-in: anyone who can reach this machine "
                "may change the library and launch runs") in text
        assert "Access: sign-in off (--no-auth): anyone who reaches the app may do everything." in text
    finally:
        proc.terminate()
        proc.wait(timeout=EVENT_S)
