"""The canonical LLM schedule generators, by the name a term calls them.

Each generator takes integer sizes (`p` ranks, `m` microbatches, sometimes `v`
chunks per rank) and returns a `Schedule` of `Op(LLM, kind, chunk, mb)` ops,
one order per rank.  `chunk` is torch's stage index (0..p*v-1).  A size that
breaks a rule raises `ArgumentError` naming the argument.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mpipe_core.algebra.generators.gpipe import gpipe
from mpipe_core.algebra.generators.interleaved import interleaved
from mpipe_core.algebra.generators.looped_bfs import looped_bfs
from mpipe_core.algebra.generators.one_f_one_b import one_f_one_b
from mpipe_core.algebra.generators.v_shape import dualpipev, zbv
from mpipe_core.algebra.generators.zero_bubble import zb_h1, zb_h2
from mpipe_core.ir.schedule import Schedule

REQUIRED = None  # the default of a parameter a term must give


@dataclass(frozen=True)
class GeneratorSpec:
    """A generator as the term language sees it.

    `params` maps each parameter name, in call order, to its default;
    `REQUIRED` (None) marks one without a default.
    """

    name: str
    function: Callable[..., Schedule]
    params: dict[str, Any]
    description: str

    def __call__(self, **kwargs: Any) -> Schedule:
        return self.function(**kwargs)


GENERATORS: dict[str, GeneratorSpec] = {
    spec.name: spec
    for spec in (
        GeneratorSpec("gpipe", gpipe, {"p": REQUIRED, "m": REQUIRED},
                      "GPipe: all forwards, then all fused backwards"),
        GeneratorSpec("1f1b", one_f_one_b, {"p": REQUIRED, "m": REQUIRED},
                      "1F1B: p-r-1 warm-up forwards, then forward/backward pairs"),
        GeneratorSpec("interleaved", interleaved, {"p": REQUIRED, "m": REQUIRED, "v": 2},
                      "Interleaved 1F1B over v looped chunks per rank (torch's rounds)"),
        GeneratorSpec("looped_bfs", looped_bfs, {"p": REQUIRED, "m": REQUIRED, "v": 2},
                      "Breadth-first: v looped chunks per rank, chunk by chunk"),
        GeneratorSpec("zb_h1", zb_h1, {"p": REQUIRED, "m": REQUIRED},
                      "ZB-H1: 1F1B with split B/W, W filling the cool-down"),
        GeneratorSpec("zb_h2", zb_h2, {"p": REQUIRED, "m": REQUIRED},
                      "ZB-H2: ZB-H1 with twice the warm-up, W deferred to the tail"),
        GeneratorSpec("zbv", zbv, {"p": REQUIRED, "m": REQUIRED},
                      "ZB-V: zero bubble on 2 V-placed chunks per rank"),
        GeneratorSpec("dualpipev", dualpipev, {"p": REQUIRED, "m": REQUIRED},
                      "DualPipeV: overlapped forward/backward pairs on 2 V-placed chunks"),
    )
}

__all__ = [
    "GENERATORS",
    "GeneratorSpec",
    "REQUIRED",
    "dualpipev",
    "gpipe",
    "interleaved",
    "looped_bfs",
    "one_f_one_b",
    "zb_h1",
    "zb_h2",
    "zbv",
]
