"""What names a model to run: a `ModelSpec` is `--model` with its
`--model-config` and the batch shape, and its form as run options
(`-o model=... -o model_config=...`, what a run record stores).

Plain data, here rather than in the executor so that every layer can name a
model without torch: the app (choosing a model on the Runs page, profiling one
into a saved workload through `profile_argv`), storage's run options, the
executor's run set-up and ranks (`executor.runtime.models` builds it)."""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from mpipe_core.runs.model_registry import HF_CONFIGURATIONS as HF_MODELS  # noqa: F401 (re-exported)
from mpipe_core.runs.model_registry import MODEL_PRESET_NAMES


@dataclass(frozen=True)
class BatchShape:
    """The data a factory's batch maker draws (`mpipe profile` options)."""

    microbatch_size: int = 1  # samples per microbatch
    images: int = 1  # images per sample
    text_len: int = 8  # text tokens per sample (at most)
    seed: int = 0


@dataclass(frozen=True)
class ModelSpec:
    model: str
    config: str | None = None
    shape: BatchShape = field(default_factory=BatchShape)
    # A registered model's factory (package.module:callable), filled in by whoever
    # looked the name up in the registry, so that the ranks need no registry.
    factory: str | None = None

    @property
    def kind(self) -> str:
        """builtin (a preset), hf (hf:NAME, hf:/path), plugin (package.module:factory,
        `mpipe run` only) or registered (a name from `mpipe_core.runs.model_registry`)."""
        if self.model in MODEL_PRESET_NAMES:
            return "builtin"
        if self.model.startswith("hf:"):
            return "hf"
        return "plugin" if ":" in self.model else "registered"

    def to_dict(self) -> dict[str, Any]:
        doc = {"model": self.model, "config": self.config, "shape": asdict(self.shape)}
        return doc if self.factory is None else {**doc, "factory": self.factory}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "ModelSpec":
        return cls(doc["model"], doc.get("config"), BatchShape(**doc.get("shape", {})), doc.get("factory"))

    def run_options(self) -> dict[str, Any]:
        """The spec as queued-run options (`mpipe runs enqueue -o ...`, storage.enqueue)."""
        out: dict[str, Any] = {"model": self.model}
        if self.config is not None:
            out["model_config"] = self.config
        out.update(microbatch_size=self.shape.microbatch_size, seq_len=self.shape.text_len,
                   images=self.shape.images)
        return out

    def profile_argv(self, output: str, device: str = "cpu") -> list[str]:
        """The `mpipe profile` command line that writes this model's workload to `output`
        (for callers that must not import torch themselves, such as the app)."""
        argv = [sys.executable, "-m", "mpipe_cli.main", "profile", "--model", self.model,
                "--microbatch-size", str(self.shape.microbatch_size), "--seq-len", str(self.shape.text_len),
                "--images", str(self.shape.images), "--device", device, "-o", output]
        return argv + (["--model-config", self.config] if self.config is not None else [])

    def __str__(self) -> str:
        return self.model + (f" ({self.config})" if self.config else "")


def is_own_model(name: str | None) -> bool:
    """True for anything but a built-in preset (and None): hf:..., registered names,
    plug-in paths."""
    return name is not None and name not in MODEL_PRESET_NAMES


def spec_from_options(options: dict[str, Any]) -> ModelSpec | None:
    """A run's own model from its options, or None for the built-in one."""
    if not is_own_model(options.get("model")):
        return None
    return ModelSpec(options["model"], options.get("model_config"), BatchShape(
        microbatch_size=options.get("microbatch_size", 1), images=options.get("images", 1),
        text_len=options.get("seq_len", 8)))


# Each built-in preset's encoder as (name, trainable), None for a text-only LLM: the
# executor's MODEL_PRESETS (which need torch) in plain data, kept equal to them by a test.
PRESET_ENCODERS: dict[str, tuple[str, bool] | None] = {
    "tiny": ("vision", True), "tiny-text": None, "tiny-frozen": ("vision", False),
    "tiny-varimg": ("vision", True), "small": ("vision", True), "vit-heavy": ("vision", False),
}


def _encoder_text(encoder: tuple[str, bool] | None) -> str:
    return "no encoder" if encoder is None else f"{encoder[0]} ({'trainable' if encoder[1] else 'frozen'})"


def preset_mismatch(preset: str, encoders: list[tuple[str, bool]]) -> str | None:
    """Why model preset `preset` cannot train a schedule whose workload has
    `encoders` ((name, trainable) each), naming frozen or trainable on both
    sides; None when it can (or `preset` is no built-in preset)."""
    if preset not in PRESET_ENCODERS or len(encoders) > 1:  # several encoders: the executor's own refusal
        return None
    have, want = PRESET_ENCODERS[preset], (tuple(encoders[0]) if encoders else None)
    if have == want:
        return None
    return (f"model preset '{preset}' has {'encoder ' if have else ''}{_encoder_text(have)}, but the schedule's "
            f"workload has {_encoder_text(want)}")
