"""The model a launched run trains, and profiling a model into a saved workload.

The app never imports torch: what needs a model built (refusing a model that
cannot load, measuring one) runs in a subprocess (the run set-up's check, the
CLI's `mpipe profile`), so the page gives exactly the messages `mpipe runs enqueue`
and `mpipe profile` give; the run itself is queued in the app's process, under the
signed-in user.  A browser
only ever picks a model the server's registry admits (`mpipe_core.runs.model_registry`:
presets, registered names, hf:llava / hf:qwen2_5_vl, checkpoints under the
checkpoint root); the same rule is applied again, on the server, before anything
is queued or profiled."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import streamlit as st

from mpipe_core.errors import MpipeError
from mpipe_core.runs.model_registry import ModelRegistry, load_registry
from mpipe_core.runs.model_spec import HF_MODELS, BatchShape, ModelSpec
from mpipe_core.runs.run_options import MODEL_PRESET_NAMES

FROM_WORKLOAD, PRESET, HF, CHECKPOINT, REGISTERED = (
    "Sized from the workload", "Built-in preset", "HuggingFace", "Local checkpoint", "Registered model")
HF_CONFIGS = ("tiny", "tiny-frozen", "small", "frozen")
CLI_TIMEOUT_S = 900  # a profile of a small model takes tens of seconds; a stuck one must not hang the page


def registry() -> ModelRegistry:
    """The server's model registry, read again on every rerun (metadata and the
    allow-list file only: a few milliseconds, and an operator's edit shows at once)."""
    return load_registry()


def model_picker(key: str) -> ModelSpec | None:
    """The model a run trains (None: the executor's model sized from the workload)."""
    reg = registry()
    kind = st.radio("Model", [FROM_WORKLOAD, PRESET, HF, CHECKPOINT, REGISTERED], horizontal=True,
                    key=f"{key}.kind",
                    help="what the run trains: the built-in model, a HuggingFace adapter, a local checkpoint "
                         "under the server's checkpoint root (hf:/path) or a model registered on the server")
    if kind == FROM_WORKLOAD:
        return None
    if kind == PRESET:
        return ModelSpec(st.selectbox("Preset", MODEL_PRESET_NAMES, key=f"{key}.preset"))
    cols = st.columns([3, 2])
    if kind == HF:
        name = cols[0].selectbox("HuggingFace model", HF_MODELS, key=f"{key}.hf")
        config = cols[1].selectbox("Model config", HF_CONFIGS, key=f"{key}.hf_config")
    else:
        if kind == CHECKPOINT:
            root = reg.checkpoint_root
            name = "hf:" + cols[0].text_input(
                "Checkpoint folder", key=f"{key}.path", placeholder=f"{root or '/path'}/...",
                help=f"a save_pretrained folder under the checkpoint root {root}" if root else
                "the operator has set no checkpoint root (checkpoint_root in the model allow-list): "
                "local checkpoints are refused").strip()
        else:
            names = reg.names()
            name = cols[0].selectbox("Registered model", names, key=f"{key}.registered",
                                     help="an mpipe.models entry point or a name in the server's model "
                                          "allow-list (`mpipe models` lists them)")
            if name is None:
                st.info("No models are registered on this server (docs/team-server.md, Registering models).")
                return None
        config = cols[1].text_input("Model config", key=f"{key}.config", placeholder="(none)",
                                    help="passed to the model (hf: tiny, tiny-frozen, small, frozen)").strip() or None
    cols = st.columns(3)
    shape = BatchShape(
        microbatch_size=int(cols[0].number_input("Microbatch size", 1, 4096, 1, key=f"{key}.mbs")),
        text_len=int(cols[1].number_input("Seq len (text tokens)", 1, 1_000_000, 8, key=f"{key}.seq_len")),
        images=int(cols[2].number_input("Images per sample", 1, 100_000, 1, key=f"{key}.images")))
    return ModelSpec(name, config, shape)


def spec_options(spec: ModelSpec | None) -> dict[str, Any]:
    """The run options that name `spec` (a preset: only `model`)."""
    if spec is None:
        return {}
    return spec.run_options() if spec.kind != "builtin" else {"model": spec.model}


def merged_options(typed: dict[str, Any], spec: ModelSpec | None) -> dict[str, Any]:
    """The Options field's options plus the picked model's; a key in both is refused."""
    picked = spec_options(spec)
    both = sorted(set(typed) & set(picked))
    if both:
        raise MpipeError(f"option {both[0]} is given in Options and by the model picker; remove it from Options")
    return {**typed, **picked}


class CliError(MpipeError):
    """A CLI subprocess that ended with its `error: ...` line."""


def _error_line(stderr: str, returncode: int) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error: "):
            # The CLI names its flag ("--model X: ..."); the page has no flags, it has the picker.
            return re.sub(r"^--([a-z-]+) ", lambda m: m.group(1).replace("-", " ") + " ", line[len("error: "):])
    return f"the command failed (exit {returncode}): " + (lines[-1] if lines else "no output")


def run_cli(argv: list[str], on_line: Callable[[str], None] | None = None) -> str:
    """Run a CLI command, passing each stderr line to `on_line` as it comes; its stdout,
    or CliError with its one error line (killed after CLI_TIMEOUT_S)."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True)
        timer = threading.Timer(CLI_TIMEOUT_S, proc.kill)  # a silent hang must not hold the page forever
        timer.start()
        seen: list[str] = []
        try:
            for line in proc.stderr:
                seen.append(line)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        if proc.returncode != 0:
            raise CliError(_error_line("".join(seen), proc.returncode))
        return out.read()


def check_own_model(term: str, workload: dict[str, Any] | None, options: dict[str, Any]) -> None:
    """Refuse, as `mpipe runs enqueue` does, an own model that is not admitted, cannot be
    built or does not fit schedule `term` on `workload`: CliError with its one line.  The
    model is built in a subprocess (`python -m executor.service.run_setup --check-model`:
    torch never enters the app's process), which checks only; it neither opens the
    database nor queues anything, so the caller then queues the run in-process under the
    session's actor (storage's own check and audit row are the signed-in user's)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.json"
        path.write_text(json.dumps({"term": term, "workload": workload, "options": options}))
        run_cli([sys.executable, "-m", "executor.service.run_setup", "--check-model", str(path)])


def profile_workload(spec: ModelSpec, on_line: Callable[[str], None] | None = None) -> dict:
    """`mpipe profile` of `spec` on this machine's CPU: the workload document it writes.
    Only a model the registry admits is profiled (the same rule as a queued run's)."""
    spec = ModelSpec(registry().admit(spec.model), spec.config, spec.shape)
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "workload.json"
        run_cli(spec.profile_argv(str(output)), on_line)
        return json.loads(output.read_text())
