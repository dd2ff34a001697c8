"""A design as a link: the Designer's term, workload and view in the URL's query.

    ?term=transpose(1f1b(p=4, m=4), mode=dynamic)&workload=preset:vit-heavy-small&memdev=3

`workload` is `preset:NAME`, `saved:NAME@N` or `saved:NAME` (a version saved in
the library the link's app uses, NAME alone its latest: storage's naming,
`storage.library.saved_workload_ref`) or `json:{...}` (the document itself, compact); `memdev`
is the device whose memory curve is drawn (only shown above 16 devices).
Reading a link never evaluates anything: the page does, under its own limits.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlencode

from mpipe_core.errors import MpipeError
from storage.library import SAVED_WORKLOAD_PREFIX, saved_workload_name

TERM, WORKLOAD, MEMORY_DEVICE = "term", "workload", "memdev"
PRESET, JSON = "preset:", "json:"
KEYS = (TERM, WORKLOAD, MEMORY_DEVICE)


@dataclass(frozen=True)
class DesignLink:
    term: str | None = None
    source: str | None = None  # "Preset", "Saved" or "JSON": the workload picker's choice
    value: str | None = None  # the preset's name, the saved version's NAME@N (or NAME), or the JSON text
    memory_device: int | None = None


def workload_param(save_as, document: str) -> str:
    """The `workload` value of a picked workload (`WorkloadChoice.save_as`, `.document`)."""
    if saved_workload_name(save_as) is not None:
        return save_as
    if isinstance(save_as, str):
        return PRESET + save_as
    return JSON + document


def query(term: str, workload: str, memory_device: int | None = None) -> dict[str, str]:
    """The query parameters of a design (what the page writes to `st.query_params`)."""
    params = {TERM: term, WORKLOAD: workload}
    if memory_device is not None:
        params[MEMORY_DEVICE] = str(memory_device)
    return params


def url(base: str, params: dict[str, str]) -> str:
    """`base` (the app's address, any query dropped) with the design's query."""
    return base.split("?", 1)[0] + "?" + urlencode(params)


def read(params) -> DesignLink:
    """A link's design from its query parameters (a mapping of str -> str);
    MpipeError naming the parameter when one is malformed."""
    from mpipe_core.workloads.presets import PRESETS

    term = params.get(TERM)
    source = value = None
    workload = params.get(WORKLOAD)
    if workload:
        if workload.startswith(PRESET):
            source, value = "Preset", workload[len(PRESET):]
            if value not in PRESETS:
                raise MpipeError(f"the link's workload {workload[:60]!r} is not a preset "
                                 f"(presets: {', '.join(PRESETS)})")
        elif saved_workload_name(workload) is not None:
            source, value = "Saved", saved_workload_name(workload)
        elif workload.startswith(JSON):
            try:
                doc = json.loads(workload[len(JSON):])
            except ValueError as error:
                raise MpipeError(f"the link's workload is not JSON: {error}") from None
            source, value = "JSON", json.dumps(doc, indent=2)
        else:
            raise MpipeError(f"the link's workload {workload[:60]!r} must start with preset:, "
                             f"{SAVED_WORKLOAD_PREFIX} or json:")
    device = params.get(MEMORY_DEVICE)
    memory_device = int(device) if device and device.isdigit() else None
    return DesignLink(term, source, value, memory_device)


def saved_ref(value: str | None, refs) -> str | None:
    """The saved workload version among `refs` (the library's "NAME@N", each name's latest)
    that a link's saved value names: "NAME@N" itself, or "NAME" alone (storage's "latest")
    as that name's ref; None when the library has no such version."""
    if value in refs:
        return value
    if value and "@" not in value:
        return next((ref for ref in refs if ref.partition("@")[0] == value), None)
    return None


def shows_link(link: DesignLink, save_as) -> bool:
    """Whether the picked workload (`WorkloadChoice.save_as`) is the saved one `link` names."""
    picked = saved_workload_name(save_as)
    return picked is not None and saved_ref(link.value, [picked]) == picked
