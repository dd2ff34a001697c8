"""`mpipe models`: the models queued runs may name on this machine (its
`mpipe.models` entry points and the operator's allow-list), read from metadata
and the file only: no factory is imported."""
from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "models", help="the registered models a queued run may name (nothing is imported)",
        description="List the models `mpipe runs enqueue`, the app and the worker accept besides the "
                    "presets and hf:llava / hf:qwen2_5_vl: installed `mpipe.models` entry points and the "
                    "allow-list's [models], with the checkpoint root for hf:/path.")
    p.add_argument("--models", metavar="FILE", default=None,
                   help="the model allow-list (TOML; default $MPIPE_MODELS)")
    p.add_argument("--json", action="store_true", help="JSON on stdout")
    p.set_defaults(handler=cmd_models)


def cmd_models(args) -> int:
    from mpipe_core.model_registry import MODEL_PRESET_NAMES, HF_CONFIGURATIONS, load_registry

    registry = load_registry(args.models)
    if args.json:
        json.dump({"models": [registry.models[n].as_dict() for n in registry.names()],
                   "presets": list(MODEL_PRESET_NAMES), "hf": list(HF_CONFIGURATIONS),
                   "checkpoint_root": registry.checkpoint_root, "allow_list": registry.allow_list,
                   "problems": list(registry.problems)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rows = [[m.name, m.factory, m.source] for m in (registry.models[n] for n in registry.names())]
    if rows:
        widths = [max(len(r[i]) for r in [["NAME", "FACTORY", "REGISTERED BY"], *rows]) for i in range(3)]
        for row in [["NAME", "FACTORY", "REGISTERED BY"], *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    else:
        print("no registered models")
    print(f"presets: {', '.join(MODEL_PRESET_NAMES)}; built-in HF configurations: {', '.join(HF_CONFIGURATIONS)}")
    print("local checkpoints: " + (f"hf:/path under {registry.checkpoint_root}" if registry.checkpoint_root
                                   else "refused (no checkpoint_root in the allow-list)"))
    print(f"allow-list: {registry.allow_list or 'none ($MPIPE_MODELS is not set)'}")
    for problem in registry.problems:
        print(f"left out: {problem}")
    return 0
