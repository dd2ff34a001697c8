"""Sign-in in a real browser against a real OpenID provider: `mpipe app --auth
--roles` on a free port, `oidc_provider_mock` (a provider the test starts in a
thread; users set with PUT /users/{sub}), Playwright on Debian's chromium.

Two flows on one server: each role signs in, sees and does its part, and
signs out; a launch click that arrives after the operator was demoted to
viewer is refused, shown and audited.  The whole roles matrix is tested
where a browser adds nothing: test_app_auth.py (what each role is offered)
and tests/storage/test_storage_audit.py (what each role may write)."""
from __future__ import annotations

import json
import urllib.request
import warnings

import pytest
from app_helpers import served_app
from browser_helpers import WAIT_MS

with warnings.catch_warnings():
    # Importing Authlib puts an "always" filter for its own deprecation warnings in front of
    # pyproject's ignore; the mock provider then imports the deprecated `authlib.jose` (not ours).
    import authlib.deprecate  # noqa: F401

    warnings.filterwarnings("ignore", message="authlib.jose module is deprecated")
    from oidc_provider_mock import run_server_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.databases("sqlite")]

USERS = {  # subject -> ID-token claims; olga's role comes from the roles file
    "vera": {"email": "vera@example.org", "email_verified": True, "mpipe_roles": ["viewer"]},
    "dana": {"email": "dana@example.org", "email_verified": True, "mpipe_roles": ["designer"]},
    "olga": {"email": "olga@example.org", "email_verified": True},
}
ROLES = '[users]\n"olga@example.org" = "{role}"\n'


@pytest.fixture(scope="module")
def provider():
    with run_server_in_thread() as server:
        issuer = f"http://localhost:{server.server_port}"
        for sub, claims in USERS.items():
            request = urllib.request.Request(f"{issuer}/users/{sub}", data=json.dumps(claims).encode(),
                                             method="PUT", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 204
        yield issuer


@pytest.fixture(scope="module")
def team_server(provider, tmp_path_factory):
    """The app with sign-in and a roles file; yields (url, database, roles file)."""
    from storage import open_database, save_schedule

    folder = tmp_path_factory.mktemp("team")
    secrets = folder / "auth.toml"
    secrets.write_text(f'''[auth]
redirect_uri = "http://localhost:{{port}}/oauth2callback"
cookie_secret = "a-long-random-cookie-secret-for-the-test"
client_id = "mpipe"
client_secret = "mpipe-secret"
server_metadata_url = "{provider}/.well-known/openid-configuration"
''')
    roles = folder / "roles.toml"
    roles.write_text(ROLES.format(role="operator"))
    db_path = folder / "team.db"
    db = open_database(f"sqlite:///{db_path}")
    save_schedule(db, "shared", "1f1b(p=2, m=4)")
    with served_app(db_path, "--auth", str(secrets), "--roles", str(roles)) as (_, _, port, lines):
        assert any("Access: sign-in required (provider default" in line for line in lines), lines
        # Cookies are set for the redirect URI's host: browse the app under that name.
        yield f"http://localhost:{port}", db, roles
    db.close()


def _sign_in(browser, url: str, sub: str):
    context = browser.new_context(viewport={"width": 1400, "height": 1500})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(url)
    page.get_by_role("button", name="Sign in").click()
    page.locator("input[name=sub]").fill(sub)  # the provider's own form
    page.get_by_role("button", name="Authorize").click()
    page.get_by_text(f"Signed in as {USERS[sub]['email']}").wait_for()
    return page


def _sign_out(page, url: str) -> None:
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("button", name="End session").click()  # the provider's end-session page
    page.get_by_role("button", name="Sign in").wait_for()
    page.goto(url)  # the cookie is gone: a fresh visit is signed out too
    page.get_by_role("button", name="Sign in").wait_for()
    assert page.get_by_role("textbox", name="Term").count() == 0


def _open(page, title: str) -> None:
    """Another page through the sidebar (no reload: the session stays)."""
    page.get_by_role("link", name=title, exact=True).click()


def test_a_viewer_and_a_designer_sign_in_see_their_part_and_sign_out(browser, team_server):
    from storage import get_schedule, list_audit

    url, db, _ = team_server
    # A viewer reads everything and is offered no write.
    page = _sign_in(browser, url, "vera")
    page.get_by_text("· viewer").wait_for()
    page.get_by_text("Saving to the library needs the designer role; you are signed in as vera@example.org "
                     "(viewer).").wait_for()
    assert page.get_by_role("button", name="Save", exact=True).count() == 0
    _open(page, "Library")
    page.get_by_role("tab", name="Activity").wait_for()
    assert page.get_by_role("tab", name="Fork").count() == 0 and page.get_by_role("tab", name="Archive").count() == 0
    _sign_out(page, url)
    page.context.close()

    # A designer saves, as themselves; may fork, may not archive.
    page = _sign_in(browser, url, "dana")
    page.get_by_label("Name", exact=True).fill("zz-dana")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_text("Saved zz-dana@1").wait_for()
    assert get_schedule(db, "zz-dana").author == "dana@example.org"
    _open(page, "Library")
    page.get_by_role("tab", name="Fork").wait_for()
    assert page.get_by_role("tab", name="Archive").count() == 0
    page.context.close()
    assert [(e.actor, e.action, e.outcome) for e in list_audit(db) if e.via == "app"] == [
        ("dana@example.org", "save", "ok")]


def test_an_operator_launches_then_a_replayed_launch_after_a_demotion_is_refused_and_audited(
        browser, team_server):
    from storage import list_audit, list_runs

    url, db, roles = team_server
    page = _sign_in(browser, url, "olga")
    _open(page, "Runs")
    launch = page.get_by_role("button", name="Launch", exact=True)
    launch.click()
    page.get_by_text("Queued run #1 of shared@1").wait_for()
    [run] = list_runs(db)
    assert run.launched_by == "olga@example.org"
    roles.write_text(ROLES.format(role="viewer"))  # demoted while the form is on her screen
    try:
        launch.click()  # the same request again, now as a viewer
        page.get_by_text("refused: olga@example.org (viewer) may not launch runs; that needs the operator "
                         "role (shared@1)").wait_for()
        page.get_by_text("Launching runs needs the operator role").wait_for()
        assert page.get_by_role("button", name="Launch", exact=True).count() == 0
    finally:
        roles.write_text(ROLES.format(role="operator"))
    assert len(list_runs(db)) == 1
    assert [(e.actor, e.role, e.action, e.outcome) for e in list_audit(db, actions=("launch",))] == [
        ("olga@example.org", "viewer", "launch", "refused"), ("olga@example.org", "operator", "launch", "ok")]
    _sign_out(page, url)
    page.context.close()
