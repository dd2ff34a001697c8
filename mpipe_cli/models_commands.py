"""`mpipe models`: the models queued runs may name on this machine (its
`mpipe.models` entry points and the operator's allow-list), read from metadata
and the file only: no factory is imported."""
from __future__ import annotations

from .storage_commands import _print_json, _table, add_models_argument


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "models", help="the registered models a queued run may name (nothing is imported)",
        description="List the models `mpipe runs enqueue`, the app and the worker accept besides the "
                    "presets and hf:llava / hf:qwen2_5_vl: installed `mpipe.models` entry points and the "
                    "allow-list's [models], with the checkpoint root for hf:/path.")
    add_models_argument(p)
    p.add_argument("--json", action="store_true", help="JSON on stdout")
    p.set_defaults(handler=cmd_models)


def cmd_models(args) -> int:
    from mpipe_core.runs.model_registry import HF_CONFIGURATIONS, MODEL_PRESET_NAMES, load_registry

    registry = load_registry(args.models)
    if args.json:
        return _print_json({"models": [registry.models[n].as_dict() for n in registry.names()],
                            "presets": list(MODEL_PRESET_NAMES), "hf": list(HF_CONFIGURATIONS),
                            "checkpoint_root": registry.checkpoint_root, "allow_list": registry.allow_list,
                            "problems": list(registry.problems)})
    rows = [[m.name, m.factory, m.source] for m in (registry.models[n] for n in registry.names())]
    if rows:
        _table(rows, ["NAME", "FACTORY", "REGISTERED BY"])
    else:
        print("no registered models")
    print(f"presets: {', '.join(MODEL_PRESET_NAMES)}; built-in HF configurations: {', '.join(HF_CONFIGURATIONS)}")
    print("local checkpoints: " + (f"hf:/path under {registry.checkpoint_root}" if registry.checkpoint_root
                                   else "refused (no checkpoint_root in the allow-list)"))
    print(f"allow-list: {registry.allow_list or 'none ($MPIPE_MODELS is not set)'}")
    for problem in registry.problems:
        print(f"left out: {problem}")
    return 0
