"""One line saying what building each rank's part of the model cost
(`executor.runtime.models.materialise.BuildMemory`, per rank in a result's memory)."""
from __future__ import annotations

from typing import Any


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MB"


def build_memory_line(memory: list[dict[str, Any]] | None) -> str | None:
    """`build memory per rank: rank 0 peak 338.2 MB (+81.3 MB), parameters 0.3 MB; ...`,
    None when no rank measured its build."""
    built = [m for m in memory or [] if m.get("build")]
    if not built:
        return None
    return "build memory per rank (process peak resident, its rise over the build, parameters made): " + "; ".join(
        f"rank {m['rank']} peak {_mb(m['build']['peak'])} (+{_mb(m['build']['growth'])}), "
        f"parameters {_mb(m['build']['parameters'])}" for m in built)
