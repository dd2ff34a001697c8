"""From a run record (a saved schedule version, its workload and the run's
options, or `mpipe run`'s flags) to the job a launched process group
executes: `RunSpec` -> `prepare` -> `PreparedRun`, one set-up for both.

The built-in model follows the schedule's workload (LLM layers, the encoder,
trainable or frozen, images per microbatch) unless the run names a preset with
the `model` option; an own model (hf:..., a registered model, a plug-in) runs
as it is, on the workload's costs, and is refused if its parts do not fit the
schedule.  The options a queued run may carry, and the rules for them (the
queue applies the same ones at enqueue), are in `mpipe_core.runs.run_options`; a
queued run's model must be one the registry admits (`mpipe_core.runs.model_registry`),
and is refused before anything it names is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpipe_core.runs.model_spec import BatchShape, ModelSpec, is_own_model, preset_mismatch, spec_from_options
from mpipe_core.runs.run_options import (
    DEFAULT_STALL_S,
    DEFAULT_STARTUP_S,
    DEFAULT_TIMEOUT_S,
    OPTIMIZERS,
    check_run_options,
    devices_text,
)

from ..errors import RunSpecError

INTERACTIVE_STALL_S = 60.0  # `mpipe run --timeout`'s: someone is watching (a queued run's: DEFAULT_STALL_S)


@dataclass(frozen=True)
class RunSpec:
    """What a run asks for, from `mpipe run`'s flags or a queued run's record
    and options; `prepare` checks it and fills in the defaults."""

    term: str
    name: str = ""  # the job's name; "": the canonical term
    workload: Any = None  # a core workload (preset, file, dict); None: the model preset's
    model: str | None = None  # executor model preset or own model; None: sized from the workload
    model_config: str | None = None  # an own model's --model-config
    # A registered model's factory, as the registry that admitted the run names it.
    model_factory: str | None = None
    # May `model` be a package.module:factory path?  `mpipe run` (the user's own
    # code on their own machine) yes; a queued run never.
    import_paths: bool = True
    shape: Any = None  # an own model's BatchShape (None: the defaults)
    steps: int = 1
    nproc: int | None = None  # ranks per node; None: the schedule's devices / nnodes
    total_ranks: int | None = None  # a queued run's recorded rank count, checked against the schedule
    nnodes: int = 1
    backend: str = "gloo"
    optimizer: str = "sgd"
    lr: float | None = None
    momentum: float | None = None
    check_grads: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    stall_s: float = DEFAULT_STALL_S
    startup_s: float = DEFAULT_STARTUP_S
    # `--data FILE` / `-o data=PATH`: each step planned from its drawn batch (`data_run`).
    data: str | None = None
    plan_budget_ms: float | None = None  # per_batch's planning budget per step (None: the core's)
    profile: str | None = None  # `mpipe run --profile DIR`: each rank's profiler trace written to DIR
    # The layout (`mpipe_core.runs.layout.RunLayout`): a run spec's (`mpipe run --spec`), whose pp
    # must be the term's devices; None: the workload's parallel section with `parallel` over it.
    layout: Any = None
    parallel: dict | None = None  # `mpipe run --parallel`'s pairs (the layout keys; others price the run)
    precision: str = "fp32"  # `executor.runtime.precision`: fp32, or bf16 compute with fp32 master weights

    @classmethod
    def from_claimed(cls, claimed, registry=None) -> "RunSpec":
        """A `storage.ClaimedRun` and its options (checked again here, the model
        against this worker's registry, default: its environment's: a run queued
        by an older mpipe, or written to the database by hand, is refused before
        launch, and before anything it names is imported)."""
        from mpipe_core.runs.model_registry import load_registry
        from mpipe_core.workloads.workload import load_workload

        registry = registry or load_registry()
        options = check_run_options(claimed.options, ranks=claimed.nproc, registry=registry)
        own = spec_from_options(options)
        model = options.get("model")
        return cls(  # the saved workload (None: the default one), never the model preset's
            term=claimed.term, name=f"run-{claimed.id}", workload=load_workload(claimed.workload),
            model=model, model_config=options.get("model_config"),
            model_factory=registry.factory_of(model) if model else None, import_paths=False,
            shape=own.shape if own is not None else None, steps=claimed.steps, total_ranks=claimed.nproc,
            nnodes=options.get("nnodes", 1), backend=claimed.backend,
            optimizer=options.get("optimizer", "sgd"), lr=options.get("lr"), momentum=options.get("momentum"),
            check_grads=options.get("check_grads", False),
            precision=options.get("precision", "fp32"),
            timeout_s=options.get("timeout_s", DEFAULT_TIMEOUT_S),
            stall_s=options.get("stall_s", DEFAULT_STALL_S),
            startup_s=options.get("startup_s", DEFAULT_STARTUP_S),
            data=options.get("data"),
        )


@dataclass(frozen=True)
class PreparedRun:
    """A checked run: the job every rank executes and how to launch it."""

    spec: RunSpec
    job: Any  # executor.runtime.jobs.Job
    model: Any  # executor.runtime.model.ModelConfig, or an own model's ModelSpec
    evaluation: Any  # mpipe_core.api.Evaluation of the term on the run's workload
    devices: int  # the term's devices: one pipeline's ranks
    nproc_per_node: int
    layout: Any = None  # mpipe_core.runs.layout.RunLayout: the whole world's

    @property
    def term(self) -> str:
        return self.evaluation.term

    @property
    def world(self) -> int:
        """Ranks to start: tp * cp * pp * dp."""
        return self.layout.world if self.layout is not None else self.devices


def llm_chunks(schedule) -> int:
    """The chunks that hold LLM layers (with a folded tower, `balanced` may give some
    chunks encoder layers only)."""
    return max(p.chunks if p.encoder_layers is None else sum(1 for n in p.layers if n)
               for p in schedule.pipelines)


def model_for_workload(workload, chunks: int, preset: str | None = None):
    """The executor model a schedule evaluated on `workload` runs on."""
    from ..runtime.model import MODEL_PRESETS, ModelConfig

    encoders = list(workload.encoders)
    if len(encoders) > 1:
        raise RunSpecError(f"the executor's model has one encoder; workload '{workload.name}' has "
                           f"{[e.name for e in encoders]}")
    if preset is not None:
        if preset not in MODEL_PRESETS:
            raise RunSpecError(f"unknown model preset '{preset}' (presets: {', '.join(MODEL_PRESETS)})")
        cfg = MODEL_PRESETS[preset]
        # The rule the app and the queue apply before queueing (one rule, in the core).
        mismatch = preset_mismatch(preset, [(e.name, e.trainable) for e in encoders])
        if mismatch is not None:
            raise RunSpecError(mismatch)
    else:
        doc = MODEL_PRESETS["tiny"].to_dict()
        layers = workload.llm.layers
        doc["n_layer"] = layers if layers is not None else max(doc["n_layer"], chunks)
        if encoders:
            enc = encoders[0]
            doc.update(encoder=enc.name, trainable_encoder=enc.trainable)
            if enc.layers > 1:  # the tower's blocks, as `balanced` folds them (1: the whole tower)
                doc["enc_layers"] = enc.layers
            if enc.images is not None:
                doc.update(images_min=int(enc.images["min"]), images_max=int(enc.images["max"]),
                           images_seed=int(enc.images.get("seed", 0)))
        else:
            doc["encoder"] = None
        cfg = ModelConfig.from_dict(doc)
    if cfg.n_layer < chunks:
        raise RunSpecError(f"the model has {cfg.n_layer} LLM layers but the schedule needs {chunks} chunks")
    return cfg


def own_model_spec(spec: RunSpec):
    """The run's own model (hf:..., a registered model, a plug-in) as a `ModelSpec`
    whose factory is resolved (so the ranks need no registry), or None for the
    built-in one."""
    if not is_own_model(spec.model):
        if spec.model_config is not None:
            raise RunSpecError("--model-config (model_config) is for own models (hf:..., registered models, "
                               "package.module:factory)")
        return None
    own = ModelSpec(spec.model, spec.model_config, spec.shape or BatchShape(), spec.model_factory)
    if own.kind == "plugin" and not spec.import_paths:  # check_run_options refused it already
        raise RunSpecError(f"model {spec.model!r}: a queued run never imports a module:function name")
    if own.kind == "registered" and own.factory is None:
        from mpipe_core.runs.model_registry import load_registry

        factory = load_registry().factory_of(own.model)
        if factory is not None:
            own = ModelSpec(own.model, own.config, own.shape, factory)
    return own


def check_own_model(term: str, workload: Any, options: dict[str, Any], registry=None) -> None:
    """Refuse, at enqueue time, a run whose own model is not admitted (before
    anything is imported), cannot be built or does not fit the schedule (an
    MpipeError, one line).  Nothing to check for the built-in model."""
    from mpipe_core.runs.model_registry import load_registry

    registry = registry or load_registry()
    own = spec_from_options(check_run_options(options, registry=registry))
    if own is not None:
        from ..runtime.models.loader import load_model
        from ..runtime.models.workload import evaluate_for_model

        own = ModelSpec(own.model, own.config, own.shape, registry.factory_of(own.model))
        evaluate_for_model(term, load_model(own, partial=True), workload)  # (structure only)


def _with_data(spec: RunSpec):
    """(model, evaluation, workload with the data) for a run with `--data`: the
    built-in model sized for the data's longest pack, or an own model with a
    `data_batch`; the workload's encoder costs are then per tile."""
    from dataclasses import replace

    from mpipe_core.api import evaluate_once
    from mpipe_core.workloads.workload import load_workload

    from ..runtime.model import MODEL_PRESETS
    from ..runtime.model_workload import workload_for
    from .data_run import check_data_model, data_spec, with_data

    own = own_model_spec(spec)
    if own is not None:
        from ..runtime.models.loader import load_model
        from ..runtime.models.workload import evaluate_for_model, model_workload

        model = load_model(own, partial=True)  # (its structure: no weights read)
        check_data_model(model, own.model)
        per_tile = model.feature_shape()[0] if model.encoder is not None else 1
        wl = load_workload(spec.workload if spec.workload is not None else model_workload(model))
        wl = with_data(wl, data_spec(spec.data, per_tile, (wl.source or {}).get("data")))
        return own, evaluate_for_model(spec.term, model, wl), wl
    name = spec.model or "tiny"
    if name not in MODEL_PRESETS:
        raise RunSpecError(f"unknown model preset '{name}' (presets: {', '.join(MODEL_PRESETS)})")
    if spec.workload is None:
        cfg = MODEL_PRESETS[name]
        data = data_spec(spec.data, cfg.tokens_per_image)
        cfg = replace(cfg, max_seq=data.packing.max_tokens, batch=1)
        wl = with_data(load_workload(workload_for(cfg, name=f"model:{name}")), data)
        return cfg, evaluate_once(spec.term, wl), wl
    wl = load_workload(spec.workload)
    data = data_spec(spec.data, MODEL_PRESETS[name].tokens_per_image, (wl.source or {}).get("data"))
    wl = with_data(wl, data)
    evaluation = evaluate_once(spec.term, wl)
    chunks = llm_chunks(evaluation.schedule)
    cfg = model_for_workload(evaluation.workload, chunks, spec.model)
    return replace(cfg, max_seq=data.packing.max_tokens, batch=1), evaluation, wl


def _model_and_evaluation(spec: RunSpec):
    """The executor model and the evaluated term: an own model as it is (on the
    given workload's costs, or its structural workload), or the built-in model
    sized from the workload (a preset, if named, must match it), or, with no
    workload, the preset's own description as a workload."""
    from mpipe_core.api import evaluate_once

    from ..runtime.model import MODEL_PRESETS
    from ..runtime.model_workload import workload_for

    own = own_model_spec(spec)
    if own is not None:
        from ..runtime.models.loader import load_model
        from ..runtime.models.workload import evaluate_for_model

        return own, evaluate_for_model(spec.term, load_model(own, partial=True), spec.workload)

    if spec.workload is None:
        name = spec.model or "tiny"
        if name not in MODEL_PRESETS:
            raise RunSpecError(f"unknown model preset '{name}' (presets: {', '.join(MODEL_PRESETS)})")
        cfg = MODEL_PRESETS[name]
        return cfg, evaluate_once(spec.term, workload_for(cfg, name=f"model:{name}"))
    evaluation = evaluate_once(spec.term, spec.workload)
    chunks = llm_chunks(evaluation.schedule)
    return model_for_workload(evaluation.workload, chunks, spec.model), evaluation


def run_layout(spec: RunSpec, devices: int, workload) -> Any:
    """The run's layout: a run spec's, or the workload's `parallel` section with
    `--parallel` over it; pp is always the term's devices."""
    from mpipe_core.runs.layout import runnable_workload_layout, workload_layout
    from mpipe_core.workloads.analytic import PARALLEL_KEYS

    if spec.layout is not None:
        if spec.layout.pp != devices:
            raise RunSpecError(f"the run spec's layout has pp={spec.layout.pp} but the term places ops on "
                               f"{devices} devices")
        return spec.layout
    if spec.parallel:
        unknown = sorted(set(spec.parallel) - PARALLEL_KEYS)
        if unknown:
            raise RunSpecError(f"--parallel: unknown key '{unknown[0][:30]}' (known: {', '.join(sorted(PARALLEL_KEYS))})")
    source = getattr(workload, "source", None)
    if not spec.parallel:  # the saved workload's layout runs as a whole, or not at all (`what_ran` says so)
        return runnable_workload_layout(source, devices)
    return workload_layout(source, devices, spec.parallel, "--parallel")


def prepare(spec: RunSpec) -> PreparedRun:
    """Check a run and build its job: the one set-up of `mpipe run` and of
    queued runs.  Raises RunSpecError (an MpipeError) for a run that cannot
    be launched as asked, before anything is launched."""
    from ..runtime.jobs import Job
    from ..runtime.model import ModelConfig
    from ..runtime.plan import build_plan
    from ..runtime.runtime import OptimizerSpec

    if spec.steps < 1:
        raise RunSpecError("--steps must be >= 1")
    steps = None
    if spec.data is not None:
        from ..runtime.jobs import schedule_from_dict
        from ..runtime.step_plans import check_same_placement
        from .data_run import step_plans

        cfg, evaluation, data_workload = _with_data(spec)
        has_encoder = bool(evaluation.workload.encoders)
        # Each data-parallel replica draws its own share of every step's batch.
        dp = run_layout(spec, evaluation.schedule.devices, evaluation.workload).dp
        steps = step_plans(spec.term, data_workload, spec.steps, has_encoder, spec.plan_budget_ms, dp)
        plans = [build_plan(schedule_from_dict(s["schedule"])) for s in steps]
        check_same_placement(plans)
        schedule = schedule_from_dict(steps[0]["schedule"])
    else:
        cfg, evaluation = _model_and_evaluation(spec)
        schedule = evaluation.schedule
    build_plan(schedule)  # refuse what cannot run before launching anything
    chunks = llm_chunks(schedule)
    if isinstance(cfg, ModelConfig) and cfg.n_layer < chunks:
        raise RunSpecError(f"the model has {cfg.n_layer} LLM layers but the schedule needs {chunks} chunks")
    folded = schedule.pipelines[0].encoder_layers
    if isinstance(cfg, ModelConfig) and folded is not None and sum(folded) not in (1, cfg.enc_layers):
        raise RunSpecError(f"the schedule folds {sum(folded)} encoder layers into its chunks but the model's "
                           f"tower has {cfg.enc_layers} blocks; give the workload's encoder layers: {cfg.enc_layers}")
    devices = schedule.devices
    layout = run_layout(spec, devices, evaluation.workload)
    from ..parallel.layout_checks import builtin_dims, check_layout, own_model_dims

    if isinstance(cfg, ModelConfig):
        dims = builtin_dims(cfg)
    else:
        from ..runtime.models.loader import load_model

        loaded = load_model(cfg) if layout.tp > 1 else None
        dims = own_model_dims(loaded, f"model {spec.model}")
        if loaded is not None and dims.tp_plan:
            loaded.tp_plan(layout.sp)  # a plan the model cannot give (an HF style we do not map) is refused here
    check_layout(layout, dims, data=spec.data is not None)
    world = layout.world
    needed = devices_text(devices, sum(p.encoder_devices for p in schedule.pipelines))
    if world != devices:
        needed = f"{world} ranks (the layout {layout.describe()}; the term's {needed} per pipeline)"
    if spec.total_ranks is not None and spec.total_ranks != world:
        raise RunSpecError(f"the run asks for {spec.total_ranks} ranks but the schedule places ops on {needed}")
    nproc = spec.nproc or world // spec.nnodes
    if nproc * spec.nnodes != world:
        if spec.nproc is None:
            raise RunSpecError(f"{world} ranks do not split evenly over {spec.nnodes} nodes")
        raise RunSpecError(f"the schedule places ops on {needed} but {nproc} x {spec.nnodes} "
                           "ranks were asked for")
    opt = OptimizerSpec(name=spec.optimizer)
    if opt.name not in OPTIMIZERS:
        raise RunSpecError(f"unknown optimizer '{opt.name}' ({', '.join(OPTIMIZERS)})")
    if spec.lr is not None:
        opt.lr = spec.lr
    elif opt.name == "adamw":
        opt.lr = 1e-3
    if spec.momentum is not None:
        opt.momentum = spec.momentum
    if spec.precision not in ("fp32", "bf16"):
        raise RunSpecError(f"unknown precision '{spec.precision}' (fp32, bf16)")
    trivial = world == devices and not layout.distributed_optimizer and layout.encoder_shard == "none"
    job = Job.make(spec.name or evaluation.term, schedule, cfg, steps=spec.steps, check_grads=spec.check_grads,
                   optimizer=opt.__dict__, data_steps=steps, layout=None if trivial else layout.to_dict(),
                   profile_dir=None if spec.profile is None else str(Path(spec.profile).resolve()),
                   precision=spec.precision)
    return PreparedRun(spec=spec, job=job, model=cfg, evaluation=evaluation, devices=devices,
                       nproc_per_node=nproc, layout=layout)


def prepare_run(claimed, registry=None) -> PreparedRun:
    """A `storage.ClaimedRun` -> what to launch (its model checked against `registry`,
    default: this process's)."""
    return prepare(RunSpec.from_claimed(claimed, registry))


def main(argv: list[str] | None = None) -> int:
    """`python -m executor.service.run_setup --check-model FILE`: `check_own_model` of the
    run FILE describes (JSON: {"term", "workload", "options"}), in a process of its own, for
    a caller that must not import torch (the app).  Nothing is queued or written; a refusal
    is one `error: ...` line on stderr and exit 2 (as the CLI's), success exit 0."""
    import argparse
    import json
    import sys

    from mpipe_core.errors import MpipeError

    parser = argparse.ArgumentParser(prog="python -m executor.service.run_setup")
    parser.add_argument("--check-model", metavar="FILE", required=True,
                        help='JSON {"term": ..., "workload": ..., "options": {...}}: refuse an own model that is '
                             "not admitted, cannot be built or does not fit the schedule")
    args = parser.parse_args(argv)
    try:
        with open(args.check_model, encoding="utf-8") as f:
            run = json.load(f)
        check_own_model(run["term"], run.get("workload"), run.get("options") or {})
    except MpipeError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    return 0


def what_ran(prep: PreparedRun) -> list[str]:
    """Which model ran, on which devices, and what of the workload's layout it
    dropped (`mpipe_core.runs.run_identity`): for `mpipe run`'s output and a queued run's summary."""
    from mpipe_core.runs.run_identity import identity_lines

    from ..runtime.model import ModelConfig

    cfg = prep.model
    if isinstance(cfg, ModelConfig):
        encoder = (f"encoder {cfg.encoder} ({'trainable' if cfg.trainable_encoder else 'frozen'})"
                   if cfg.encoder else "no encoder")
        name = prep.spec.model or ("tiny" if prep.spec.workload is None else "sized from the workload")
        text = f"the built-in model {name} ({cfg.n_layer} LLM layers of width {cfg.d_model}, {encoder})"
    else:
        text = f"own model {cfg}"
    wl = prep.evaluation.workload
    doc = wl.source if wl.source is not None else wl.to_dict()
    kind = {"gloo": "CPU", "nccl": "CUDA", "hccl": "Ascend NPU"}.get(prep.spec.backend, prep.spec.backend)
    executed = prep.layout.to_dict() if prep.layout is not None else None
    return identity_lines(doc, prep.spec.model or "", text, prep.world, f"{prep.spec.backend}, {kind}",
                          executed, prep.devices)


def runs_same_model(prep: PreparedRun) -> bool:
    """Whether the run's workload describes the model that ran (a prediction on it is one of this run)."""
    from mpipe_core.runs.run_identity import same_model

    wl = prep.evaluation.workload
    return same_model(wl.source if wl.source is not None else wl.to_dict(), prep.spec.model or "")


def model_prediction(prep: PreparedRun):
    """The term evaluated on the workload of the model that ran: the run's own workload
    when it describes that model (`runs_same_model`), else the model's structural
    workload (its layers, encoder and images; costs relative to one LLM layer's forward)."""
    from mpipe_core.api import evaluate_once

    from ..runtime.model import ModelConfig
    from ..runtime.model_workload import workload_for

    if runs_same_model(prep) or prep.spec.data is not None:
        return prep.evaluation
    cfg = prep.model
    if isinstance(cfg, ModelConfig):
        return evaluate_once(prep.spec.term, workload_for(cfg, name=f"model:{prep.spec.model or 'built-in'}"))
    from ..runtime.models.loader import load_model
    from ..runtime.models.workload import evaluate_for_model

    return evaluate_for_model(prep.spec.term, load_model(cfg, partial=True), None)


if __name__ == "__main__":
    raise SystemExit(main())
