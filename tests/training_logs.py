"""Training-log text as each stack writes it (the f-strings of Megatron-LM's and
MindSpeed-MM FSDP's `training_log`, torchtitan's `MetricsProcessor.log`, with its
ANSI colours), for the `calibrate --log` tests."""
from __future__ import annotations

RED, GREEN, ORANGE, TURQUOISE, BLUE, CYAN, MAGENTA, RESET = (
    "\033[31m", "\033[32m", "\033[33m", "\033[36m", "\033[34m", "\033[96m", "\033[35m", "\033[39m")


def megatron_line(iteration: int, total: int, ms: float, tflops: float | None = None, batch: int = 16) -> str:
    line = f" [2026-12-07 10:00:{iteration % 60:02d}]"
    line += " iteration {:8d}/{:8d} |".format(iteration, total)
    line += " consumed samples: {:12d} |".format(iteration * batch)
    line += " elapsed time per iteration (ms): {:.1f} |".format(ms)
    if tflops is not None:
        line += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    line += " learning rate: {:.6E} |".format(3e-4)
    line += " global batch size: {:5d} |".format(batch)
    line += " lm loss: {:.6E} |".format(7.5)
    line += " loss scale: {:.1f} |".format(1.0)
    line += " grad norm: {:.3f} |".format(1.25)
    line += " number of skipped iterations: {:3d} |".format(0)
    line += " number of nan iterations: {:3d} |".format(0)
    return line


def megatron_log(times_ms: list[float], *, world: int | None = 16, tflops: list[float] | None = None) -> str:
    head = ["> initializing torch distributed ..."]
    if world is not None:
        head.append(f"using world size: {world}, data-parallel size: 2, context-parallel size: 1, "
                    "hierarchical context-parallel sizes: None, tensor-model-parallel size: 2, "
                    "pipeline-model-parallel size: 4")
    body = [megatron_line(i + 1, len(times_ms), t, tflops[i] if tflops else None) for i, t in enumerate(times_ms)]
    return "\n".join(head + body) + "\n"


def mindspeed_mm_line(iteration: int, total: int, ms: float, batch: int = 16) -> str:
    line = " [2026-12-07 10:00:00]"
    line += " iteration {:8d}/{:8d} |".format(iteration, total)
    line += " consumed samples: {:12d} |".format(iteration * batch)
    line += " elapsed time per iteration (ms): {:.1f} |".format(ms)
    line += " learning rate: {:.6E} |".format(1e-5)
    line += " global batch size: {:5d} |".format(batch)
    line += " loss: {:.6E} |".format(1.5)
    line += " grad norm: {:.3f} |".format(0.9)
    return line


def mindspeed_mm_log(times_ms: list[float]) -> str:
    return "\n".join(["Start initializing training environment!!!"]
                     + [mindspeed_mm_line(i + 1, len(times_ms), t) for i, t in enumerate(times_ms)]) + "\n"


def torchtitan_line(step: int, tps: float, tflops: float, mfu: float) -> str:
    return (f"[rank0]:[titan] 2026-12-07 10:00:00,000 - root - INFO - "
            f"{RED}step: {step:2}  {GREEN}loss: {7.5:8.5f}  {ORANGE}grad_norm: {1.1:7.4f}  "
            f"{TURQUOISE}memory: {30.12:5.2f}GiB({38.0:.2f}%)  {BLUE}tps: {round(tps):,}  "
            f"{CYAN}tflops: {tflops:,.2f}  {MAGENTA}mfu: {mfu:.2f}%{RESET}")


def torchtitan_log(tps: list[float], *, mesh: tuple[list[str], list[int]] | None = (["dp_shard", "tp"], [8, 2])
                   ) -> str:
    head = ["[rank0]:[titan] 2026-12-07 10:00:00,000 - root - INFO - Starting job: Llama 2 7B training"]
    if mesh is not None:
        head.append(f"[rank0]:[titan] 2026-12-07 10:00:00,000 - root - INFO - Building {len(mesh[1])}-D device "
                    f"mesh with {mesh[0]}, {mesh[1]}")
    body = [torchtitan_line(i + 1, x, 100.0, 30.0) for i, x in enumerate(tps)]
    # a validation line has a tps too, and is not a training step
    body.append(f"[rank0]:[titan] {BLUE}validate step: 10  {GREEN}loss: 7.4000  memory: 30.00GiB(38.00%)  "
                f"{BLUE}tps: 99,999{RESET}")
    return "\n".join(head + body) + "\n"
