"""From a model spec (what `--model` / `-o model=` say) to a `PipelineModel`.

``--model`` is one of:

* a built-in preset (``tiny``, ``small``, ...: `executor.model.MODEL_PRESETS`);
* ``hf:llava``, ``hf:qwen2_5_vl`` (tiny random configs built locally) or
  ``hf:/path/to/checkpoint`` (a local `save_pretrained` folder);
* a registered name (`mpipe_core.runs.model_registry`: an ``mpipe.models`` entry
  point or the operator's allow-list), whose factory the spec carries
  (`ModelSpec.factory`) or the registry of this process names;
* ``package.module:factory``, a plug-in factory (`executor.runtime.models.protocol`),
  which only `mpipe run` / `mpipe profile` on a user's own machine pass here:
  queued runs are refused such names before anything is imported
  (`mpipe_core.runs.run_options.check_run_options`).

Every failure (unknown name, import error, factory raising, result not
following the protocol) is a `ModelError` with one line saying what and where.
"""
from __future__ import annotations

import importlib

from mpipe_core.runs.model_spec import ModelSpec

import torch

from .materialise import builds_partially, materialise
from .meta_build import BUILD_LOCK, meta_parameters
from .protocol import ModelError, PipelineModel, check_model

__all__ = ["BUILD_LOCK", "import_libraries", "load_model"]



def load_model(spec: ModelSpec, partial: bool = False) -> PipelineModel:
    """The model `spec` names.  `partial`: where the model can be built so (HF models,
    plug-ins giving `init_parameter`), its parameters left on the meta device for a
    rank to make real only its own parts (`materialise`); otherwise, and for the
    reference, every parameter real, with the same values."""
    with BUILD_LOCK:
        model = _load(spec)
        if not partial and builds_partially(model):
            materialise(model, [model.root], torch.device("cpu"))
        return model


def import_libraries(spec: ModelSpec) -> None:
    """Import the modules building `spec`'s model needs (transformers for hf:, a plug-in's
    factory module), building nothing; a failure is left for the build to report."""
    try:
        if spec.kind == "hf":
            from .hf import import_modelling

            import_modelling(spec.model[3:])
        elif spec.kind != "builtin":
            _factory(spec, f"--model {spec.model}")
    except Exception:  # noqa: BLE001 - the build itself says what is wrong, in one line
        pass


def _load(spec: ModelSpec) -> PipelineModel:
    where = f"--model {spec.model}"
    if spec.kind == "hf":
        from .hf import build_hf

        source = spec.model[3:]
        if not source:
            raise ModelError(f"{where}: expected hf:NAME (llava, qwen2_5_vl) or hf:/path/to/checkpoint")
        return check_model(build_hf(source, spec.config, spec.shape), where)
    if spec.kind == "builtin":
        from ..model import MODEL_PRESETS
        from .builtin import BuiltinModel

        cfg = MODEL_PRESETS.get(spec.model)
        return BuiltinModel(cfg, name=spec.model)
    factory = _factory(spec, where)
    model = _call_factory(factory, spec, where, meta=True)
    if model is None or not callable(getattr(model, "init_parameter", None)):
        # No way to give a part its values alone: every process builds the whole model.
        model = _call_factory(factory, spec, where, meta=False)
    return check_model(model, where)


def _call_factory(factory, spec: ModelSpec, where: str, meta: bool) -> PipelineModel | None:
    """The factory's model; `meta`: built with its parameters on the meta device (None
    where the factory cannot be: it computes with a parameter's values)."""
    try:
        if not meta:
            return factory(spec.config, spec.shape)
        with meta_parameters():
            return factory(spec.config, spec.shape)
    except ModelError:
        raise
    except Exception as error:  # noqa: BLE001
        if meta:
            return None
        raise ModelError(f"{where}: the factory raised {type(error).__name__}: {error}") from error


def _factory(spec: ModelSpec, where: str):
    """The callable a registered name or a package.module:factory path names (imported)."""
    path = spec.model
    if spec.kind == "registered":
        path = spec.factory
        if path is None:
            from mpipe_core.runs.model_registry import MODEL_PRESET_NAMES, load_registry

            registry = load_registry()
            path = registry.factory_of(spec.model)
            if path is None:
                raise ModelError(f"{where}: unknown model (presets: {', '.join(MODEL_PRESET_NAMES)}; "
                                 f"registered: {', '.join(registry.names()) or 'none'}; or hf:NAME, hf:/path, "
                                 "package.module:factory)")
        where = f"{where} ({path})"
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ModelError(f"{where}: expected package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure is the plug-in's, reported in one line
        raise ModelError(f"{where}: cannot import module '{module_name}': "
                         f"{type(error).__name__}: {error}") from error
    factory = module
    for name in attr.split("."):
        factory = getattr(factory, name, None)
    if not callable(factory):
        raise ModelError(f"{where}: module '{module_name}' has no callable '{attr}'")
    return factory

