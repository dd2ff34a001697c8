"""The model registry: what a queued run may name (`admit`), read from installed
`mpipe.models` entry points and the operator's allow-list without importing any
factory, and local checkpoints only under the checkpoint root (symlinks and `..`
resolved first)."""
from __future__ import annotations

import os
import re
import sys

import pytest
from hostile_models import Sandbox, allow_list, installed_package, not_registered

from mpipe_core.errors import MpipeError
from mpipe_core.runs.model_registry import ModelNotAllowed, load_registry
from mpipe_core.runs.run_options import RunOptionError, check_run_options

NOISY = "open({marker!r}, 'w').close()\n\ndef build(config, shape):\n    raise SystemExit('called')\n"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """An installed package with three entry points, one of them badly named; importing its
    module would leave a marker."""
    marker = tmp_path / "imported"
    site = installed_package(tmp_path / "site", {"noisy": NOISY.format(marker=str(marker))},
                             {"team-mllm": "mpipe_testmodels.noisy:build", "tiny": "mpipe_testmodels.noisy:build",
                              "other": "mpipe_testmodels.noisy:other"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("MPIPE_MODELS", raising=False)
    return marker


def test_entry_points_are_registered_without_importing_anything(installed):
    registry = load_registry()
    assert registry.factory_of("team-mllm") == "mpipe_testmodels.noisy:build"
    assert registry.models["team-mllm"].source == "entry point of mpipe-testmodels 1.0"
    assert registry.factory_of("other") == "mpipe_testmodels.noisy:other"
    assert "tiny" not in registry.models  # a preset's name cannot be taken
    assert "tiny (entry point of mpipe-testmodels 1.0): is a built-in preset's name" in registry.problems
    assert registry.admit("team-mllm") == "team-mllm"
    assert not installed.exists() and "mpipe_testmodels.noisy" not in sys.modules


def test_the_allow_list_adds_overrides_and_can_switch_entry_points_off(installed, tmp_path, monkeypatch):
    path = allow_list(tmp_path, {"team-mllm": "team.models:build", "big": "team.models:big"},
                      entry_points=True)
    registry = load_registry(str(path))
    assert registry.factory_of("team-mllm") == "team.models:build"  # the operator has the last word
    assert registry.models["big"].source == f"allow-list {path}"
    assert registry.factory_of("other") == "mpipe_testmodels.noisy:other"
    (tmp_path / "closed").mkdir()
    closed = load_registry(str(allow_list(tmp_path / "closed", {"big": "team.models:big"})))
    assert closed.names() == ["big"]
    monkeypatch.setenv("MPIPE_MODELS", str(path))  # the environment names the file by default
    assert {"big", "other", "team-mllm"} <= set(load_registry().names())
    assert load_registry().factory_of("team-mllm") == "team.models:build"
    assert not installed.exists()


def test_two_packages_declaring_one_name_differently_leave_it_out(installed, tmp_path, monkeypatch):
    site = installed_package(tmp_path / "site2", {}, {"team-mllm": "elsewhere:build"}, name="mpipe-rival")
    monkeypatch.syspath_prepend(str(site))
    registry = load_registry()
    assert "team-mllm" not in registry.models
    assert [p for p in registry.problems if p.startswith("team-mllm")] == [
        "team-mllm: declared differently by entry point of mpipe-rival 1.0 and entry point of "
        "mpipe-testmodels 1.0"]


@pytest.mark.parametrize("text,message", [
    ("[models\n", "not valid toml"),
    ("bogus = 1\n", "unknown key 'bogus' (known: checkpoint_root, data_root, entry_points, models)"),
    ("entry_points = 'no'\n", "entry_points must be true or false"),
    ("checkpoint_root = 'relative/dir'\n", "checkpoint_root must be an absolute path"),
    ("models = 3\n", "[models] must be a table of name = \"package.module:factory\""),
    ("[models]\n'a b' = 'm:f'\n", "models.a b: a model name is 1 to 64 letters, digits, '_', '.' or '-', "
                                  "starting with a letter or digit"),
    ("[models]\nsmall = 'm:f'\n", "models.small: is a built-in preset's name"),
    ("[models]\nhf-x = 'm:f'\n", "models.hf-x: names starting with 'hf' are kept for the HF adapters"),
    ("[models]\nx = 'os.system'\n", "models.x: expected \"package.module:factory\", got 'os.system'"),
    ("[models]\nx = 'm:f; import os'\n", "models.x: expected \"package.module:factory\", got 'm:f; import os'"),
    ("[models]\nx = 3\n", "models.x: expected \"package.module:factory\", got 3"),
])
def test_a_bad_allow_list_is_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(MpipeError) as info:
        load_registry(str(path))
    assert str(info.value).startswith(f"model allow-list {path}")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_missing_allow_list_is_one_line(tmp_path):
    with pytest.raises(MpipeError, match=f"^model allow-list {tmp_path}/none.toml: no such file$"):
        load_registry(str(tmp_path / "none.toml"))


def test_import_paths_and_unknown_names_are_refused_before_anything_is_imported(tmp_path, monkeypatch):
    sandbox = Sandbox(tmp_path / "sandbox")
    monkeypatch.syspath_prepend(sandbox.pythonpath)
    registry = load_registry(str(allow_list(tmp_path, {"team-mllm": "team.models:build"})))
    for model, config in sandbox.cases() + [("nope", None), ("examples.tiny_mllm:build", None)]:
        with pytest.raises(ModelNotAllowed) as info:
            registry.admit(model)
        assert str(info.value) == not_registered(model, "team-mllm")
        options = {"model": model} if config is None else {"model": model, "model_config": config}
        with pytest.raises(RunOptionError) as info:
            check_run_options(options, registry=registry)
        assert str(info.value) == not_registered(model, "team-mllm")
    assert sandbox.evidence() == []
    assert "mpipe_evil" not in sys.modules
    for model in ("tiny", "hf:llava", "hf:qwen2_5_vl", "team-mllm"):
        assert registry.admit(model) == model
    assert check_run_options({"model": "team-mllm", "model_config": "x"}, registry=registry) == {
        "model": "team-mllm", "model_config": "x"}
    for bad, shown in [(5, "5"), ("", "''"), ("a\nb", "'a\\nb'"), ("m" * 600, "'" + "m" * 56 + "...")]:
        message = f"run option model: expected a model name, got {shown}"
        with pytest.raises(ModelNotAllowed, match="^" + re.escape(message) + "$") as info:
            registry.admit(bad)
        assert str(info.value) == message


def test_checkpoints_only_under_the_root_whatever_the_path_says(tmp_path):
    root = tmp_path / "ckpts"
    (root / "good").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)  # inside by name, outside in fact
    (tmp_path / "alias").symlink_to(root)  # outside by name, inside in fact
    registry = load_registry(str(allow_list(tmp_path, root=str(root))))
    assert registry.checkpoint_root == str(root)
    assert registry.admit(f"hf:{root}/good") == f"hf:{root}/good"
    assert registry.admit(f"hf:{tmp_path}/alias/good") == f"hf:{root}/good"  # stored as what is read
    refused = {
        f"hf:{outside}": f"not under the checkpoint root {root}",
        f"hf:{root}/../outside": f"not under the checkpoint root {root} (it resolves to {outside})",
        f"hf:{root}/link": f"not under the checkpoint root {root} (it resolves to {outside})",
        f"hf:{root}2": f"not under the checkpoint root {root}",  # a sibling sharing the prefix
        "hf:/": f"not under the checkpoint root {root}",
        "hf:good": f"a checkpoint is named by its absolute path, under {root}",
    }
    for model, why in refused.items():
        with pytest.raises(ModelNotAllowed) as info:
            registry.admit(model)
        assert str(info.value) == f"run option model: {model}: {why}", model
    no_root = load_registry(str(allow_list(tmp_path)))
    with pytest.raises(ModelNotAllowed) as info:
        no_root.admit(f"hf:{root}/good")
    assert str(info.value) == (f"run option model: hf:{root}/good: local checkpoints are refused here: the "
                               "operator has set no checkpoint root (checkpoint_root in the allow-list, "
                               "$MPIPE_MODELS)")
    assert os.path.isdir(outside)
