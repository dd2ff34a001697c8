"""The Plan page's Launch (issue 39 section 8): an operator queues the picked
row as a run of the row's term on its layout (saved as a schedule version whose
workload carries the layout), a viewer is not offered it, and the queued job,
run by a real `mpipe worker`, passes its gradient check."""
from __future__ import annotations

import subprocess
import sys

import pytest
from app_helpers import MAIN, REPO, TIMEOUT_S, button, errors, open_page, shown
from bounds import EVENT_S
from streamlit.testing.v1 import AppTest

from app.access_config import AUTH_ENV, ROLES_ENV
from mpipe_core.runs.layout import RunLayout
from storage import get_version, list_audit, list_runs, save_workload

pytestmark = pytest.mark.databases("sqlite")
AUTH = {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "a-cookie-secret-for-tests",
        "client_id": "mpipe", "client_secret": "secret",
        "server_metadata_url": "http://localhost:9/.well-known/openid-configuration"}
# The plan tests' tiny MLLM on one DGX A100 node: 4 devices plan to pp2 x dp2 with ZeRO-1.
TINY_MLLM = {"model": {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 128, "vocab": 1000, "ffn": 1024},
             "device": "a100", "cluster": "dgx-a100",
             "encoders": [{"name": "vision", "trainable": True,
                           "vit": {"hidden": 128, "layers": 2, "heads": 2, "patches_per_image": 16,
                                   "image_size": 64}}]}


@pytest.fixture
def roles(tmp_path, monkeypatch, db_url):
    path = tmp_path / "roles.toml"
    path.write_text('[users]\n"olga@example.org" = "operator"\n"vera@example.org" = "viewer"\n')
    monkeypatch.setenv(AUTH_ENV, "signin")
    monkeypatch.setenv(ROLES_ENV, str(path))


def _signed_in(email: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    at.secrets["auth"] = AUTH
    at.user = {"is_logged_in": True, "email": email, "sub": email.split("@")[0]}
    return at.run()


def _planned(at: AppTest) -> AppTest:
    """The Plan page with the tiny MLLM planned on 4 devices."""
    at = open_page(at, "plan")
    at.radio(key="plan.wl.source").set_value("Saved").run()
    at.number_input(key="plan.devices").set_value(4)
    at.number_input(key="plan.batch").set_value(8)
    at.selectbox(key="plan.cluster").select("dgx-a100")
    at.number_input(key="plan.top").set_value(3)
    at = button(at, "Plan").click().run()
    assert not at.exception and not errors(at), errors(at)
    return at


def test_an_operator_launches_the_row_and_a_viewer_is_not_offered_it(roles, db):
    save_workload(db, "tiny-mllm", TINY_MLLM)
    viewer = _planned(_signed_in("vera@example.org"))
    assert "Launch" not in {b.label for b in viewer.button}
    assert ("Launching a plan's row needs the operator role; you are signed in as vera@example.org (viewer)."
            in [shown(c.value) for c in viewer.caption])

    at = _planned(_signed_in("olga@example.org"))
    row = at.session_state["plan.result"][1].candidates[0]
    assert (row.layout.tp, row.layout.cp, row.layout.pp, row.layout.dp) == (1, 1, 2, 2)  # what the plan picks here
    button(at, "Launch").click().run()
    assert not at.exception and not errors(at), errors(at)
    [run] = list_runs(db)
    assert [shown(s.value) for s in at.success] == [f"Queued run #{run.id} of {run.ref} on 4 ranks: follow it on the "
                                             f"Runs page"]
    assert run.launched_by == "olga@example.org" and run.nproc == 4 and run.options == {"check_grads": True}
    version = get_version(db, run.ref)
    assert version.term == row.term
    parallel = version.workload["parallel"]
    assert RunLayout.from_parallel(parallel, version.summary["devices"]) == RunLayout(
        tp=1, cp=1, pp=2, dp=2, distributed_optimizer=row.parallel()["distributed_optimizer"])
    assert [(e.actor, e.action, e.outcome) for e in list_audit(db, actions=("launch",))] == [
        ("olga@example.org", "launch", "ok")]


@pytest.mark.slow
def test_the_launched_row_runs_on_the_worker_and_passes_its_gradient_check(db_url, db, tmp_path):
    save_workload(db, "tiny-mllm", TINY_MLLM)
    at = _planned(AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S).run())  # the local user: every right
    row = at.session_state["plan.result"][1].candidates[0]
    at.number_input(key="plan.launch_dp.0").set_value(1).run()  # one replica: two ranks, the test stays small
    button(at, "Launch").click().run()
    [run] = list_runs(db)
    assert run.nproc == 2 and get_version(db, run.ref).term == row.term
    worker = subprocess.run([sys.executable, "-m", "mpipe_cli.main", "worker", "--db", db_url, "--once",
                             "--poll", "0.2", "--run-root", str(tmp_path / "runs")],
                            cwd=REPO, capture_output=True, text=True, timeout=EVENT_S)
    assert worker.returncode == 0, worker.stdout + worker.stderr
    [done] = list_runs(db)
    assert done.status == "succeeded", f"{done.error}\n{done.log_tail}"
    assert "grad check PASS" in done.log_tail
