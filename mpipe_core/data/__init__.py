"""Samples, mixes, packing and batch drawing: the data a workload may carry.

Pure (imports only `mpipe_core.errors`), below the workloads in the layer
order, so a workload document's `data` section is checked when it is read.
`draw.draw_batches` is the one entry point the simulator's stream, the
per-batch planner and (next) the executor share.
"""
from mpipe_core.data.draw import Batch, draw_batches
from mpipe_core.data.packing import Pack, Packing, Tokens, pack
from mpipe_core.data.samples import Sample, parse_records
from mpipe_core.data.spec import DataSpec, parse_data

__all__ = ["Batch", "DataSpec", "Pack", "Packing", "Sample", "Tokens", "draw_batches", "pack", "parse_data",
           "parse_records"]
