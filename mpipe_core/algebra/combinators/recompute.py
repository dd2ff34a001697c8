"""recompute: trade compute for activation memory.

`recompute(t, mode=full|selective, chunks=[...])` or `layers=[k0, k1, ...]`
recomputes the forward of the named chunks' LLM layers (or the first k_c
layers of chunk c; neither given: every layer of every chunk) just before
their backward, as Megatron's `--recompute-granularity full|selective` with
`--recompute-num-layers` does per stage.  A chunk's layers are, in order,
the encoder layers `balanced` folded into it (if any), then its LLM layers.

The ops and their order stay t's: a recompute is part of the backward it
precedes.  What changes is each pipeline's record of it
(`Pipeline.recompute`, per chunk the count of fully and of selectively
recomputed layers), which `chunks.chunk_costs` reads: those layers' forward
time is added to the chunk's B (and fused BW), their forward keeps only what
the mode keeps (`memory_model`), and the rest is rebuilt from the backward's
start until it ends.  Layers fully recomputed stay so when a selective
recompute names them again.  A frozen encoder's folded layers have no
backward and are never recomputed; an encoder that runs as ops of its own is
recomputed by the layer counts (its recompute on another device is
transpose's `backward=recompute`); `encoders=yes` recomputes such an
encoder's forward just before its backward too (the chunks or layers named
as well, default every chunk), `encoders=only` that alone: its ops keep what
the mode keeps (`Encoder.activations`), its backward (B, or a fused BW) gains
the forward's time and rebuilds the rest while it runs, as InternVL trains its
vision tower with gradient checkpointing.  A frozen encoder is never
recomputed (it keeps nothing for a backward).
"""
from __future__ import annotations

from dataclasses import replace

from mpipe_core.errors import ArgumentError
from mpipe_core.ir.schedule import Schedule
from mpipe_core.simulation.chunks import chain_layers
from mpipe_core.workloads.workload import Workload

NOTHING = (0, 0)


def recompute(schedule: Schedule, workload: Workload, mode: str = "full", chunks=None, layers=None,
              encoders: str = "no") -> Schedule:
    if chunks is not None and layers is not None:
        raise ArgumentError("layers", "give chunks or layers, not both")
    if encoders == "only" and (chunks is not None or layers is not None):
        raise ArgumentError("encoders", "encoders=only recomputes no LLM layer: give chunks or layers with "
                                        "encoders=yes instead")
    if encoders != "no" and not any(e.trainable for e in workload.encoders):
        raise ArgumentError("encoders", "the workload has no trained encoder to recompute")
    pipelines = []
    for pipe in schedule.pipelines:
        if encoders != "no":
            pipe = replace(pipe, encoder_recompute="full" if "full" in (mode, pipe.encoder_recompute) else mode)
        if encoders == "only":
            pipelines.append(pipe)
            continue
        held = chain_layers(pipe, workload)
        if layers is not None:
            if len(layers) != pipe.chunks:
                raise ArgumentError("layers", f"{len(layers)} layer counts for {pipe.chunks} chunks "
                                              f"(give one per chunk, in chunk order)")
            for c, (k, n) in enumerate(zip(layers, held)):
                if k > n:
                    raise ArgumentError("layers", f"layers[{c}] is {k} but chunk {c} holds {n} "
                                                  f"layer{'' if n == 1 else 's'}")
            wanted = list(layers)
        elif chunks is not None:
            for i, c in enumerate(chunks):
                if c >= pipe.chunks:
                    has = "chunk 0" if pipe.chunks == 1 else f"chunks 0-{pipe.chunks - 1}"
                    raise ArgumentError("chunks", f"chunk {c} is not in the term (it has {has})")
                if c in chunks[:i]:
                    raise ArgumentError("chunks", f"chunk {c} is named twice")
            wanted = [n if c in chunks else 0 for c, n in enumerate(held)]
        else:
            wanted = held
        current = pipe.recompute or (NOTHING,) * pipe.chunks
        counts = tuple(_add(done, k, mode) for done, k in zip(current, wanted))
        pipelines.append(replace(pipe, recompute=counts))
    # Same ops in the same order: the generator's columns still describe them.
    return replace(schedule, pipelines=tuple(pipelines))


def _add(done: tuple[int, int], k: int, mode: str) -> tuple[int, int]:
    """(full, selective) counts once the chunk's first k layers are recomputed in `mode`
    (full layers come first, then selective ones; full wins where both apply)."""
    full, selective = done
    if mode == "full":
        new_full = max(full, k)
        return new_full, max(full + selective, new_full) - new_full
    return full, max(full + selective, k) - full
