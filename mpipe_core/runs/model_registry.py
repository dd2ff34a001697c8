"""Which models a shared server trains: registered names, never import strings.

A queued run (`mpipe runs enqueue`, the app's launch, the worker) names its
model by a name from this registry, a built-in preset, a built-in HF
configuration (`hf:llava`, `hf:qwen2_5_vl`) or a local checkpoint `hf:/path`
under the operator's checkpoint root.  Anything else is refused by `admit`
before any of it is imported or called.  (`mpipe run` on a user's own machine
may still name `package.module:factory`: the user runs their own code.)

Two sources register a model, and reading either imports nothing:

* **Entry points** of installed packages, group ``mpipe.models``
  (``mymllm = "mypkg.model:build"`` in the package's ``pyproject.toml``
  ``[project.entry-points."mpipe.models"]``), read from the packages'
  metadata.
* **The operator's allow-list**, a TOML file given by ``--models FILE`` or
  ``$MPIPE_MODELS``::

      checkpoint_root = "/shared/checkpoints"  # hf:/path must resolve inside it
      data_root = "/shared/data"               # a queued run's data=PATH must resolve inside it
      entry_points = true                      # also accept installed entry points (default)

      [models]
      team-mllm = "team_models.mllm:build"

  A name in the file overrides an entry point of the same name.

The registry is read again wherever a run is checked (each enqueue, each claim
of the worker), so an edit to the file takes effect without a restart.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.inputs import load_document, load_toml, read_bounded

ENTRY_POINT_GROUP = "mpipe.models"
ALLOW_LIST_ENV = "MPIPE_MODELS"
ALLOW_LIST_LIMIT = 1024 * 1024
HF_CONFIGURATIONS = ("hf:llava", "hf:qwen2_5_vl")  # built locally from tiny/small configs, no download
# Kept equal to executor.model.MODEL_PRESETS by a test (the core cannot import the executor).
MODEL_PRESET_NAMES = ("tiny", "tiny-text", "tiny-frozen", "tiny-varimg", "small", "vit-heavy")

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
FACTORY = re.compile(rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*")


class ModelRegistryError(MpipeError):
    """An allow-list file that cannot be read or says something wrong."""


class ModelNotAllowed(MpipeError):
    """A model a queued run may not name."""


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    factory: str  # package.module:callable (imported only when a run of it is built)
    source: str  # where it was registered, in words

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "factory": self.factory, "source": self.source}


@dataclass(frozen=True)
class ModelRegistry:
    models: Mapping[str, RegisteredModel] = field(default_factory=dict)
    checkpoint_root: str | None = None  # a real path (symlinks resolved)
    data_root: str | None = None  # where a queued run's data files may be (a real path)
    allow_list: str | None = None  # the file read, if any
    problems: tuple[str, ...] = ()  # entry points left out, and why

    def names(self) -> list[str]:
        return sorted(self.models)

    def factory_of(self, name: str) -> str | None:
        entry = self.models.get(name)
        return entry.factory if entry is not None else None

    def admit(self, model: object) -> str:
        """The queued-run rule: `model` as a run stores it (a checkpoint as its real
        path), or ModelNotAllowed saying what is accepted.  Nothing is imported."""
        if not isinstance(model, str) or not model or len(model) > 500 \
                or any(c in model for c in "\x00\n\r"):
            raise ModelNotAllowed(f"run option model: expected a model name, got {_shown(model)}")
        if model in MODEL_PRESET_NAMES or model in HF_CONFIGURATIONS or model in self.models:
            return model
        if model.startswith("hf:"):
            return "hf:" + self.checkpoint(model[3:])
        hint = ("; a queued run never imports a module:function name, only `mpipe run` on your own "
                "machine does" if ":" in model else "")
        raise ModelNotAllowed(f"run option model: {_shown(model)} is not a registered model ({self.accepted()})"
                              + hint)

    def accepted(self) -> str:
        """What a queued run may name, in words (one line)."""
        registered = ", ".join(self.names()) or "none"
        root = (f"hf:/path under {self.checkpoint_root}" if self.checkpoint_root
                else "no local checkpoints (no checkpoint root is set)")
        return (f"registered: {registered}; presets: {', '.join(MODEL_PRESET_NAMES)}; "
                f"{', '.join(HF_CONFIGURATIONS)}; {root}")

    def checkpoint(self, path: str) -> str:
        """The real path of a local checkpoint a queued run may load, or ModelNotAllowed."""
        where = f"run option model: hf:{path}"
        if self.checkpoint_root is None:
            raise ModelNotAllowed(f"{where}: local checkpoints are refused here: the operator has set no "
                                  f"checkpoint root (checkpoint_root in the allow-list, ${ALLOW_LIST_ENV})")
        if not os.path.isabs(path):
            raise ModelNotAllowed(f"{where}: a checkpoint is named by its absolute path, under "
                                  f"{self.checkpoint_root}")
        real = os.path.realpath(path)  # symlinks and `..` resolved: the folder that would be read
        if os.path.commonpath([real, self.checkpoint_root]) != self.checkpoint_root:
            shown = "" if real == (path.rstrip("/") or "/") else f" (it resolves to {real})"
            raise ModelNotAllowed(f"{where}: not under the checkpoint root {self.checkpoint_root}{shown}")
        return real


    def data_file(self, path: object) -> str:
        """The real path of a data file (`-o data=PATH`: a data section or a .jsonl of
        samples) a queued run may read, or ModelNotAllowed.  Nothing is read here."""
        if not isinstance(path, str) or not path or len(path) > 500 or any(c in path for c in "\x00\n\r"):
            raise ModelNotAllowed(f"run option data: expected the absolute path of a data file, got {_shown(path)}")
        where = f"run option data: {path}"
        if self.data_root is None:
            raise ModelNotAllowed(f"{where}: data files are refused here: the operator has set no data root "
                                  f"(data_root in the allow-list, ${ALLOW_LIST_ENV})")
        if not os.path.isabs(path):
            raise ModelNotAllowed(f"{where}: a data file is named by its absolute path, under {self.data_root}")
        real = os.path.realpath(path)  # symlinks and `..` resolved: the file that would be read
        if os.path.commonpath([real, self.data_root]) != self.data_root:
            shown = "" if real == path else f" (it resolves to {real})"
            raise ModelNotAllowed(f"{where}: not under the data root {self.data_root}{shown}")
        return real


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_registry(allow_list: str | None = None, environ: Mapping[str, str] | None = None) -> ModelRegistry:
    """The registry from installed entry points and the allow-list (`allow_list`,
    else $MPIPE_MODELS, else none).  Reads metadata and the file only."""
    environ = os.environ if environ is None else environ
    path = allow_list or environ.get(ALLOW_LIST_ENV) or None
    doc = _read_allow_list(path) if path else {}
    models: dict[str, RegisteredModel] = {}
    problems: list[str] = []
    if doc.get("entry_points", True):
        models, problems = _entry_points()
    for name, factory in doc.get("models", {}).items():
        models[name] = RegisteredModel(name, factory, f"allow-list {path}")
    root = doc.get("checkpoint_root")
    data_root = doc.get("data_root")
    return ModelRegistry(models, os.path.realpath(root) if root else None,
                         os.path.realpath(data_root) if data_root else None, path, tuple(problems))


def _read_allow_list(path: str) -> dict:
    where = f"model allow-list {path}"
    try:
        data = read_bounded(path, ALLOW_LIST_LIMIT, "the model allow-list")
    except MpipeError as error:
        raise ModelRegistryError(f"model allow-list {error.message}") from None
    doc = load_document(data, where, parse=load_toml, kind="toml")
    unknown = sorted(set(doc) - {"checkpoint_root", "data_root", "entry_points", "models"})
    if unknown:
        raise ModelRegistryError(f"{where}: unknown key {unknown[0]!r} (known: checkpoint_root, data_root, "
                                 "entry_points, models)")
    if not isinstance(doc.get("entry_points", True), bool):
        raise ModelRegistryError(f"{where}: entry_points must be true or false")
    for key in ("checkpoint_root", "data_root"):
        root = doc.get(key)
        if root is not None and not (isinstance(root, str) and os.path.isabs(root) and "\x00" not in root):
            raise ModelRegistryError(f"{where}: {key} must be an absolute path")
    models = doc.get("models", {})
    if not isinstance(models, dict):
        raise ModelRegistryError(f"{where}: [models] must be a table of name = \"package.module:factory\"")
    for name, factory in models.items():
        problem = _entry_problem(name, factory)
        if problem:
            raise ModelRegistryError(f"{where}: models.{_shown(name)[1:-1]}: {problem}")
    return doc



def _entry_problem(name: str, factory: object) -> str | None:
    """Why `name = factory` cannot be registered, or None."""
    if not NAME.fullmatch(name):
        return ("a model name is 1 to 64 letters, digits, '_', '.' or '-', starting with a letter "
                "or digit")
    if name in MODEL_PRESET_NAMES:
        return "is a built-in preset's name"
    if name.startswith("hf"):
        return "names starting with 'hf' are kept for the HF adapters"
    if not isinstance(factory, str) or not FACTORY.fullmatch(factory):
        return f"expected \"package.module:factory\", got {_shown(factory)}"
    return None


def _entry_points() -> tuple[dict[str, RegisteredModel], list[str]]:
    """Installed `mpipe.models` entry points (metadata only: nothing is imported).
    A name two distributions declare differently is left out: which one is meant?"""
    from importlib.metadata import entry_points

    found: dict[str, list[RegisteredModel]] = {}
    problems = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        source = f"entry point of {dist.name} {dist.version}" if dist is not None else "entry point"
        problem = _entry_problem(ep.name, ep.value)
        if problem:
            problems.append(f"{ep.name} ({source}): {problem}")
            continue
        found.setdefault(ep.name, []).append(RegisteredModel(ep.name, ep.value, source))
    models = {}
    for name, entries in found.items():
        if len({e.factory for e in entries}) > 1:
            problems.append(f"{name}: declared differently by " + " and ".join(sorted(e.source for e in entries)))
            continue
        models[name] = entries[0]
    return models, problems
