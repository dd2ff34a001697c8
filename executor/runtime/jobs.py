"""A job: one schedule, one model, K steps; what a launched process group runs.

Jobs travel to the ranks as JSON, so a launch can run a whole list of them
(starting ranks costs seconds; a schedule's step costs milliseconds).  Their
results come back as JSON too, one line per job, read into `JobResult`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mpipe_core.ir.ops import Op
from mpipe_core.ir.schedule import Pipeline, Schedule
from mpipe_core.ir.timeline_record import TimelineRecord
from mpipe_core.runs.layout import RunLayout
from mpipe_core.runs.model_spec import ModelSpec

from .model import ModelConfig
from .models.builtin import BuiltinModel
from .models.loader import BUILD_LOCK, import_libraries, load_model
from .models.protocol import PipelineModel
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
        pipelines=tuple(Pipeline(**_tuples(p)) for p in doc["pipelines"]),
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
    # An own model (`mpipe_core.runs.model_spec.ModelSpec.to_dict()`); None: the built-in `model`.
    own_model: dict[str, Any] | None = None
    # `mpipe run --data`: per step {"schedule", "packs" (per slot: {"key", "pieces", "piece_keys"}), "plan"}
    # (`executor.service.data_run.step_plans`); None: every step runs `schedule` on seeded batches.
    data_steps: list[dict[str, Any]] | None = None
    # `mpipe run --profile DIR`: each rank's steps under the device's profiler, written to DIR (`op_profiler`).
    profile_dir: str | None = None
    # The run's layout (`mpipe_core.runs.layout.RunLayout.to_dict()`); None: one pipeline replica.
    layout: dict[str, Any] | None = None
    precision: str = "fp32"  # `executor.runtime.precision`: fp32, or bf16 compute with fp32 master weights

    @classmethod
    def make(cls, name: str, schedule: Schedule, model: "ModelConfig | ModelSpec", **kw) -> "Job":
        if isinstance(model, ModelSpec):
            return cls(name=name, schedule=schedule_to_dict(schedule), own_model=model.to_dict(), **kw)
        return cls(name=name, schedule=schedule_to_dict(schedule), model=model.to_dict(), **kw)

    def build_model(self, partial: bool = False) -> PipelineModel:
        """A fresh instance of the job's model (every rank builds the same one).
        `partial`: on the meta device where the model can be built so, for a rank
        to make only its own parts real (`models.materialise`: the built-in model, HF
        models, plug-ins giving `init_parameter`)."""
        if self.own_model is not None:
            return load_model(ModelSpec.from_dict(self.own_model), partial=partial)
        with BUILD_LOCK:  # (its layers' default initialisers draw from torch's global generator)
            return BuiltinModel(ModelConfig.from_dict(self.model), meta=partial)

    def import_model_libraries(self) -> None:
        """Import what building the job's model imports (transformers, a plug-in's module),
        so that a rank's build memory (`models.materialise.BuildMemory`) is the model's."""
        if self.own_model is not None:
            import_libraries(ModelSpec.from_dict(self.own_model))

    def run_layout(self, devices: int) -> RunLayout:
        """The job's layout; without one, a single pipeline over the schedule's devices."""
        return RunLayout.from_dict(self.layout) if self.layout is not None else RunLayout(pp=devices)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Job":
        return cls(**doc)


@dataclass(frozen=True)
class JobResult:
    """What rank 0 reports for a finished job (times in seconds on rank 0's clock)."""

    name: str
    devices: int
    chunks: int
    microbatches: int
    steps: int
    loss: list[float | None]  # per step, summed over the ranks that compute it
    makespan: list[float]  # per step
    timeline: list[TimelineRecord]  # every op of every step, from the first step's start
    waits: list[float]  # per timeline record: how long the op waited for its input
    clock_offsets: list[float]  # per rank
    grad_check: dict[str, Any] | None = None  # with check_grads: see `reference.check_step`
    # Per rank (rank order), `memory_meter.RankMemory.as_dict()`: the activation peak and static bytes.
    memory: list[dict[str, Any]] | None = None
    # With --data: per step the plan it ran (`data_run.step_plans`' "plan": how, digest, order, ...).
    plans: list[dict[str, Any]] | None = None
    # The first pipeline's timed work besides ops, per step: dp reductions (`dp_comm`), ZeRO
    # gathers (`dp_gather`) and optimizer steps (`optimizer`); microbatch -1, chunk -1 = none.
    comm: list[TimelineRecord] = field(default_factory=list)
    layout: dict[str, Any] | None = None  # the job's layout, as run

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the results file, `mpipe run --json`): timeline rows
        are the records' dicts plus the op's input wait."""
        doc = {key: getattr(self, key) for key in
               ("name", "devices", "chunks", "microbatches", "steps", "loss", "makespan")}
        doc["timeline"] = [{**r.as_dict(), "wait": w} for r, w in zip(self.timeline, self.waits)]
        doc["clock_offsets"] = self.clock_offsets
        if self.grad_check is not None:
            doc["grad_check"] = self.grad_check
        if self.memory is not None:
            doc["memory"] = self.memory
        if self.plans is not None:
            doc["plans"] = self.plans
        if self.comm:
            doc["comm"] = [r.as_dict() for r in self.comm]
        if self.layout is not None:
            doc["layout"] = self.layout
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "JobResult":
        rows = doc["timeline"]
        return cls(name=doc["name"], devices=doc["devices"], chunks=doc["chunks"],
                   microbatches=doc["microbatches"], steps=doc["steps"], loss=doc["loss"],
                   makespan=doc["makespan"], timeline=[TimelineRecord.from_dict(r) for r in rows],
                   waits=[r.get("wait", 0.0) for r in rows], clock_offsets=doc["clock_offsets"],
                   grad_check=doc.get("grad_check"), memory=doc.get("memory"), plans=doc.get("plans"),
                   comm=[TimelineRecord.from_dict(r) for r in doc.get("comm", [])], layout=doc.get("layout"))


def _tuples(doc: dict[str, Any]) -> dict[str, Any]:
    """JSON gives lists; a Pipeline's layer splits (and recompute pairs) are tuples."""
    return {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
            for k, v in doc.items()}
