"""A run spec: the (workload, layout, term) triple that `plan` emits and `run`,
the queue, the worker and the app pass along.

As a file (`mpipe run --spec run.json`) it is one JSON object::

    {"format": "mpipe-run-spec", "version": 1,
     "term": "transpose(zbv(p=2, m=4))",
     "workload": {... the workload document, or a preset name ...},
     "layout": {"tp": 2, "sp": true, "cp": 1, "pp": 2, "dp": 128,
                "distributed_optimizer": true, "encoder_shard": "none"},
     "source": "mpipe plan: 512 devices, ..."}   (optional, free text)

The layout's pp is the term's devices; `scaled(dp)` keeps tp, cp, pp and the
term and changes dp only (`--scale dp=K`: a 512-device plan tried on 8
devices first).  Nobody re-derives a layout from flags once a spec exists.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from mpipe_core.errors import MpipeError
from mpipe_core.runs.layout import RunLayout

FORMAT = "mpipe-run-spec"
VERSION = 1
MAX_SPEC_BYTES = 16 << 20


class RunSpecFileError(MpipeError):
    """A file or document that is not a run spec."""


@dataclass(frozen=True)
class RunSpec:
    term: str
    workload: Any  # a workload document (dict) or a preset name
    layout: RunLayout
    source: str = ""

    def scaled(self, dp: int) -> "RunSpec":
        return replace(self, layout=self.layout.scaled(dp))

    def to_dict(self) -> dict[str, Any]:
        doc = {"format": FORMAT, "version": VERSION, "term": self.term, "workload": self.workload,
               "layout": self.layout.to_dict()}
        if self.source:
            doc["source"] = self.source
        return doc

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> "RunSpec":
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise RunSpecFileError(f"{where}: not a run spec (a JSON object with \"format\": \"{FORMAT}\", as "
                                   f"`mpipe plan --emit mpipe` writes)")
        if doc.get("version") != VERSION:
            raise RunSpecFileError(f"{where}: run spec version {str(doc.get('version'))[:20]} (this mpipe reads "
                                   f"version {VERSION})")
        term = doc.get("term")
        if not isinstance(term, str) or not term.strip():
            raise RunSpecFileError(f"{where}: term: expected the schedule's term as text")
        workload = doc.get("workload")
        if workload is not None and not isinstance(workload, (str, Mapping)):
            raise RunSpecFileError(f"{where}: workload: expected a workload document or a preset name")
        layout = RunLayout.from_dict(doc.get("layout"), f"{where}: layout")
        source = doc.get("source", "")
        return cls(term, dict(workload) if isinstance(workload, Mapping) else workload, layout,
                   source if isinstance(source, str) else "")


def read_run_spec(path: str | Path) -> RunSpec:
    """A run spec file; one-line errors for a missing, unreadable or foreign file."""
    p = Path(path)
    where = f"--spec {str(path)[:200]}"
    try:
        if p.stat().st_size > MAX_SPEC_BYTES:
            raise RunSpecFileError(f"{where}: larger than {MAX_SPEC_BYTES >> 20} MiB; not a run spec")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunSpecFileError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RunSpecFileError(f"{where}: cannot read it ({type(error).__name__})") from None
    try:
        doc = json.loads(text)
    except ValueError as error:
        raise RunSpecFileError(f"{where}: not a run spec (not JSON: {str(error)[:80]})") from None
    return RunSpec.from_dict(doc, where)


def write_run_spec(spec: RunSpec, path: str | Path) -> None:
    Path(path).write_text(json.dumps(spec.to_dict(), indent=2) + "\n", encoding="utf-8")


def spec_workload(spec: RunSpec) -> dict[str, Any]:
    """The spec's workload document with its layout written into the `parallel` section
    (tp, sp, cp, dp, ZeRO, encoder_shard; pp is the term's): what a saved schedule version
    carries, so the queue and the worker read the spec's layout from it
    (`layout.runnable_workload_layout`).  A preset name is expanded to its document."""
    from mpipe_core.workloads.presets import PRESETS, preset_document

    document = spec.workload
    if isinstance(document, str):
        if document not in PRESETS:
            raise RunSpecFileError(f"the run spec's workload '{document[:60]}' is no preset; give its document")
        document = preset_document(document)
    if not isinstance(document, Mapping):
        raise RunSpecFileError("the run spec has no workload: the queue runs a schedule with its workload")
    layout = spec.layout.to_dict()
    layout.pop("pp")
    out = dict(document)
    out["parallel"] = {**(document.get("parallel") or {}), **layout}
    return out


def run_spec_from_plan_row(row: Mapping[str, Any], source: str = "") -> RunSpec:
    """A plan row (`PlanCandidate.as_dict()`: its workload document, parallel section,
    pp and term) as a run spec: what `mpipe plan --emit mpipe` writes."""
    from mpipe_core.runs.run_options import encoder_devices_of

    document = row["workload"]
    # The term's devices: the row's pp, plus disaggregate's encoder devices (per replica).
    devices = int(row["pp"]) + encoder_devices_of(row["term"])
    layout = RunLayout.from_parallel(row.get("parallel") or document.get("parallel"), devices,
                                     "the plan row's parallel section")
    return RunSpec(row["term"], document, layout, source)
