"""The memory model: every activation and static-memory formula, in one place.

Pure arithmetic on model dimensions (it imports nothing of the core), read by
the analytic workload (`analytic.py`), which turns it into the per-layer
figures every workload carries; the simulator's events (`memory.py`), tune
and the app use those figures, never a formula of their own.

**Activations** per transformer layer and microbatch, in bytes, for s tokens,
microbatch b, hidden h, a attention heads, tensor-parallel degree t:
Korthikanti et al. 2022, *Reducing Activation Recomputation in Large
Transformer Models* (MLSys 2023), Table 2 and section 4.  The paper counts
16-bit activations (2 bytes) and 1-byte dropout masks, for a GPT layer (MLP
of width 4h):

    no parallelism, no recompute      s*b*h*(34 + 5*a*s/h)
    tensor parallel                   s*b*h*(10 + 24/t + 5*a*s/(h*t))
    tensor + sequence parallel        s*b*h*(34/t + 5*a*s/(h*t))
    selective recompute               s*b*h*(10 + 24/t)      (s*b*h*34/t with sequence parallel)
    full recompute                    2*s*b*h                (2*s*b*h/t with sequence parallel)

The 5*a*s/h term is the attention scores (softmax output, its dropout mask
and output: 5*a*s^2*b bytes); flash attention never stores them, so with it
the term drops (selective recompute then saves nothing: it recomputes exactly
that term).  Full recompute keeps only the layer's input.

**Static memory** per parameter a device holds, Megatron's mixed-precision
accounting as its distributed-optimizer documentation states it
(docs.nvidia.com/megatron-core, "Distributed Optimizer"): a 16-bit parameter
(2 bytes) with an fp32 gradient (4), fp32 master copy (4) and Adam's two fp32
moments (4 + 4) is 18 bytes; the distributed optimizer shards the master copy
and moments over the d data-parallel replicas: 6 + 12/d.  A frozen module
holds its 16-bit parameters only: 2 bytes.

**A replicated encoder's state** (transpose's copies, colocated's shares,
disaggregate's devices: k trained copies in one pipeline, each of them on
dp x cp ranks, N = k x dp x cp copies in all) can be sharded over every copy,
as a team does with a tower each rank holds whole (`parallel.encoder_shard`):

    none          as the LLM: 18, or 6 + 12/(dp cp) with the distributed optimizer
    optimizer     6 + 12/N   fp32 master weights and Adam moments sharded over the
                             N copies, 16-bit weights and the fp32 gradient buffer
                             whole: Megatron's distributed optimizer over the
                             encoder's own data-parallel group (ZeRO stage 1)
    gradients     2 + 16/N   the gradient reduce-scattered too (ZeRO stage 2;
                             Megatron-core FSDP `--data-parallel-sharding-strategy
                             optim_grads`)

Rajbhandari et al. 2020, *ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models* (SC20), section 5: P_os keeps 2 + 2 + K/N_d bytes per
parameter and P_os+g 2 + (2 + K)/N_d (K = 12 with Adam, 16-bit gradients);
with fp32 gradients, as Megatron keeps them, 6 + 12/N and 2 + 16/N.  Either
way the gradient sync becomes a reduce-scatter over the N copies and an
all-gather of the updated 16-bit weights (the same bytes as one all-reduce,
ZeRO section 7), each copy updating 1/N of the tower.

**Parameter counts** of a transformer layer (weight matrices; biases and norms
are under 0.1% of a layer at these widths and are left out): Q and output
projections h*h each, K and V h*h*kv/a each (grouped-query attention with kv
key/value heads), the MLP 2*h*f (GELU: up and down) or 3*h*f (gated, SwiGLU:
gate, up, down).  Embedding and LM head: vocab*h each.  Tensor parallelism
splits every one of them t ways (Megatron's column/row-parallel linears and
vocab-parallel embedding).
"""
from __future__ import annotations

from math import gcd

RECOMPUTE_MODES = ("none", "selective", "full")

# Bytes per parameter (Megatron, "Distributed Optimizer": float16 param, fp32 grads).
MIXED_PRECISION_BYTES = 18.0
FROZEN_BYTES = 2.0
DISTRIBUTED_SHARED_BYTES, DISTRIBUTED_SHARDED_BYTES = 6.0, 12.0
GRADIENT_SHARED_BYTES, GRADIENT_SHARDED_BYTES = 2.0, 16.0
ENCODER_SHARDING = ("none", "optimizer", "gradients")


def activation_bytes(s: float, b: float, h: float, a: float, tp: int = 1, sp: bool = False,
                     flash_attention: bool = True, recompute: str = "none") -> float:
    """Activation bytes one transformer layer keeps per microbatch until its
    backward (Korthikanti et al. 2022), for recompute mode none, selective or full."""
    t = tp
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    if recompute == "selective":
        return s * b * h * (34 / t if sp else 10 + 24 / t)
    if recompute != "none":
        raise ValueError(f"unknown recompute mode {recompute!r} (known: {', '.join(RECOMPUTE_MODES)})")
    scores = 0.0 if flash_attention else 5 * a * s / (h * t)
    return s * b * h * ((34 / t if sp else 10 + 24 / t) + scores)


def bytes_per_parameter(trainable: bool = True, dp: int = 1, distributed_optimizer: bool = False) -> float:
    """Static bytes per parameter: 18 (mixed precision with Adam), 6 + 12/dp with
    the distributed optimizer, 2 for a frozen module (Megatron)."""
    if not trainable:
        return FROZEN_BYTES
    if distributed_optimizer:
        return DISTRIBUTED_SHARED_BYTES + DISTRIBUTED_SHARDED_BYTES / dp
    return MIXED_PRECISION_BYTES


def encoder_bytes_per_parameter(trainable: bool, dp: int, distributed_optimizer: bool,
                                shard: str = "none") -> tuple[float, float]:
    """(whole, sharded) static bytes per parameter of one trained encoder copy:
    it holds whole + sharded / k with k trained copies in its pipeline (each on
    dp = dp x cp ranks).  `shard`: none (the LLM's accounting, nothing sharded
    over the copies), optimizer (6 + 12/N) or gradients (2 + 16/N) with
    N = k x dp (see the module's docstring for the sources)."""
    if not trainable or shard == "none":
        return bytes_per_parameter(trainable, dp, distributed_optimizer), 0.0
    if shard == "optimizer":
        return DISTRIBUTED_SHARED_BYTES, DISTRIBUTED_SHARDED_BYTES / dp
    if shard == "gradients":
        return GRADIENT_SHARED_BYTES, GRADIENT_SHARDED_BYTES / dp
    raise ValueError(f"unknown encoder sharding {shard!r} (known: {', '.join(ENCODER_SHARDING)})")


def layer_parameters(h: float, ffn: float, heads: int, kv_heads: int | None = None,
                     gated_mlp: bool = False) -> float:
    """Weight-matrix parameters of one transformer layer (attention + MLP)."""
    kv = heads if kv_heads is None else kv_heads
    attention = 2 * h * h + 2 * h * (h * kv / heads)
    mlp = (3 if gated_mlp else 2) * h * ffn
    return attention + mlp


def embedding_parameters(vocab: float, h: float) -> float:
    """The token embedding's parameters (the LM head has as many)."""
    return vocab * h


def encoder_tensor_parallel(tp: int, heads: int, override: int | None = None) -> int:
    """The tensor-parallel degree of an encoder beside an LLM of degree `tp`:
    the override if given, else gcd(tp, heads): the LLM's degree when it
    divides the encoder's heads (the encoder shares its stage's tensor-parallel
    group, Megatron's default), else the largest degree dividing both (the
    encoder is replicated over the rest of the group)."""
    return override if override is not None else gcd(tp, heads)
