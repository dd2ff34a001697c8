"""Workloads: what a schedule's ops cost.

A workload is the model and its costs, independent of any schedule (Halide's
"algorithm" to the term's "schedule").  Two forms are accepted:

* explicit: ``{"llm": {"layers", "f", "b", "w", "activation", "recompute", "static"},
  "encoders": [...], "link": {"latency", "bandwidth"},
  "host": {"devices", "contention", "pairs", "dispatch"}, "device": {"memory"},
  "units": {"time": "ms", "memory": "GB"}}`` with time per LLM layer per microbatch
  (units optional: unitless when absent);
* analytic: ``{"model": ..., "device": ..., "parallel": ..., "encoders": [{"vit": ...}]}``
  from model dimensions and a device profile (see `analytic.py`); a document is
  analytic when it names a `model`.

Memory (docs/memory.md): `llm.activation` is what one layer keeps per
microbatch until its backward; `llm.recompute.{selective,full}` what it keeps
under that recompute mode (`activation`) and the forward time the recompute
adds (`f`); `llm.static` the static memory (parameters, gradients, optimizer
state) of one layer, the embedding and the head; `llm.embed.activation` and
`llm.head.activation` what the embedding and the head (with the loss) keep
per microbatch (on the first and last chunk); an encoder's `static` that of
a trained copy and `replica_static` that of a forward-only replica
(`sharded_static`: the part of `static` sharded over the trained copies);
`device.memory` the device's capacity.  All in the workload's memory unit.

Both resolve to the same `Workload`.  Encoder costs may differ per microbatch
(images per sample vary); they are resolved for a concrete microbatch count by
`Encoder.costs`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from mpipe_core.data.spec import DataSpec, parse_data
from mpipe_core.errors import MpipeError, WorkloadError
from mpipe_core.workloads.analytic import analytic_workload
from mpipe_core.workloads.encoder import Encoder, parse_encoder
from mpipe_core.workloads.fields import MAX_NAME, check_keys, kind_of, number, shown
from mpipe_core.workloads.hardware import Host, Link, parse_device, parse_host
from mpipe_core.workloads.inputs import WORKLOAD_FILE_LIMIT, load_document, load_toml, read_bounded
from mpipe_core.workloads.llm import LLM, parse_llm
from mpipe_core.workloads.presets import PRESETS, preset_document
from mpipe_core.workloads.step_model import StepModel
from mpipe_core.workloads.units import MEMORY_UNITS, TIME_UNITS


@dataclass(frozen=True)
class Workload:
    llm: LLM = field(default_factory=lambda: LLM(layers=None))
    encoders: tuple[Encoder, ...] = ()
    link: Link = field(default_factory=Link)
    name: str = "custom"
    host: Host = field(default_factory=Host)
    time_unit: str = ""  # one of TIME_UNITS
    memory_unit: str = ""  # one of MEMORY_UNITS
    # The device's memory capacity in `memory_unit` (None: unknown).
    capacity: float | None = None
    # The document it was read from, kept so saving/exporting round-trips it.
    source: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # The samples it trains on (`data`: docs/data.md); None: every batch is the
    # workload's own costs.  A drawn batch's costs: workloads/batch_costs.py.
    data: DataSpec | None = field(default=None, compare=False, repr=False)
    # An analytic workload's step figures and cluster (None: explicit costs only).
    step: StepModel | None = None

    def link_for(self, devices: int) -> Link:
        """The link a pipeline of `devices` stages sends on: the cluster's (the
        slowest class a hop between two stages crosses), else `link`."""
        if self.step is None or self.step.cluster is None:
            return self.link
        hop = self.step.hop_link(devices)
        if hop is None:
            return Link(0.0, None)
        unit = self.step.seconds_per_unit
        return Link(hop.latency_s / unit, hop.bytes_per_s * unit)

    def boundary_transfer_between(self, devices: int, a: int, b: int, nbytes: float | None = None) -> float:
        """The time the hidden state (`nbytes`, default `llm.boundary_bytes`: a
        microbatch of other tokens ships `LLM.boundary_bytes_of`) takes from
        device a to device b of a pipeline of `devices` stages: on the link
        between the two stages' ranks with a cluster, else on `link`."""
        nbytes = self.llm.boundary_bytes if nbytes is None else nbytes
        if self.step is None or self.step.cluster is None:
            return self.link.transfer(nbytes)
        hop = self.step.stage_link(devices, a, b)
        if hop is None:
            return 0.0
        unit = self.step.seconds_per_unit
        return Link(hop.latency_s / unit, hop.bytes_per_s * unit).transfer(nbytes)

    def encoder(self, name: str) -> Encoder:
        for enc in self.encoders:
            if enc.name == name:
                return enc
        known = ", ".join(e.name for e in self.encoders) or "none"
        raise WorkloadError(f"unknown encoder '{name}' (this workload has: {known})")

    def to_dict(self) -> dict[str, Any]:
        if self.source is not None:
            return json.loads(json.dumps(self.source))
        return explicit_dict(self)


def explicit_dict(wl: Workload) -> dict[str, Any]:
    """The explicit-cost form of a workload (what `mpipe calibrate` and exports write)."""
    llm: dict[str, Any] = {
        "layers": wl.llm.layers, "f": wl.llm.f, "b": wl.llm.b, "w": wl.llm.w,
        "activation": wl.llm.activation, "boundary_bytes": wl.llm.boundary_bytes,
    }
    if wl.llm.chunk_costs is not None:
        llm["chunk_costs"] = {k: list(v) for k, v in wl.llm.chunk_costs.items()}
    if wl.llm.layer_costs is not None:
        llm["layer_costs"] = {k: list(v) for k, v in wl.llm.layer_costs.items()}
    for part in ("embed", "head"):
        spec = dict(getattr(wl.llm, part) or {})
        if getattr(wl.llm, f"{part}_activation"):
            spec["activation"] = getattr(wl.llm, f"{part}_activation")
        if spec or getattr(wl.llm, part) is not None:
            llm[part] = spec
    if wl.llm.recompute is not None:
        llm["recompute"] = {mode: dict(spec) for mode, spec in wl.llm.recompute.items()}
    if wl.llm.has_static:
        llm["static"] = {"layer": wl.llm.static_layer, "embed": wl.llm.static_embed, "head": wl.llm.static_head}
    encoders = []
    for e in wl.encoders:
        doc = {
            "name": e.name, "f": e.f, "b": e.b, "w": e.w, "trainable": e.trainable,
            "output_bytes": e.output_bytes, "input_bytes": e.input_bytes,
            "param_bytes": e.param_bytes, "activation": e.activation, "layers": e.layers,
        }
        if e.images is not None:
            doc["images"] = dict(e.images)
        if e.static:
            doc["static"] = e.static
        if e.replica_static is not None:
            doc["replica_static"] = e.replica_static
        if e.sharded_static is not None:
            doc["sharded_static"] = e.sharded_static
        if e.grad_bytes is not None:
            doc["grad_bytes"] = e.grad_bytes
        if e.recompute is not None:
            doc["recompute"] = {mode: dict(spec) for mode, spec in e.recompute.items()}
        encoders.append(doc)
    doc = {
        "name": wl.name, "llm": llm, "encoders": encoders,
        "link": {"latency": wl.link.latency, "bandwidth": wl.link.bandwidth},
        **({"host": {"devices": wl.host.devices, "contention": wl.host.contention,
                     "dispatch": wl.host.dispatch,
                     **({"pairs": wl.host.pairs_doc()} if wl.host.pairs else {})}}
           if wl.host != Host() else {}),
    }
    if wl.capacity is not None:
        doc["device"] = {"memory": wl.capacity}
    if wl.time_unit or wl.memory_unit:
        doc["units"] = {"time": wl.time_unit, "memory": wl.memory_unit}
    return doc


def _parse_units(doc: Any) -> tuple[str, str]:
    if doc is None:
        return "", ""
    if not isinstance(doc, dict):
        raise WorkloadError('units: expected {"time": ..., "memory": ...}')
    check_keys(doc, {"time", "memory"}, "units")
    time, memory = doc.get("time", ""), doc.get("memory", "")
    if time not in TIME_UNITS:
        raise WorkloadError(f"units.time: expected one of {', '.join(repr(u) for u in TIME_UNITS)}, "
                            f"got {time!r}")
    if memory not in MEMORY_UNITS:
        raise WorkloadError(f"units.memory: expected one of {', '.join(repr(u) for u in MEMORY_UNITS)}, "
                            f"got {memory!r}")
    return time, memory


def parse_workload(doc: Any, name: str = "custom", base: Path | None = None) -> Workload:
    """Validate a workload document (explicit or analytic form) into a `Workload`;
    `base`: the folder a `data` section's file names are relative to."""
    if not isinstance(doc, dict):
        raise WorkloadError(f"workload: expected an object at the top level, got {kind_of(doc)}")
    if "model" in doc:  # the analytic form (an explicit workload may name a device's memory only)
        explicit, step = analytic_workload(doc)
        wl = parse_workload(explicit, name=doc.get("name", name))
        return replace(wl, source=doc, step=step, data=_parse_data(doc, wl, base, analytic=True))
    # `origin`: where a measured workload came from (`mpipe profile`: the model, the device).
    check_keys(doc, {"llm", "encoders", "link", "host", "name", "description", "origin", "units", "device",
                     "data"}, "workload")
    if "origin" in doc and not isinstance(doc["origin"], dict):
        raise WorkloadError("origin: expected an object")
    llm = parse_llm(doc.get("llm", {}))
    enc_docs = doc.get("encoders", [])
    if not isinstance(enc_docs, list):
        raise WorkloadError("encoders: expected a list")
    encoders = tuple(parse_encoder(e, i) for i, e in enumerate(enc_docs))
    names = [e.name for e in encoders]
    if len(set(names)) != len(names):
        raise WorkloadError(f"encoders: duplicate encoder name in {names}")
    link_doc = doc.get("link")
    link_doc = {} if link_doc is None else link_doc
    if not isinstance(link_doc, dict):
        raise WorkloadError("link: expected an object")
    check_keys(link_doc, {"latency", "bandwidth"}, "link")
    bandwidth = number(link_doc, "bandwidth", "link", None, allow_none=True)
    if bandwidth is not None and bandwidth <= 0:
        raise WorkloadError(f"link.bandwidth: must be > 0 or null, got {shown(bandwidth)}")
    link = Link(latency=number(link_doc, "latency", "link", 0.0), bandwidth=bandwidth)
    label = doc.get("name", name)
    if not isinstance(label, str) or len(label) > MAX_NAME or "\x00" in label:
        raise WorkloadError(f"name: expected text of at most {MAX_NAME} characters, got "
                            f"{shown(label) if not isinstance(label, str) else shown(label[:40])}"
                            f"{'...' if isinstance(label, str) and len(label) > 40 else ''}")
    description = doc.get("description", "")
    if not isinstance(description, str) or "\x00" in description:
        raise WorkloadError("description: expected text without NUL characters")
    time_unit, memory_unit = _parse_units(doc.get("units"))
    wl = Workload(llm, encoders, link, name=label, host=parse_host(doc.get("host")),
                  time_unit=time_unit, memory_unit=memory_unit, capacity=parse_device(doc.get("device")),
                  source=doc)
    return replace(wl, data=_parse_data(doc, wl, base, analytic=False))


def _parse_data(doc: Mapping[str, Any], wl: Workload, base: Path | None, analytic: bool) -> DataSpec | None:
    """The `data` section, checked; an encoder's `images` and a data section
    both say how many inputs a microbatch holds: one of them."""
    if doc.get("data") is None:
        return None
    spec = parse_data(doc["data"], base, analytic)
    with_images = next((e.name for e in wl.encoders if e.images is not None), None)
    if with_images is not None:
        raise WorkloadError(f"encoder '{with_images}': images and a data section both count a microbatch's "
                            f"inputs; drop images (with data, its f/b/w are per tile)")
    return spec


def with_parallel(workload: Workload, parallel: Mapping[str, Any]) -> Workload:
    """An analytic workload with `parallel`'s keys set in its `parallel` section
    (the CLI's `--parallel tp=8,sp`); checked like the document's own."""
    doc = workload.source
    if doc is None or "model" not in doc:
        raise WorkloadError("--parallel needs an analytic workload (one that names a model and a device); "
                            f"'{workload.name}' states its costs explicitly")
    changed = json.loads(json.dumps(doc))
    section = changed.get("parallel", {})
    changed["parallel"] = {**(section if isinstance(section, dict) else {}), **parallel}
    changed.pop("data", None)  # (already read: its file names may be relative to the workload's folder)
    return replace(parse_workload(changed, name=workload.name), data=workload.data)


def preset(name: str) -> Workload:
    """A named workload (`presets.PRESETS`)."""
    return parse_workload(preset_document(name), name=name)


def load_workload(source: "Workload | Mapping[str, Any] | str | Path | None") -> Workload:
    """A workload from a `Workload`, a dict, a preset name, or a .json/.toml file path."""
    if source is None:
        return Workload(name="uniform")
    if isinstance(source, Workload):
        return source
    if isinstance(source, Mapping):
        return parse_workload(dict(source))
    text = str(source)
    if text in PRESETS:
        return preset(text)
    if text.startswith("saved:"):
        raise WorkloadError(f"workload '{text}': saved workloads live in the team library, which the core does not "
                            f"read (the CLI's -w and storage.resolve_workload do)")
    path = Path(text)
    if not path.exists():
        from mpipe_core.errors import closest

        hint = closest(text, PRESETS)
        extra = f"; did you mean preset '{hint}'?" if hint else f" (presets: {', '.join(sorted(PRESETS))})"
        raise WorkloadError(f"workload '{text}': no such file or preset{extra}")
    try:
        raw = read_bounded(path, WORKLOAD_FILE_LIMIT, "the workload file")
        if path.suffix.lower() == ".toml":
            doc = load_document(raw, str(path), load_toml, "toml")
        else:
            doc = load_document(raw, str(path), kind=path.suffix.lstrip(".").lower() or "json")
    except MpipeError as error:
        raise WorkloadError(error.message) from None
    try:
        return parse_workload(doc, name=path.stem[:MAX_NAME], base=path.parent)
    except WorkloadError as error:
        raise WorkloadError(f"{path}: {error.message}") from None
