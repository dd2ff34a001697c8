"""Own models on the Runs page: the model picker fills a run's options as
`mpipe runs enqueue -o` would, offers only the server's registered models (no
free text box), refuses what `runs enqueue` refuses (a hostile model name typed
into Options runs nothing), and profiles a registered model into a saved
workload (the CLI in a subprocess: torch never enters the app's process)."""
from __future__ import annotations

import sys

import pytest
from app_helpers import button, errors, open_page, shown, start_app
from hostile_models import Sandbox, allow_list, not_registered

from mpipe_core.api import evaluate
from mpipe_core.runs.model_spec import BatchShape, ModelSpec, spec_from_options
from storage import get_workload, list_runs, save_schedule

BOTH = pytest.mark.databases("sqlite", "postgresql")
TERM = "1f1b(p=2, m=4)"


def _runs_page(db, model_kind: str):
    save_schedule(db, "t2", TERM)  # no workload: an own model runs on its own structure
    at = open_page(start_app(), "runs")
    at.radio(key="runs.model.kind").set_value(model_kind).run()
    return at


@pytest.mark.slow
def test_picking_hf_llava_tiny_queues_the_options_spec_from_options_reads(db, db_url):
    at = _runs_page(db, "HuggingFace")
    at.selectbox(key="runs.model.hf").set_value("hf:llava")
    at.selectbox(key="runs.model.hf_config").set_value("tiny")
    at.number_input(key="runs.model.seq_len").set_value(12).run()
    button(at, "Launch").click().run()
    assert not at.exception and not errors(at), errors(at)
    [run] = list_runs(db)
    assert run.options == {"model": "hf:llava", "model_config": "tiny", "microbatch_size": 1, "seq_len": 12,
                           "images": 1}
    assert spec_from_options(run.options) == ModelSpec("hf:llava", "tiny", BatchShape(text_len=12))
    assert "Trains own model hf:llava (tiny): microbatches of 1 sample(s), 12 text tokens and 1 image(s) each." \
        in [shown(c.value) for c in at.caption]


REGISTERED = {"team-mllm": "examples.tiny_mllm:build", "broken": "examples.tiny_mllm:nosuch"}


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """The server's allow-list (entry points off: the page shows exactly these), with a
    checkpoint root."""
    root = tmp_path / "ckpts"
    root.mkdir()
    monkeypatch.setenv("MPIPE_MODELS", str(allow_list(tmp_path, REGISTERED, root=str(root))))
    return root


def test_the_picker_offers_the_registered_models_not_a_text_box(db, db_url, registered):
    at = _runs_page(db, "Registered model")
    assert at.radio(key="runs.model.kind").options == [
        "Sized from the workload", "Built-in preset", "HuggingFace", "Local checkpoint", "Registered model"]
    assert at.selectbox(key="runs.model.registered").options == ["broken", "team-mllm"]
    assert [t.key for t in at.text_input if t.key.startswith("runs.model.")] == ["runs.model.config"]
    at.selectbox(key="runs.model.registered").set_value("team-mllm").run()
    assert "Trains own model team-mllm: microbatches of 1 sample(s), 8 text tokens and 1 image(s) each." \
        in [shown(c.value) for c in at.caption]


@pytest.mark.slow
def test_launching_a_registered_model_queues_it_by_name(db, db_url, registered):
    at = _runs_page(db, "Registered model")
    at.selectbox(key="runs.model.registered").set_value("team-mllm").run()
    button(at, "Launch").click().run()
    assert not at.exception and not errors(at), errors(at)
    [run] = list_runs(db)
    assert run.options == {"model": "team-mllm", "microbatch_size": 1, "seq_len": 8, "images": 1}


@BOTH
def test_hostile_model_names_are_refused_and_run_nothing(db, db_url, registered, tmp_path, monkeypatch):
    sandbox = Sandbox(tmp_path / "sandbox")
    monkeypatch.syspath_prepend(sandbox.pythonpath)  # so that importing mpipe_evil would work
    at = _runs_page(db, "Sized from the workload")
    for model, config in sandbox.cases():
        typed = f"model={model}" + (f", model_config={config}" if config and "," not in config else "")
        at.text_input(key="runs.options").input(typed).run()
        button(at, "Launch").click().run()
        assert not at.exception
        assert errors(at) == [not_registered(model, "broken, team-mllm", str(registered))], model
    outside = tmp_path / "outside"
    outside.mkdir()
    (registered / "link").symlink_to(outside)
    at.text_input(key="runs.options").input("").run()
    at.radio(key="runs.model.kind").set_value("Local checkpoint").run()
    for path, why in [(outside, ""), (registered / "link", f" (it resolves to {outside})")]:
        at.text_input(key="runs.model.path").input(str(path)).run()
        button(at, "Launch").click().run()
        assert errors(at) == [f"run option model: hf:{path}: not under the checkpoint root {registered}{why}"]
        at.text_input(key="runs.profile_name").input("never-saved").run()
        button(at, "Profile this model").click().run()  # profiling names a model too
        assert errors(at) == [f"run option model: hf:{path}: not under the checkpoint root {registered}{why}"]
    # The Options field and the picker may not both name the model.
    at.text_input(key="runs.options").input("model=tiny").run()
    button(at, "Launch").click().run()
    assert errors(at) == ["option model is given in Options and by the model picker; remove it from Options"]
    assert list_runs(db) == []
    assert sandbox.evidence() == []
    assert "mpipe_evil" not in sys.modules


def test_profiling_a_registered_model_saves_a_workload_evaluate_accepts(db, db_url, registered):
    at = _runs_page(db, "Registered model")
    at.selectbox(key="runs.model.registered").set_value("team-mllm")
    at.text_input(key="runs.profile_name").input("bad name!").run()
    button(at, "Profile this model").click().run()
    assert errors(at) and errors(at)[0].startswith("invalid workload name")
    at.text_input(key="runs.profile_name").input("tiny-mllm-cpu").run()
    button(at, "Profile this model").click().run()
    assert not at.exception and not errors(at), errors(at)
    assert [shown(s.value) for s in at.success] == [
        "Saved workload tiny-mllm-cpu@1: pick saved:tiny-mllm-cpu in the Designer's saved workloads"]
    progress = at.code[0].value  # the profile's stderr lines, streamed while it ran
    assert "profiling team-mllm on cpu" in progress and "wrote " in progress
    body = get_workload(db, "tiny-mllm-cpu").body
    assert body["origin"]["model"]["model"] == "team-mllm"
    assert body["llm"]["layers"] == 4  # examples.tiny_mllm.LAYERS, as measured
    ev = evaluate(TERM, body)
    assert ev.workload.llm.layers == 4 and ev.timeline.makespan > 0


def test_a_failing_profile_shows_its_error_line(db, db_url, registered):
    at = _runs_page(db, "Registered model")
    at.selectbox(key="runs.model.registered").set_value("broken")
    at.text_input(key="runs.profile_name").input("never-saved").run()
    button(at, "Profile this model").click().run()
    assert not at.exception
    assert errors(at) == ["model broken (examples.tiny_mllm:nosuch): module 'examples.tiny_mllm' has no "
                          "callable 'nosuch'"]
    assert not at.success


@pytest.mark.slow
def test_an_own_model_launch_by_a_signed_in_operator_is_theirs_in_the_audit_trail(db, db_url, registered, tmp_path,
                                                                                  monkeypatch):
    # The model is built and checked in a subprocess; the run is queued in the app's process
    # under the session's actor, so storage's check and audit row are the operator's, not
    # the local user's (role local, via cli) a queuing subprocess would record.
    from app_helpers import MAIN, TIMEOUT_S
    from streamlit.testing.v1 import AppTest
    from test_app_auth import AUTH

    from app.access_config import AUTH_ENV, ROLES_ENV
    from storage import list_audit

    roles = tmp_path / "roles.toml"
    roles.write_text('[users]\n"olga@example.org" = "operator"\n')
    monkeypatch.setenv(AUTH_ENV, "signin")
    monkeypatch.setenv(ROLES_ENV, str(roles))
    save_schedule(db, "t2", TERM)
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT_S)
    at.secrets["auth"] = AUTH
    at.user = {"is_logged_in": True, "email": "olga@example.org", "sub": "olga"}
    at = open_page(at.run(), "runs")
    at.radio(key="runs.model.kind").set_value("Registered model").run()
    # A model that cannot be built is refused with its one line, and nothing is queued.
    at.selectbox(key="runs.model.registered").set_value("broken").run()
    button(at, "Launch").click().run()
    assert not at.exception
    assert errors(at) == ["model broken (examples.tiny_mllm:nosuch): module 'examples.tiny_mllm' has no "
                          "callable 'nosuch'"]
    assert list_runs(db) == [] and list_audit(db, actions=("launch",)) == []
    at.selectbox(key="runs.model.registered").set_value("team-mllm").run()
    button(at, "Launch").click().run()
    assert not at.exception and not errors(at), errors(at)
    [run] = list_runs(db)
    assert run.options == {"model": "team-mllm", "microbatch_size": 1, "seq_len": 8, "images": 1}
    assert run.launched_by == "olga@example.org"
    [entry] = list_audit(db, actions=("launch",))
    assert (entry.actor, entry.role, entry.via, entry.target, entry.outcome, entry.run_id) == (
        "olga@example.org", "operator", "app", f"run {run.id}", "ok", run.id)
