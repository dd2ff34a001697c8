"""A job: one schedule, one model, K steps; what a launched process group runs.

Jobs travel to the ranks as JSON, so a launch can run a whole list of them
(starting ranks costs seconds; a schedule's step costs milliseconds).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mpipe_core.ops import Op
from mpipe_core.schedule import Pipeline, Schedule

from .model import ModelConfig
from .runtime import OptimizerSpec


def schedule_to_dict(s: Schedule) -> dict[str, Any]:
    return {
        "orders": [[list(op) for op in order] for order in s.orders],
        "pipelines": [asdict(p) for p in s.pipelines],
        "encoders": list(s.encoders),
    }


def schedule_from_dict(doc: dict[str, Any]) -> Schedule:
    return Schedule(
        orders=tuple(tuple(Op(*op) for op in order) for order in doc["orders"]),
        pipelines=tuple(Pipeline(**p) for p in doc["pipelines"]),
        encoders=tuple(doc.get("encoders", ())),
    )


@dataclass
class Job:
    name: str
    schedule: dict[str, Any]
    model: dict[str, Any] = field(default_factory=lambda: ModelConfig().to_dict())
    steps: int = 1
    optimizer: dict[str, Any] = field(default_factory=lambda: asdict(OptimizerSpec()))
    check_grads: bool = False
    fault: dict[str, Any] | None = None  # test hook, see RankRuntime._maybe_fault

    @classmethod
    def make(cls, name: str, schedule: Schedule, model: ModelConfig, **kw) -> "Job":
        return cls(name=name, schedule=schedule_to_dict(schedule), model=model.to_dict(), **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Job":
        return cls(**doc)
