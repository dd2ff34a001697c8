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
import threading

from mpipe_core.runs.model_spec import ModelSpec

from .protocol import ModelError, PipelineModel, check_model

# Factories seed torch's global generator and then draw the weights; ranks run as
# threads of one process (`run_local`) must not interleave those draws, nor let
# another model's construction (torch's default initialisers draw from the same
# generator: the built-in model's too, before it overwrites them) draw in between.
BUILD_LOCK = threading.Lock()


def load_model(spec: ModelSpec) -> PipelineModel:
    with BUILD_LOCK:
        return _load(spec)


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
    try:
        model = factory(spec.config, spec.shape)
    except ModelError:
        raise
    except Exception as error:  # noqa: BLE001
        raise ModelError(f"{where}: the factory raised {type(error).__name__}: {error}") from error
    return check_model(model, where)


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
