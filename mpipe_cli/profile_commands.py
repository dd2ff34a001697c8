"""`mpipe profile`: measure a model's per-layer F/B/W times, its activation
and static bytes on this device, and write an explicit workload that `mpipe
eval` and the app accept."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from mpipe_core.errors import MpipeError


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure a model's per-layer costs into a workload")
    p.add_argument("--model", required=True,
                   help="preset (tiny, ...), hf:llava, hf:qwen2_5_vl, hf:/path/to/checkpoint, "
                        "a registered name (mpipe models) or package.module:factory")
    p.add_argument("--model-config", default=None, help="passed to the model (hf: tiny, tiny-frozen, frozen)")
    p.add_argument("--microbatch-size", type=int, default=1, help="samples per microbatch")
    p.add_argument("--seq-len", type=int, default=8, help="text tokens per sample (at most)")
    p.add_argument("--images", type=int, default=1, help="images per sample")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: what a torchrun rank runs with)")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"],
                   help="whose state the static bytes count (as mpipe run --optimizer; default sgd)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("-o", "--output", default=None, help="workload file to write (default: stdout)")
    p.set_defaults(handler=profile_command)


def profile_command(args) -> int:
    for name in ("microbatch_size", "seq_len", "images", "repeats", "threads"):
        if getattr(args, name) < 1:
            raise MpipeError(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        raise MpipeError("--warmup must be >= 0")
    from executor.runtime.models.loader import load_model
    from executor.runtime.models.profile import profile_model
    from mpipe_core.runs.model_spec import BatchShape, ModelSpec

    device = _device(args.device)
    import torch

    torch.set_num_threads(args.threads)
    spec = ModelSpec(args.model, args.model_config,
                     BatchShape(microbatch_size=args.microbatch_size, images=args.images, text_len=args.seq_len))
    model = load_model(spec)
    print(f"profiling {spec} on {device}: {args.warmup} warm-up + {args.repeats} timed runs per part",
          file=sys.stderr)

    def progress(part: str, index: int, total: int) -> None:
        print(f"  [{index}/{total}] {part}", file=sys.stderr, flush=True)

    doc = profile_model(model, spec, device=device, warmup=args.warmup, repeats=args.repeats,
                        progress=progress, optimizer=args.optimizer)
    text = json.dumps(doc, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        llm = doc["llm"]
        print(f"wrote {args.output}: {llm['layers']} layers, per layer F {llm['f'] * 1e3:.3f} ms, "
              f"B {llm['b'] * 1e3:.3f} ms, W {llm['w'] * 1e3:.3f} ms"
              + "".join(f"; encoder F {e['f'] * 1e3:.3f} ms/image ({'trainable' if e['trainable'] else 'frozen'})"
                        for e in doc["encoders"]), file=sys.stderr)
    else:
        print(text)
    return 0


def _device(name: str) -> str:
    """The torch device for --device; torch_npu is imported only for npu."""
    import torch

    if name == "cuda":
        if not torch.cuda.is_available():
            raise MpipeError("--device cuda: no CUDA device is available here")
        return "cuda"
    if name == "npu":
        try:
            import torch_npu  # noqa: F401  (only on this path)
        except ImportError as error:
            raise MpipeError(f"--device npu needs torch_npu: {error}") from error
        return "npu"
    return "cpu"
