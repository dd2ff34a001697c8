"""From a run record (a saved schedule version, its workload and the run's
options) to the job a launched process group executes.

The model follows the schedule's workload (LLM layers, the encoder, trainable
or frozen, images per microbatch) unless the run names a preset with the
`model` option.  Options a run may carry (`mpipe runs enqueue -o KEY=VALUE`):

=============  ===============================================================
model          executor model preset (tiny, tiny-text, small, vit-heavy, ...)
optimizer      sgd (default) or adamw;  `lr`, `momentum` as in `mpipe run`
check_grads    true: compare loss and gradients with a single-process
               reference run; a mismatch fails the run
timeout_s      wall-clock limit of the whole run (default 3600): past it the
               run is stopped and marked failed
stall_s        no op progress for this long = hung (default 120)
startup_s      every rank must be up within this (default 300)
nnodes         nodes to spread the ranks over (cluster launchers; default 1)
=============  ===============================================================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import RunSpecError

RUN_OPTIONS = {
    "model": str, "optimizer": str, "lr": float, "momentum": float, "check_grads": bool,
    "timeout_s": float, "stall_s": float, "startup_s": float, "nnodes": int,
}
DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_STALL_S = 120.0
DEFAULT_STARTUP_S = 300.0


@dataclass
class PreparedRun:
    run_id: int
    term: str
    job: Any  # executor.runtime.jobs.Job
    evaluation: Any  # mpipe_core.api.Evaluation of the term on the run's workload
    devices: int
    nnodes: int
    nproc_per_node: int
    backend: str
    timeout_s: float
    stall_s: float
    startup_s: float
    check_grads: bool


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in options.items():
        kind = RUN_OPTIONS.get(key)
        if kind is None:
            raise RunSpecError(f"unknown run option '{key}' (known: {', '.join(sorted(RUN_OPTIONS))})")
        if kind is bool:
            if not isinstance(value, bool):
                raise RunSpecError(f"run option {key}: expected true or false, got {value!r}")
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RunSpecError(f"run option {key}: expected a positive integer, got {value!r}")
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise RunSpecError(f"run option {key}: expected a positive number, got {value!r}")
            value = float(value)
        elif not isinstance(value, str):
            raise RunSpecError(f"run option {key}: expected text, got {value!r}")
        out[key] = value
    return out


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
        want = (encoders[0].name, encoders[0].trainable) if encoders else (None, None)
        have = (cfg.encoder, cfg.trainable_encoder if cfg.encoder else None)
        if want != have:
            raise RunSpecError(f"model preset '{preset}' has encoder {have[0] or 'none'}"
                               f"{' (trainable)' if have[1] else ''}, but the schedule's workload has "
                               f"{want[0] or 'none'}{' (trainable)' if want[1] else ''}")
    else:
        doc = MODEL_PRESETS["tiny"].to_dict()
        layers = workload.llm.layers
        doc["n_layer"] = layers if layers is not None else max(doc["n_layer"], chunks)
        if encoders:
            enc = encoders[0]
            doc.update(encoder=enc.name, trainable_encoder=enc.trainable)
            if enc.images is not None:
                doc.update(images_min=int(enc.images["min"]), images_max=int(enc.images["max"]),
                           images_seed=int(enc.images.get("seed", 0)))
        else:
            doc["encoder"] = None
        cfg = ModelConfig.from_dict(doc)
    if cfg.n_layer < chunks:
        raise RunSpecError(f"the model has {cfg.n_layer} LLM layers but the schedule needs {chunks} chunks")
    return cfg


def prepare_run(claimed) -> PreparedRun:
    """A `storage.ClaimedRun` -> what to launch.  Raises MpipeError for a run
    that cannot be launched as recorded."""
    from mpipe_core.api import evaluate

    from ..runtime.jobs import Job
    from ..runtime.plan import build_plan
    from ..runtime.runtime import OptimizerSpec

    options = check_options(dict(claimed.options))
    evaluation = evaluate(claimed.term, claimed.workload)
    schedule = evaluation.schedule
    build_plan(schedule)  # refuse what cannot run before launching anything
    chunks = max(p.chunks for p in schedule.pipelines)
    cfg = model_for_workload(evaluation.workload, chunks, options.get("model"))
    devices = schedule.devices
    if claimed.nproc != devices:
        raise RunSpecError(f"the run asks for {claimed.nproc} ranks but the schedule places ops on "
                           f"{devices} devices")
    nnodes = options.get("nnodes", 1)
    if devices % nnodes:
        raise RunSpecError(f"{devices} ranks do not split evenly over {nnodes} nodes")
    opt = OptimizerSpec(name=options.get("optimizer", "sgd"))
    if opt.name not in ("sgd", "adamw"):
        raise RunSpecError(f"unknown optimizer '{opt.name}' (sgd, adamw)")
    if "lr" in options:
        opt.lr = options["lr"]
    elif opt.name == "adamw":
        opt.lr = 1e-3
    if "momentum" in options:
        opt.momentum = options["momentum"]
    check = options.get("check_grads", False)
    job = Job.make(f"run-{claimed.id}", schedule, cfg, steps=claimed.steps, check_grads=check,
                   optimizer=opt.__dict__)
    return PreparedRun(
        run_id=claimed.id, term=evaluation.term, job=job, evaluation=evaluation, devices=devices,
        nnodes=nnodes, nproc_per_node=devices // nnodes, backend=claimed.backend,
        timeout_s=options.get("timeout_s", DEFAULT_TIMEOUT_S),
        stall_s=options.get("stall_s", DEFAULT_STALL_S),
        startup_s=options.get("startup_s", DEFAULT_STARTUP_S), check_grads=check,
    )
