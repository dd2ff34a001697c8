"""A transformer layer's work from its GEMM shapes, and its time on a device.

FLOPs (multiply-add = 2) of one layer and microbatch: b samples of s tokens,
hidden h, a attention heads of which kv key/value heads (grouped-query
attention), MLP width f, gated (SwiGLU: gate, up, down) or not (up, down):

    dense  = 4bsh^2 (1 + kv/a) + (6 if gated else 4) bshf
             (Q and output projections 2bsh^2 each, K and V 2bsh^2 kv/a each, the MLP)
    core   = 4bs^2h          (QK^T and attention x V, counted in full as Megatron does)
    F = dense + core,   B = dense + 2 core (dS, dQ, dK, dV),   W = dense

(GPT: kv = a, f = 4h: F = 24bsh^2 (1 + s/6h), Narayanan et al. 2021.)  The LM
head's logits cost 2bshV forward, as much for the input gradient and for the
weight gradient, on the last chunk; the embedding is a lookup (memory only)
on the first.

Time (`LayerTimes`) comes from the GEMMs a device runs after the tensor- and
context-parallel split (t ways over heads and MLP width, c ways over the
sequence): a roofline, each GEMM taking the longer of FLOPs at the device's
achieved fraction of peak for its shape (`DeviceModel.gemm_efficiency`: the
largest aligned GEMM's measured fraction, times the tile and wave
quantization of its output on the device's compute units) and its bytes at
the achieved HBM bandwidth.  The weight-gradient GEMMs accumulate into fp32
gradients (Megatron's gradient-accumulation fusion): 8 bytes per output
element.

The memory-bound kernels between the GEMMs run at the achieved HBM bandwidth
(`hbm_efficiency`, fitted with the GEMM fraction from a layer profile), each
at its own bytes, as Megatron-LM (2022) runs them (16-bit tensors, 1-byte
dropout masks; `memory_bytes` itemises them):

  forward, per element of the hidden state (1/t of it with sequence
  parallelism): two layer norms (read, write: 4 B each) and two fused
  bias-dropout-adds (read x and the residual, write, mask: 7 B each): 22 B;
  per QKV output element its bias add (read, write: 4 B; `ColumnParallelLinear`
  adds the bias after the GEMM); per MLP-up element the fused bias-GeLU (4 B;
  SwiGLU reads two, writes one: 6 B); per attention score without flash the
  fused scale-mask-softmax (4 B) and its dropout (5 B); per context element
  the permute back to [s, b, h] (a copy: 4 B);

  backward, per hidden element: per norm apex's two kernels (dX: read dY and
  X, write dX, 6 B; gamma/beta: read dY and X again, 4 B), per
  bias-dropout-add the dropout's gradient (read dY and the mask, write: 5 B),
  the residual branch's gradient added to the norm's (read 2 x 2, write: 6 B),
  and the bias gradient's reduction (read: 2 B): 2 x 23 = 46 B; per QKV
  element its bias gradient (2 B); per MLP-up element the bias-GeLU's
  gradient (read dY and X, write: 6 B) and its bias gradient (2 B) (SwiGLU:
  read dY and both inputs, write both: 10 B); per score the dropout's
  gradient (5 B) and the softmax's (read dY and Y, write: 6 B): 11 B; per
  context element the permute's (4 B).

`LayerTimes` also keeps the column-parallel GEMMs' (QKV, MLP up) input- and
weight-gradient seconds: the tensor-parallel backward collectives overlap
them (`layer_comm.tp_layer`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BYTES = 2  # 16-bit activations and weights


@dataclass(frozen=True)
class DeviceModel:
    """What the roofline needs of a device (sources in docs/cluster.md)."""

    peak_flops: float  # dense 16-bit FLOP/s
    hbm_bytes_per_s: float  # achieved
    gemm_max_efficiency: float  # the best aligned large GEMM's fraction of peak (measured)
    compute_units: int  # SMs / AI cores: one output tile each per wave
    tile: tuple[int, int] = (256, 128)  # the GEMM library's output tile
    flash_efficiency: float = 0.5  # fraction of peak a fused attention kernel reaches
    # achieved bandwidth of the memory-bound kernels (norms, softmax, dropout, the optimizer);
    # None: the GEMMs' `hbm_bytes_per_s`
    memory_bytes_per_s: float | None = None
    # the unfused attention core's batched GEMMs' ceiling (QK^T and attention x V: k or n is
    # the head dimension, far from a large GEMM's); None: `gemm_max_efficiency`
    attention_efficiency: float | None = None

    def gemm_efficiency(self, m: float, n: float, batch: float = 1, ceiling: float | None = None) -> float:
        """Achieved fraction of peak for an (m x k) @ (k x n) GEMM, `batch` of them:
        the measured maximum times tile quantization (the last row and column
        of tiles are partly empty) times wave quantization (the last wave of
        tiles leaves compute units idle)."""
        tm, tn = self.tile
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        tile_q = (m * n) / (tiles_m * tm * tiles_n * tn)
        tiles = tiles_m * tiles_n * math.ceil(batch)
        wave_q = tiles / (math.ceil(tiles / self.compute_units) * self.compute_units)
        return (self.gemm_max_efficiency if ceiling is None else ceiling) * tile_q * wave_q

    def gemm_seconds(self, m: float, n: float, k: float, batch: float = 1, out_bytes: float = BYTES,
                     ceiling: float | None = None) -> float:
        flops = 2 * m * n * k * batch
        nbytes = (BYTES * (m * k + k * n) + out_bytes * m * n) * batch
        return max(flops / (self.peak_flops * self.gemm_efficiency(m, n, batch, ceiling)),
                   nbytes / self.hbm_bytes_per_s)

    def core_gemm_seconds(self, m: float, n: float, k: float, batch: float) -> float:
        """One of the unfused attention core's batched GEMMs, at `attention_efficiency`."""
        return self.gemm_seconds(m, n, k, batch, ceiling=self.attention_efficiency)

    def memory_seconds(self, nbytes: float) -> float:
        return nbytes / (self.hbm_bytes_per_s if self.memory_bytes_per_s is None else self.memory_bytes_per_s)


@dataclass(frozen=True)
class LayerShape:
    """One transformer layer and microbatch, and how it is split."""

    b: float
    s: float
    h: float
    heads: int
    kv_heads: int
    ffn: float
    gated: bool = False
    tp: int = 1
    cp: int = 1
    sp: bool = False
    flash: bool = True
    # Megatron's gradient-accumulation fusion (2022 on): the weight-gradient GEMM accumulates
    # into the fp32 gradient (8 B per element).  Without it (2021) the GEMM writes a 16-bit
    # gradient that a hook adds to the fp32 one (read 2 + 4, write 4: 10 B per weight).
    grad_fusion: bool = True

    @property
    def kv_width(self) -> float:
        """Width of K (and of V): h * kv / a."""
        return self.h * self.kv_heads / self.heads


def layer_flops(shape: LayerShape) -> tuple[float, float, float]:
    """(F, B, W) FLOPs of one whole layer (before any split), per microbatch."""
    b, s, h, f = shape.b, shape.s, shape.h, shape.ffn
    dense = 4 * b * s * h * h * (1 + shape.kv_heads / shape.heads) + (6 if shape.gated else 4) * b * s * h * f
    core = 4 * b * s * s * h
    return dense + core, dense + 2 * core, dense


def attention_core_flops(shape: LayerShape) -> float:
    """Forward FLOPs of QK^T and attention x V (what selective recompute redoes)."""
    return 4 * shape.b * shape.s * shape.s * shape.h


def head_flops(b: float, s: float, h: float, vocab: float) -> tuple[float, float, float]:
    """(F, B, W) FLOPs of the LM head's logits, per microbatch."""
    logits = 2 * b * s * h * vocab
    return logits, logits, logits


@dataclass(frozen=True)
class LayerTimes:
    """Seconds one device spends on one layer and microbatch, per kind, and the
    attention core's forward (selective recompute's cost); the column-parallel
    GEMMs' (QKV, MLP up) input- and weight-gradient seconds, which the tensor-
    parallel backward collectives overlap."""

    f: float
    b: float
    w: float
    core_f: float
    col_dgrad: tuple[float, float] = (0.0, 0.0)
    col_wgrad: tuple[float, float] = (0.0, 0.0)


# Bytes per element of the memory-bound kernels (the module docstring itemises them).
HIDDEN_F, HIDDEN_B = 22, 46  # per hidden-state element: norms and bias-dropout-adds
QKV_BIAS_F, QKV_BIAS_B = 4, 2  # per QKV output element
ACT_F, ACT_B = 4, 8  # per MLP-up element: bias-GeLU (+ its bias gradient)
GATED_ACT_F, GATED_ACT_B = 6, 10  # SwiGLU, no bias
SCORE_F, SCORE_B = 9, 11  # per attention score without flash: softmax + dropout
PERMUTE_F, PERMUTE_B = 4, 4  # per context element: [b*a, s, d] -> [s, b, h]
GRAD_ADD = 10  # per weight without gradient-accumulation fusion: main_grad.add_(grad)


def memory_bytes(shape: LayerShape) -> tuple[float, float]:
    """(forward, backward) bytes the memory-bound kernels of one layer move on one
    device of its tp x cp group (HBM traffic)."""
    t, c = shape.tp, shape.cp
    tokens = shape.b * shape.s / c
    hidden = tokens * shape.h / (t if shape.sp else 1)
    qkv = tokens * (shape.h + 2 * shape.kv_width) / t
    up = tokens * shape.ffn / t
    context = tokens * shape.h / t
    scores = 0.0 if shape.flash else (shape.s / c) * shape.s * shape.b * shape.heads / t
    act_f, act_b = (GATED_ACT_F, GATED_ACT_B) if shape.gated else (ACT_F, ACT_B)
    fwd = HIDDEN_F * hidden + QKV_BIAS_F * qkv + act_f * up + SCORE_F * scores + PERMUTE_F * context
    bwd = HIDDEN_B * hidden + QKV_BIAS_B * qkv + act_b * up + SCORE_B * scores + PERMUTE_B * context
    return fwd, bwd


def layer_times(shape: LayerShape, dev: DeviceModel) -> LayerTimes:
    """Compute time of one layer on one device of its tp x cp group (no communication)."""
    t, c = shape.tp, shape.cp
    tokens = shape.b * shape.s / c
    h, f = shape.h, shape.ffn
    qkv_n = (h + 2 * shape.kv_width) / t
    mlp_up = (2 if shape.gated else 1) * f / t
    # (m, n, k) of each weight GEMM's forward: QKV, output projection, MLP up(+gate), MLP down.
    weights = [(tokens, qkv_n, h), (tokens, h, h / t), (tokens, mlp_up, h), (tokens, h, f / t)]
    fwd = sum(dev.gemm_seconds(m, n, k) for m, n, k in weights)
    dgrads = [dev.gemm_seconds(m, k, n) for m, n, k in weights]  # dX = dY W^T
    wgrads = [dev.gemm_seconds(k, n, m, out_bytes=8 if shape.grad_fusion else BYTES)  # dW = X^T dY
              for m, n, k in weights]
    accumulate = 0.0 if shape.grad_fusion else dev.memory_seconds(GRAD_ADD * sum(n * k for _, n, k in weights))
    # The attention core: heads / t of them, queries s / c against every key.
    heads = shape.b * shape.heads / t
    d = h / shape.heads
    q = shape.s / c
    if shape.flash:
        core_flops = 4 * q * shape.s * d * heads
        core_f = core_flops / (dev.peak_flops * dev.flash_efficiency)
        core_b = 2 * core_f
        softmax_f = 0.0
    else:
        g = dev.core_gemm_seconds
        core_f = g(q, shape.s, d, heads) + g(q, d, shape.s, heads)
        core_b = g(q, d, shape.s, heads) + g(shape.s, d, q, heads) + g(q, shape.s, d, heads) + g(shape.s, d, q, heads)
        # what Megatron's CoreAttention recomputes with the GEMMs: softmax, dropout, the permute copy
        softmax_f = dev.memory_seconds(SCORE_F * q * shape.s * heads + PERMUTE_F * tokens * h / t)
    mem_f, mem_b = memory_bytes(shape)
    return LayerTimes(f=fwd + core_f + dev.memory_seconds(mem_f), b=sum(dgrads) + core_b + dev.memory_seconds(mem_b),
                      w=sum(wgrads) + accumulate, core_f=core_f + softmax_f,
                      col_dgrad=(dgrads[0], dgrads[2]), col_wgrad=(wgrads[0], wgrads[2]))


def head_times(b: float, s: float, h: float, vocab: float, tp: int, cp: int, sp: bool,
               dev: DeviceModel, grad_fusion: bool = True) -> tuple[float, float, float]:
    """(F, B, W) seconds of the final norm, logits and loss on one device (vocab split t ways)."""
    tokens = b * s / cp
    n = vocab / tp
    hidden = tokens * h / (tp if sp else 1)
    # the final norm: read, write forward (4 B); backward apex's two kernels (10 B), as a layer's
    norm_f, norm_b = dev.memory_seconds(4 * hidden), dev.memory_seconds(10 * hidden)
    # Megatron-LM's vocab-parallel cross-entropy on the logits cast to fp32, per logit: the
    # cast (read 2, write 4 bytes), max (read 4), subtract, exp and divide in place (8 each)
    # and the sum (4) forward: 38 bytes; backward the in-place scale (8) and the cast back (6).
    loss_f = dev.memory_seconds(38 * tokens * n)
    loss_b = dev.memory_seconds(14 * tokens * n)
    wgrad = dev.gemm_seconds(h, n, tokens, out_bytes=8 if grad_fusion else BYTES)
    if not grad_fusion:  # the hook adds the 16-bit gradient to the fp32 one
        wgrad += dev.memory_seconds(GRAD_ADD * h * n)
    return (dev.gemm_seconds(tokens, n, h) + norm_f + loss_f,
            dev.gemm_seconds(tokens, h, n) + loss_b + norm_b,
            wgrad)


def embedding_times(b: float, s: float, h: float, tp: int, cp: int, sp: bool,
                    dev: DeviceModel) -> tuple[float, float]:
    """(F, W) seconds of the embedding lookup (+ dropout) and its fp32 gradient scatter-add."""
    tokens = b * s / cp
    return dev.memory_seconds(11 * tokens * h / (tp if sp else 1)), dev.memory_seconds(8 * tokens * h)
