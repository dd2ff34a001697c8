"""One torchrun rank of the end-to-end trace test (`test_import_trace_e2e.py`).

A real `torch.distributed.pipelining` training on gloo: a small Llama-shaped
model (`tok_embeddings`, `layers.N`, `norm`, `output`, the FQNs torchtitan's
Llama has) split into `PipelineStage`s by the `module_fqns_per_model_part` of
Mpipe's own `--format torchtitan` TOML, a `_PipelineScheduleRuntime` loaded
from its CSV, steps under `torch.profiler` with a schedule (so steps are
marked `ProfilerStep#N`), each profiling window written as torchtitan does:
`{out}/{case}/iteration_{N}/rank{R}_trace.json`.  Rank 0 also writes the
compute actions torch loaded (`pipeline_order`), per rank, as JSON (`order`).
The spec's `backend` and `device` (default gloo, cpu) make the same job run
on CUDA with NCCL, traced with CUDA activity too (`scripts/device-check.sh`).

    torchrun --nproc-per-node 2 torch_trace_job.py SPEC.json
"""
from __future__ import annotations

import json
import os
import sys
import tomllib

import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class TinyLlama(nn.Module):
    """Llama's module names; forward tolerates the parts a stage does not hold."""

    def __init__(self, layers: int, d: int, vocab: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleDict({str(i): Block(d) for i in range(layers)})
        self.norm = nn.LayerNorm(d)
        self.output = nn.Linear(d, vocab)

    def forward(self, x):
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def keep_only(model: TinyLlama, fqns: list[str]) -> TinyLlama:
    """torchtitan's split: drop every module the stage's FQN list does not name."""
    keep = set(fqns)
    model.layers = nn.ModuleDict({k: v for k, v in model.layers.items() if f"layers.{k}" in keep})
    for name in ("tok_embeddings", "norm", "output"):
        if name not in keep:
            setattr(model, name, None)
    return model


def run_case(case: dict, spec: dict, rank: int, device: torch.device) -> None:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.profiler import ProfilerActivity, profile, schedule

    with open(case["toml"], "rb") as f:
        config = tomllib.load(f)["parallelism"]
    fqns = config["module_fqns_per_model_part"]
    stages_n = len(fqns)
    p = dist.get_world_size()
    mine = [s for s in range(stages_n) if s % p == rank]  # looped placement (the TOML's schedule says so)
    stages = []
    for s in mine:
        torch.manual_seed(0)  # every stage copies the same initial model
        model = keep_only(TinyLlama(spec["layers"], spec["d"], spec["vocab"]), fqns[s]).to(device)
        stages.append(PipelineStage(model, s, stages_n, device))

    def loss_fn(logits, targets):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    m = case["microbatches"]
    sched = _PipelineScheduleRuntime(stages, m, loss_fn=loss_fn)
    sched._load_csv(config["pipeline_parallel_schedule_csv"])
    if rank == 0:
        order = {str(r): [str(a) for a in actions if a is not None]
                 for r, actions in sched.pipeline_order.items()}
        with open(case["order"], "w") as f:
            json.dump(order, f)
    params = [q for st in stages for q in st.submod.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, spec["vocab"], (m * spec["batch"], spec["seq"]), generator=gen).to(device)
    y = torch.randint(0, spec["vocab"], (m * spec["batch"], spec["seq"]), generator=gen).to(device)

    def ready(prof):
        folder = os.path.join(case["out"], f"iteration_{prof.step_num}")
        os.makedirs(folder, exist_ok=True)
        prof.export_chrome_trace(os.path.join(folder, f"rank{rank}_trace.json"))

    def train_step() -> None:
        kwargs = {"target": y, "losses": []}
        if any(st.is_first for st in stages):
            sched.step(x, **kwargs)
        else:
            sched.step(**kwargs)
        opt.step()
        opt.zero_grad(set_to_none=True)

    train_step()  # torch's shape inference and first allocations, untraced
    windows, active, warmup = spec["windows"], spec["active"], spec["warmup"]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities,
                 schedule=schedule(wait=0, warmup=warmup, active=active, repeat=windows),
                 on_trace_ready=ready) as prof:
        for _ in range(windows * (active + warmup)):
            train_step()
            prof.step()
    if rank == 0:
        print(f"case {case['name']}: {windows} windows of {active} step(s) traced")


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.set_num_threads(1)
    backend = spec.get("backend", "gloo")
    device = torch.device("cpu")
    if spec.get("device", "cpu") == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group(backend)
    rank = dist.get_rank()
    for case in spec["cases"]:
        run_case(case, spec, rank, device)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
