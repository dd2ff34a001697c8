"""Build-memory benchmark (issue 39, section 5): each rank builds only its part.

    python -m benchmarks build-memory [--d-model 768] [--layers 16] [--pp 4] [--models builtin,hf]

Two models, each run for one step of `1f1b(p=1, m=4)` (one rank holds
everything) and of `1f1b(p=PP, m=4)` (PP torchrun ranks on gloo), one launch
each:

* ``builtin``: the built-in MLLM at a size where parameters dominate a
  process's memory (d_model 768, 16 layers: about 0.45 GB of float32 LLM
  weights), constructed on the meta device, each rank making real only its
  chunks' parameters from (seed, name);
* ``hf``: HF LLaVA, the tiny config scaled up (Llama width 1024, 16 layers,
  vocabulary 8192: about 0.65 GB of float32 weights; a small CLIP tower),
  saved with `save_pretrained` in shards and run as ``hf:FOLDER``: each rank
  constructs it with parameters on the meta device and reads only its own
  tensors from the folder (`executor.runtime.models.checkpoint`).

Every rank measures its process's peak resident memory after the build and
how far that rose above what the process held before it (torch's and
transformers' imports and the process group are not the model's).

Target: the largest rank at pp=PP needs well under half the rise of pp=1
(printed as a ratio; with PP=4 an even split gives about 1/4 plus the
embedding and head).  Not part of `all`: four launches of half-gigabyte
models take a few minutes here.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time


def log(msg: str) -> None:
    sys.stderr.write(f"[build-memory {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def run(pp: int, model, tmp: str) -> list[dict]:
    """Each rank's build (`BuildMemory` as a dict) for one step of 1f1b(p=pp) on `model`
    (a built-in `ModelConfig` or an own model's `ModelSpec`)."""
    from executor.runtime.jobs import Job
    from executor.runtime.model import ModelConfig
    from executor.runtime.model_workload import workload_for
    from executor.service.launch import LaunchOptions, launch
    from mpipe_core.api import evaluate

    term = f"1f1b(p={pp}, m=4)"
    if isinstance(model, ModelConfig):
        schedule = evaluate(term, workload_for(model)).schedule
        tag = "builtin"
    else:
        from executor.runtime.models.loader import load_model
        from executor.runtime.models.workload import evaluate_for_model

        schedule = evaluate_for_model(term, load_model(model, partial=True)).schedule
        tag = "hf"
    job = Job.make(term, schedule, model, steps=1)
    log(f"{tag} {term}: launching {pp} rank(s)")
    (result,) = launch([job], LaunchOptions(nproc=pp, stall_s=600, run_dir=f"{tmp}/{tag}-pp{pp}"))
    return [m["build"] for m in sorted(result.memory, key=lambda m: m["rank"])]


def hf_folder(tmp: str, layers: int) -> str:
    """A scaled-up tiny LLaVA (`models.hf`'s tiny config, wider and deeper), saved in shards."""
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    width, vocab = 1024, 8192
    vision = CLIPVisionConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                              image_size=16, patch_size=4, num_channels=3, projection_dim=128)
    text = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                       tie_word_embeddings=False)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_id=vocab - 1, tie_word_embeddings=False)
    torch.manual_seed(0)
    folder = f"{tmp}/llava-scaled"
    log(f"saving a scaled-up tiny LLaVA (width {width}, {layers} layers) to {folder}")
    LlavaForConditionalGeneration(cfg).save_pretrained(folder, max_shard_size="200MB")
    return folder


def table(title: str, pp: int, whole: list[dict], split: list[dict]) -> float:
    mb = 2 ** 20
    print(title)
    print(f"{'pp':>3} {'rank':>4} {'parameters':>11} {'peak':>9} {'rise':>9}")
    for p, builds in ((1, whole), (pp, split)):
        for rank, b in enumerate(builds):
            print(f"{p:>3} {rank:>4} {b['parameters'] / mb:>11.1f} {b['peak'] / mb:>9.1f} {b['growth'] / mb:>9.1f}")
    ratio = max(b["growth"] for b in split) / whole[0]["growth"]
    print(f"largest rank's rise at pp={pp} / rise at pp=1: {ratio:.3f} "
          f"({'well under half' if ratio < 0.4 else 'NOT well under half'}; peak ratio "
          f"{max(b['peak'] for b in split) / whole[0]['peak']:.3f})")
    return ratio


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks build-memory")
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--models", default="builtin,hf", help="comma-separated: builtin, hf")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - {"builtin", "hf"})
    if unknown:
        ap.error(f"unknown model {unknown[0]} (builtin, hf)")
    from executor.runtime.model import ModelConfig
    from mpipe_core.runs.model_spec import BatchShape, ModelSpec

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "builtin" in models:
            cfg = ModelConfig(vocab=256, d_model=args.d_model, n_layer=args.layers, n_head=12, text_len=16)
            whole, split = run(1, cfg, tmp), run(args.pp, cfg, tmp)
            out["builtin"] = {"whole": whole, "split": split, "ratio": table(
                f"Build memory, built-in MLLM d_model={cfg.d_model}, {cfg.n_layer} layers "
                "(MB; peak: the process's peak resident after the build; rise: above its resident before it)",
                args.pp, whole, split)}
        if "hf" in models:
            spec = ModelSpec(f"hf:{hf_folder(tmp, args.layers)}", None, BatchShape(images=1, text_len=16))
            whole, split = run(1, spec, tmp), run(args.pp, spec, tmp)
            out["hf"] = {"whole": whole, "split": split, "ratio": table(
                f"Build memory, HF LLaVA (tiny config scaled up: width 1024, {args.layers} layers) read from a "
                "save_pretrained folder, each rank its own tensors (MB)", args.pp, whole, split)}
    return out


if __name__ == "__main__":
    main()
