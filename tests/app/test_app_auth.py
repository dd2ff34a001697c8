"""Sign-in and roles in the app (AppTest, signed in as Streamlit would after
`st.login`): the sign-in page, what each role is offered, that a click arriving
after the role changed is refused, shown and audited, the author of a
signed-in user's writes, and the banner of an app served without sign-in.
The same flows against a real OpenID provider in a browser:
test_app_auth_browser.py."""
from __future__ import annotations

import pytest
from app_helpers import MAIN, TIMEOUT_S, button, errors, open_page, shown
from streamlit.testing.v1 import AppTest

from app.access_config import AUTH_ENV, ROLES_ENV
from mpipe_core.api import evaluate
from storage import (
    add_timings,
    claim_next_run,
    enqueue,
    finish_run,
    get_schedule,
    history,
    list_audit,
    list_runs,
    save_schedule,
)

AUTH = {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "a-cookie-secret-for-tests",
        "client_id": "mpipe", "client_secret": "secret",
        "server_metadata_url": "http://localhost:9/.well-known/openid-configuration"}
pytestmark = pytest.mark.databases("sqlite")
BOTH = pytest.mark.databases("sqlite", "postgresql")
PAGES = ("designer", "before_after", "compare", "tune", "library", "runs")
TERM = "1f1b(p=2, m=4)"


@pytest.fixture
def roles_file(tmp_path, monkeypatch, db_url):
    path = tmp_path / "roles.toml"
    path.write_text('[users]\n"olga@example.org" = "operator"\n')
    monkeypatch.setenv(AUTH_ENV, "signin")
    monkeypatch.setenv(ROLES_ENV, str(path))
    return path


def signed_in(user: dict | None, page: str | None = None) -> AppTest:
    """The app as a browser signed in with these ID-token claims sees it (None: not signed in)."""
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    at.secrets["auth"] = AUTH
    at.user = {"is_logged_in": False} if user is None else {"is_logged_in": True, **user}
    at.run()
    return open_page(at, page) if page else at


def viewer(page=None):
    return signed_in({"email": "vera@example.org", "sub": "vera", "mpipe_roles": ["viewer"]}, page)


def designer(page=None):
    return signed_in({"email": "dana@example.org", "sub": "dana", "mpipe_roles": "designer"}, page)


def operator(page=None):
    return signed_in({"email": "olga@example.org", "sub": "olga"}, page)  # by the roles file


def _trails(at) -> list:
    """The audit tables of the page, in order (each a DataFrame)."""
    return [d.value for d in at.dataframe if "outcome" in d.value.columns and "who" in d.value.columns]


def _labels(at) -> set[str]:
    return {b.label for b in at.button} | {t.label for t in at.tabs}


def _finished_and_queued_runs(db):
    save_schedule(db, "s", TERM)
    done = enqueue(db, "s")
    claim_next_run(db, "w", 60)
    add_timings(db, done.id, evaluate(TERM).timeline.records())
    finish_run(db, done.id, "w", "succeeded", exit_code=0)
    return done, enqueue(db, "s")


def test_nothing_but_the_sign_in_page_until_signed_in(roles_file):
    at = signed_in(None)
    assert not at.exception
    assert [t.value for t in at.title] == ["Mpipe"]
    assert [b.label for b in at.button] == ["Sign in"]
    assert not at.text_area and not at.dataframe  # no Designer, no library


def test_a_signed_in_user_without_a_role_sees_nothing_and_a_broken_roles_file_locks_everyone_out(roles_file):
    at = signed_in({"email": "eve@example.org", "sub": "eve"}, None)
    assert [shown(i.value) for i in at.info] == [
        "You are signed in as eve@example.org, but you have no role on this server. Ask its operator for one "
        "(viewer, designer or operator)."]
    assert not at.text_area and [b.label for b in at.button] == ["Sign out"]
    roles_file.write_text('[users]\n"olga@example.org" = "admin"\n')
    at = operator()
    assert errors(at) == [f"The server's roles file cannot be used (roles file {roles_file}: users.'olga@example.org': "
                          f"unknown role 'admin' (choose from viewer, designer, operator, none)); until its operator "
                          f"fixes it, nobody has a role."]
    assert not at.text_area


# What each role is offered, by the control that does it (the matrix of docs/team-server.md).
OFFERED = {
    "viewer": set(),
    "designer": {"save", "fork", "tag", "describe", "import"},
    "operator": {"save", "fork", "tag", "describe", "import", "launch", "cancel", "archive", "calibrate"},
}


@pytest.mark.parametrize("role", list(OFFERED))
def test_each_role_is_offered_exactly_its_controls(roles_file, db, role):
    done, queued = _finished_and_queued_runs(db)
    sign_in = {"viewer": viewer, "designer": designer, "operator": operator}[role]
    offered = set()
    at = sign_in("designer")
    assert f"Signed in as {role[0]}" in shown(at.sidebar.caption[0].value) and role in at.sidebar.caption[0].value
    offered |= {"save"} & {b.label.lower() for b in at.button}
    at = open_page(at, "library")
    labels = _labels(at)
    offered |= {action for label, action in (("Fork", "fork"), ("Tags", "tag"), ("Description", "describe"),
                                             ("Archive", "archive")) if label in labels}
    offered |= {"import"} if at.get("file_uploader") else set()
    assert "Activity" in labels  # the schedule's trail: everyone reads it
    at = open_page(at, "runs")
    assert at.selectbox(key="runs.selected").value == queued.id
    offered |= {"launch"} if "Launch" in _labels(at) else set()
    offered |= {"cancel"} if "Cancel this run" in _labels(at) else set()
    at.selectbox(key="runs.selected").set_value(done.id).run()
    offered |= {"calibrate"} if "Calibrate" in _labels(at) else set()
    assert not at.exception
    assert offered == OFFERED[role]


@BOTH
def test_a_launch_click_that_arrives_after_the_role_changed_is_refused_shown_and_audited(roles_file, db):
    save_schedule(db, "s", TERM)
    at = operator("runs")
    assert "Launch" in _labels(at)
    roles_file.write_text('[users]\n"olga@example.org" = "viewer"\n')  # the operator demotes olga meanwhile
    button(at, "Launch").click().run()
    assert not at.exception
    message = "refused: olga@example.org (viewer) may not launch runs; that needs the operator role (s@1)"
    assert errors(at) == [message]
    assert list_runs(db) == []
    [entry] = list_audit(db, actions=("launch",))
    assert (entry.actor, entry.role, entry.via, entry.target, entry.outcome) == (
        "olga@example.org", "viewer", "app", "s@1", "refused")
    # The form is gone; the page says why.
    assert "Launch" not in _labels(at)
    assert any("Launching runs needs the operator role; you are signed in as olga@example.org (viewer)."
               == shown(c.value) for c in at.caption)


def _a_refused_click_and_its_replay() -> None:
    from app import auth, widgets

    for _ in range(2):  # the click, then Streamlit's replay of it (a fragment's timer preempted its run)
        widgets._check_click("launch", "s@1", "s", None)
    auth.gate()


def test_a_refused_click_that_streamlit_replays_is_recorded_and_shown_once(roles_file, db):
    # Seen in a browser on a loaded machine: one click on Launch after a demotion, while the Runs
    # page's live fragment ticked every second, gave two refusals 0.87 s apart, shown twice.
    save_schedule(db, "s", TERM)
    roles_file.write_text('[users]\n"olga@example.org" = "viewer"\n')
    at = AppTest.from_function(_a_refused_click_and_its_replay, default_timeout=TIMEOUT_S)
    at.secrets["auth"] = AUTH
    at.user = {"is_logged_in": True, "email": "olga@example.org", "sub": "olga"}
    at.run()
    assert not at.exception
    assert errors(at) == ["refused: olga@example.org (viewer) may not launch runs; that needs the operator role (s@1)"]
    assert [(e.role, e.outcome) for e in list_audit(db, actions=("launch",))] == [("viewer", "refused")]


def test_a_cancel_click_after_a_demotion_is_refused_inside_the_live_run_view(roles_file, db):
    save_schedule(db, "s", TERM)
    run = enqueue(db, "s")
    at = operator("runs")
    roles_file.write_text('[users]\n"olga@example.org" = "designer"\n')
    button(at, "Cancel this run").click().run()
    assert errors(at) == [f"refused: olga@example.org (designer) may not cancel runs; that needs the operator role "
                          f"(run {run.id})"]
    assert list_runs(db)[0].status == "queued"
    assert [(e.action, e.outcome, e.run_id) for e in list_audit(db, run_id=run.id)] == [
        ("cancel", "refused", run.id), ("launch", "ok", run.id)]


def test_what_a_signed_in_user_writes_is_theirs_and_shows_in_the_trail(roles_file, db, monkeypatch):
    monkeypatch.setenv("MPIPE_USER", "the-server-account")
    at = designer()
    assert "Author (default: your login)" not in [t.label for t in at.text_input]
    at.text_input(key="designer.save_name").input("mine")
    button(at, "Save").click().run()
    assert not at.exception
    assert history(db, "mine")[0].author == get_schedule(db, "mine").author == "dana@example.org"
    at = open_page(at, "library")
    activity = _trails(at)[0]  # the schedule's Activity tab
    assert list(activity["who"]) == ["dana@example.org"] and list(activity["action"]) == ["save"]
    assert list(activity["role"]) == ["designer"] and list(activity["outcome"]) == ["ok"]
    # A designer forks through the page: allowed, and recorded.
    at.text_input(key="lib.fork_name").input("mine-2")
    button(at, "Fork").click().run()
    assert [e.action for e in list_audit(db, user="dana@example.org")] == ["fork", "save"]
    assert history(db, "mine-2")[0].author == "dana@example.org"


def test_an_operator_launch_from_the_page_is_theirs(roles_file, db):
    save_schedule(db, "s", TERM)
    at = operator("runs")
    button(at, "Launch").click().run()
    [run] = list_runs(db)
    assert run.launched_by == "olga@example.org"
    recent = _trails(at)[-1]  # "Recent activity on runs", at the bottom
    assert list(recent["who"]) == ["olga@example.org"] and list(recent["target"]) == [f"run {run.id}"]


def test_without_sign_in_every_page_says_anyone_may_do_everything(db, monkeypatch):
    monkeypatch.setenv(AUTH_ENV, "open")
    save_schedule(db, "s", TERM)
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S).run()
    banner = ("Sign-in is off (mpipe app --no-auth): anyone who can reach this app can do everything here: "
              "change and archive the library, import, launch and cancel runs.")
    for page in PAGES:
        at = open_page(at, page)
        assert not at.exception, page
        assert [w.value for w in at.warning][:1] == [banner], page
    assert {"Launch", "Fork", "Archive s"} <= _labels(at) | _labels(open_page(at, "library"))  # every right


def test_the_local_single_user_app_keeps_every_right_and_shows_no_banner(db, monkeypatch):
    monkeypatch.setenv(AUTH_ENV, "local")
    monkeypatch.setenv("MPIPE_USER", "me")
    save_schedule(db, "s", TERM)
    at = open_page(AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S).run(), "library")
    assert not at.warning and {"Fork", "Tags", "Description", "Archive"} <= _labels(at)
    button(at, "Archive s").click().run()
    [entry] = list_audit(db, actions=("archive",))
    assert (entry.actor, entry.role, entry.via) == ("me", "local", "app")
