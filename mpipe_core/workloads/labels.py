"""How a workload document is named to people and to the CLI.

A document that is a preset's, or a preset's with only its `parallel` section
changed (the CLI's `--parallel`, the app's parallel settings), is named by the
preset and the settings that differ from the preset's own, in `--parallel`'s
syntax: `internvl-26b tp=8,sp`.  A preset's document changed anywhere else is
`internvl-26b (edited)`; anything else keeps the name its caller had for it (a
file's name, "inline").  `cli_arguments` gives the `-w`/`--parallel` arguments
that rebuild the document, where a preset and settings can.
"""
from __future__ import annotations

from typing import Any, Mapping

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.analytic import PARALLEL_DEFAULTS, parallel_section
from mpipe_core.workloads.presets import PRESETS, preset_document

EDITED = "(edited)"


def parallel_spec_text(settings: Mapping[str, Any]) -> str:
    """`--parallel`'s text for `settings`, in the section's own key order: a
    true flag bare, a false one `=false`, a degree `=N` (`tp=8,sp`)."""
    parts = []
    for key in PARALLEL_DEFAULTS:
        if key not in settings:
            continue
        value = settings[key]
        parts.append(key if value is True else f"{key}=false" if value is False else f"{key}={value}")
    return ",".join(parts)


def preset_origin(doc: Any) -> tuple[str, dict[str, Any]] | None:
    """(preset, the parallel settings that differ from the preset's) when `doc` is
    that preset's document with at most its `parallel` section changed; None
    when it is no preset's, or is one's changed elsewhere too."""
    name = doc.get("name") if isinstance(doc, Mapping) else None
    if not isinstance(name, str) or name not in PRESETS:
        return None
    base = preset_document(name)
    if {k: v for k, v in doc.items() if k != "parallel"} != {k: v for k, v in base.items() if k != "parallel"}:
        return None
    if "parallel" not in doc and "parallel" not in base:
        return name, {}
    if "model" not in base:  # an explicit preset has no parallel section to change
        return None
    try:
        mine, theirs = parallel_section(doc), parallel_section(base)
    except MpipeError:
        return None
    return name, {k: v for k, v in mine.items() if v != theirs[k]}


def workload_label(doc: Any, fallback: str = "inline") -> str:
    """`preset`, `preset tp=8,sp`, `preset (edited)` (a preset's document changed
    beyond its parallel settings), else `fallback`."""
    origin = preset_origin(doc)
    if origin is not None:
        name, changed = origin
        return f"{name} {parallel_spec_text(changed)}" if changed else name
    name = doc.get("name") if isinstance(doc, Mapping) else None
    if isinstance(name, str) and name in PRESETS:
        return f"{name} {EDITED}"
    return fallback


def cli_arguments(doc: Any) -> list[str] | None:
    """`["-w", preset]` plus `["--parallel", spec]` when settings differ: the
    arguments of `mpipe eval` that rebuild `doc`; None when no preset does."""
    origin = preset_origin(doc)
    if origin is None:
        return None
    name, changed = origin
    return ["-w", name] + (["--parallel", parallel_spec_text(changed)] if changed else [])
