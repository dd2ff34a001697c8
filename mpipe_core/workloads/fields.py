"""The checks every workload section's fields go through (numbers, integers, known keys,
size limits), per-microbatch cost specs, and the `recompute` sections of the LLM and the
encoders.  Each failure is a `WorkloadError` that names the field."""
from __future__ import annotations

import json
import math
import random
from typing import Any, Mapping

from mpipe_core.errors import WorkloadError
from mpipe_core.workloads.memory_model import RECOMPUTE_MODES as MEMORY_RECOMPUTE_MODES

# A per-microbatch cost: one number, a list (one per microbatch), or a seeded
# distribution {"uniform": [lo, hi], "seed": s} / {"normal": [mean, std], "seed": s}.
CostSpec = Any

SHOWN_LENGTH = 60  # a value quoted in a message is cut short beyond this


def shown(value: Any) -> str:
    """A document's value in a message, spelled as the document wrote it (true,
    null, ["a", 1]; text quoted), cut short when long."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, (dict, list)):
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = repr(value)
    else:
        text = repr(value)
    return text if len(text) <= SHOWN_LENGTH else text[:SHOWN_LENGTH - 3] + "..."


def kind_of(value: Any) -> str:
    """What a document's value is, in the document's terms: an object, an array, ..."""
    if isinstance(value, bool):
        return "true or false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def number(doc: Mapping[str, Any], key: str, where: str, default: float | None = None,
            minimum: float = 0.0, allow_none: bool = False) -> Any:
    if key not in doc or doc[key] is None:
        if key in doc and allow_none:
            return None
        if default is None and not allow_none:
            raise WorkloadError(f"{where}: missing required key '{key}'")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"{where}.{key}: expected a number, got {shown(value)}")
    if value < minimum:
        raise WorkloadError(f"{where}.{key}: must be >= {minimum:g}, got {shown(value)}")
    return float(value)


MAX_LAYERS = 1_000_000


MAX_IMAGES = 100_000


MAX_DEVICES = 1_000_000


MAX_NAME = 200


DISTRIBUTIONS = ("uniform", "normal")


def finite(value: Any, where: str, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"{where}: expected a finite number, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{where}: must be >= {minimum:g}, got {shown(value)}")
    return float(value)


def integer(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise WorkloadError(f"{where}: expected an integer from {lo} to {hi}, got {shown(value)}")
    return value


def seed(doc: Mapping[str, Any], where: str) -> int:
    return integer(doc.get("seed", 0), f"{where}.seed", -(2**63), 2**63 - 1)


def check_keys(doc: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise WorkloadError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})")


def check_cost_list(spec: Any, where: str) -> tuple[float, ...]:
    if not isinstance(spec, list):
        raise WorkloadError(f"{where}: expected a list of numbers, got {kind_of(spec)}")
    if not spec:
        raise WorkloadError(f"{where}: the list of costs is empty")
    return tuple(finite(x, f"{where}[{i}]") for i, x in enumerate(spec))


def check_cost_spec(spec: Any, where: str) -> Any:
    """A per-microbatch cost: a number, a list of numbers, or a seeded distribution
    whose draws are never negative (every value finite)."""
    if isinstance(spec, list):
        return list(check_cost_list(spec, where))
    if isinstance(spec, dict):
        kinds = [k for k in DISTRIBUTIONS if k in spec]
        if len(kinds) != 1:
            raise WorkloadError(f"{where}: a distribution needs exactly one of 'uniform' or 'normal'")
        kind = kinds[0]
        check_keys(spec, {kind, "seed"}, where)
        pair = spec[kind]
        if not (isinstance(pair, list) and len(pair) == 2):
            raise WorkloadError(f"{where}.{kind}: expected [a, b], got {shown(pair)}")
        a, b = (finite(x, f"{where}.{kind}[{i}]") for i, x in enumerate(pair))
        if kind == "uniform" and a > b:
            raise WorkloadError(f"{where}.uniform: need low <= high, got {shown(pair)}")
        return {kind: [a, b], "seed": seed(spec, where)}
    return finite(spec, where)


def resolve_costs(spec: CostSpec, microbatches: int, where: str) -> list[float]:
    if isinstance(spec, (int, float)):
        return [float(spec)] * microbatches
    if isinstance(spec, list):
        if len(spec) != microbatches:
            raise WorkloadError(
                f"{where}: has {len(spec)} per-microbatch costs but the schedule has "
                f"{microbatches} microbatches"
            )
        return [float(x) for x in spec]
    rng = random.Random(spec.get("seed", 0))
    if "uniform" in spec:
        lo, hi = spec["uniform"]
        return [rng.uniform(lo, hi) for _ in range(microbatches)]
    mean, std = spec["normal"]
    return [max(0.0, rng.gauss(mean, std)) for _ in range(microbatches)]


# The modes a `recompute` section states: memory_model's, less "none" (nothing recomputed).
RECOMPUTE_MODES = tuple(mode for mode in MEMORY_RECOMPUTE_MODES if mode != "none")


def parse_recompute(doc: Any, activation: float, at: str, limit: str) -> dict[str, dict[str, float]] | None:
    """`recompute`: {mode: {"activation": memory kept, "f": time added}}, per
    layer for the LLM, per image for an encoder; what a mode keeps is at most
    `activation` (named `limit` in messages)."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise WorkloadError(f'{at}: expected {{"selective": {{...}}, "full": {{...}}}}')
    check_keys(doc, set(RECOMPUTE_MODES), at)
    out: dict[str, dict[str, float]] = {}
    for mode in RECOMPUTE_MODES:
        if mode not in doc:
            continue
        where = f"{at}.{mode}"
        spec = doc[mode]
        if not isinstance(spec, dict):
            raise WorkloadError(f'{where}: expected {{"activation": memory, "f": time}}')
        check_keys(spec, {"activation", "f"}, where)
        entry = {key: number(spec, key, where) for key in ("activation", "f") if key in spec}
        if entry.get("activation", 0.0) > activation:
            raise WorkloadError(f"{where}.activation: {entry['activation']:g} is more than {limit} "
                                f"({activation:g}): a recompute keeps at most what is kept without one")
        out[mode] = entry
    full, selective = out.get("full", {}).get("activation"), out.get("selective", {}).get("activation")
    if full is not None and selective is not None and full > selective:
        raise WorkloadError(f"{at}.full.activation: {full:g} is more than {at}.selective.activation "
                            f"({selective:g}): a full recompute keeps at most what a selective one keeps")
    return out


def kept(activation: float, recompute: Mapping[str, Mapping[str, float]] | None, mode: str) -> float:
    """What a recompute `mode` keeps: the figure given, else (full) what selective
    keeps, else `activation`."""
    if mode == "none" or recompute is None:
        return activation
    selective = recompute.get("selective", {}).get("activation", activation)
    if mode == "selective":
        return selective
    return recompute.get("full", {}).get("activation", selective)
