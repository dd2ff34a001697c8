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
the achieved HBM bandwidth; the element-wise work between them (norms,
residual adds with dropout, the activation, softmax and its dropout without
flash attention) at HBM bandwidth, its backward twice its forward's bytes.
The weight-gradient GEMMs accumulate into fp32 gradients (Megatron's
gradient-accumulation fusion): 8 bytes per output element.
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

    def gemm_efficiency(self, m: float, n: float, batch: float = 1) -> float:
        """Achieved fraction of peak for an (m x k) @ (k x n) GEMM, `batch` of them:
        the measured maximum times tile quantization (the last row and column
        of tiles are partly empty) times wave quantization (the last wave of
        tiles leaves compute units idle)."""
        tm, tn = self.tile
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        tile_q = (m * n) / (tiles_m * tm * tiles_n * tn)
        tiles = tiles_m * tiles_n * math.ceil(batch)
        wave_q = tiles / (math.ceil(tiles / self.compute_units) * self.compute_units)
        return self.gemm_max_efficiency * tile_q * wave_q

    def gemm_seconds(self, m: float, n: float, k: float, batch: float = 1, out_bytes: float = BYTES) -> float:
        flops = 2 * m * n * k * batch
        nbytes = (BYTES * (m * k + k * n) + out_bytes * m * n) * batch
        return max(flops / (self.peak_flops * self.gemm_efficiency(m, n, batch)), nbytes / self.hbm_bytes_per_s)

    def memory_seconds(self, nbytes: float) -> float:
        return nbytes / self.hbm_bytes_per_s


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
    attention core's forward (selective recompute's cost)."""

    f: float
    b: float
    w: float
    core_f: float


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
    dgrad = sum(dev.gemm_seconds(m, k, n) for m, n, k in weights)  # dX = dY W^T
    wgrad = sum(dev.gemm_seconds(k, n, m, out_bytes=8) for m, n, k in weights)  # dW = X^T dY, fp32
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
        core_f = dev.gemm_seconds(q, shape.s, d, heads) + dev.gemm_seconds(q, d, shape.s, heads)
        core_b = (dev.gemm_seconds(q, d, shape.s, heads) + dev.gemm_seconds(shape.s, d, q, heads)
                  + dev.gemm_seconds(q, shape.s, d, heads) + dev.gemm_seconds(shape.s, d, q, heads))
        # scale, mask and softmax (read + write 2 bytes), dropout (read, write, 1-byte mask)
        softmax_f = dev.memory_seconds(9 * q * shape.s * heads)
    # Element-wise work: two norms (4 bytes per element) and two bias-dropout-adds (7),
    # on the whole hidden state, or 1/t of it with sequence parallelism; the MLP's activation.
    hidden = tokens * h / (t if shape.sp else 1)
    act_bytes = (6 if shape.gated else 4) * tokens * f / t
    elementwise_f = dev.memory_seconds(22 * hidden + act_bytes) + softmax_f
    return LayerTimes(f=fwd + core_f + elementwise_f, b=dgrad + core_b + 2 * elementwise_f, w=wgrad,
                      core_f=core_f + softmax_f)


def head_times(b: float, s: float, h: float, vocab: float, tp: int, cp: int, sp: bool,
               dev: DeviceModel) -> tuple[float, float, float]:
    """(F, B, W) seconds of the final norm, logits and loss on one device (vocab split t ways)."""
    tokens = b * s / cp
    n = vocab / tp
    norm = dev.memory_seconds(4 * tokens * h / (tp if sp else 1))
    # Megatron-LM's vocab-parallel cross-entropy on the logits cast to fp32, per logit: the
    # cast (read 2, write 4 bytes), max (read 4), subtract, exp and divide in place (8 each)
    # and the sum (4) forward: 38 bytes; backward the in-place scale (8) and the cast back (6).
    loss_f = dev.memory_seconds(38 * tokens * n)
    loss_b = dev.memory_seconds(14 * tokens * n)
    return (dev.gemm_seconds(tokens, n, h) + norm + loss_f,
            dev.gemm_seconds(tokens, h, n) + loss_b + 2 * norm,
            dev.gemm_seconds(h, n, tokens, out_bytes=8))


def embedding_times(b: float, s: float, h: float, tp: int, cp: int, sp: bool,
                    dev: DeviceModel) -> tuple[float, float]:
    """(F, W) seconds of the embedding lookup (+ dropout) and its fp32 gradient scatter-add."""
    tokens = b * s / cp
    return dev.memory_seconds(11 * tokens * h / (tp if sp else 1)), dev.memory_seconds(8 * tokens * h)
