"""A run's layout: how many ways each kind of parallelism splits the world.

`RunLayout` is the part of a run spec (`run_spec`) that says where the ranks
go: tp, sp, cp, pp (the term's devices), dp, the distributed optimizer
(ZeRO-1) and `encoder_shard`.  It comes from a workload's `parallel` section
(its keys, as `mpipe plan` and the simulator read them), `--parallel`, or a
plan row; pp always comes from the term.

The ranks are ordered as the exports and `import-trace --order` order them
(`formats.rank_layout`, Megatron's tp-cp-dp-pp, tp fastest):

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

Plain data: the executor builds its process grid from it
(`executor.parallel.grid`), the CLI and the queue check it before anything
is launched.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from mpipe_core.errors import MpipeError
from mpipe_core.formats.rank_layout import DEFAULT_ORDER, RankLayout

ENCODER_SHARDS = ("none", "optimizer", "gradients")
MAX_DEGREE = 1_000_000
# The `parallel` keys that place ranks; the others (flash_attention, overlaps, ...) price a run only.
LAYOUT_KEYS = ("tp", "sp", "cp", "dp", "distributed_optimizer", "encoder_shard")


class LayoutError(MpipeError):
    """A layout that cannot run: bad sizes, or sizes the world or the model do not fit."""


@dataclass(frozen=True)
class RunLayout:
    tp: int = 1
    sp: bool = False
    cp: int = 1
    pp: int = 1
    dp: int = 1
    distributed_optimizer: bool = False
    encoder_shard: str = "none"

    @property
    def world(self) -> int:
        """Ranks the layout needs: tp * cp * pp * dp."""
        return self.tp * self.cp * self.pp * self.dp

    def rank_layout(self) -> RankLayout:
        """The rank order of the exports and `import-trace --order` (tp fastest)."""
        return RankLayout(tp=self.tp, cp=self.cp, dp=self.dp, pp=self.pp, order=DEFAULT_ORDER,
                          source="the run's layout")

    def scaled(self, dp: int, where: str = "--scale") -> "RunLayout":
        """The same layout with `dp` replicas (tp, cp, pp and the term stay)."""
        if isinstance(dp, bool) or not isinstance(dp, int) or not 1 <= dp <= MAX_DEGREE:
            raise LayoutError(f"{where}: dp must be a whole number from 1 to {MAX_DEGREE}, got {dp!r}")
        return replace(self, dp=dp)

    def describe(self) -> str:
        parts = [f"tp={self.tp}"] + (["sp"] if self.sp else []) + [f"cp={self.cp}", f"pp={self.pp}",
                                                                     f"dp={self.dp}"]
        if self.distributed_optimizer:
            parts.append("distributed_optimizer")
        if self.encoder_shard != "none":
            parts.append(f"encoder_shard={self.encoder_shard}")
        return " ".join(parts) + f" ({self.world} ranks)"

    def check_world(self, world: int, where: str) -> None:
        if world != self.world:
            raise LayoutError(f"{where}: {world} ranks, but the layout {self.describe()} needs "
                              f"tp*cp*pp*dp = {self.world}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "layout") -> "RunLayout":
        if not isinstance(doc, Mapping):
            raise LayoutError(f"{where}: expected an object with tp, sp, cp, pp, dp, distributed_optimizer, "
                              f"encoder_shard")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(doc) - known)
        if unknown:
            raise LayoutError(f"{where}: unknown key '{str(unknown[0])[:30]}' (known: {', '.join(sorted(known))})")
        out = {}
        for key in ("tp", "cp", "pp", "dp"):
            value = doc.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
                raise LayoutError(f"{where}.{key}: expected a whole number from 1 to {MAX_DEGREE}, "
                                  f"got {str(value)[:30]!r}")
            out[key] = value
        for key in ("sp", "distributed_optimizer"):
            value = doc.get(key, False)
            if not isinstance(value, bool):
                raise LayoutError(f"{where}.{key}: expected true or false, got {str(value)[:30]!r}")
            out[key] = value
        shard = doc.get("encoder_shard", "none")
        if shard not in ENCODER_SHARDS:
            raise LayoutError(f"{where}.encoder_shard: expected one of {', '.join(ENCODER_SHARDS)}, "
                              f"got {str(shard)[:30]!r}")
        out["encoder_shard"] = shard
        return cls(**out)

    @classmethod
    def from_parallel(cls, parallel: Mapping[str, Any] | None, pp: int,
                      where: str = "the workload's parallel section") -> "RunLayout":
        """A workload's `parallel` section (or `--parallel`'s pairs) with the term's pp."""
        section = {k: v for k, v in (parallel or {}).items() if k in LAYOUT_KEYS}
        return cls.from_dict({**section, "pp": pp}, where)


def parse_scale(text: str) -> int:
    """`--scale dp=K`: the data-parallel degree to run a spec at."""
    key, sep, value = text.strip().partition("=")
    if key.strip().lower() != "dp" or not sep:
        raise LayoutError(f"--scale {text[:40]}: expected dp=K (only dp scales: tp, cp, pp and the schedule stay)")
    value = value.strip()
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_DEGREE:
        raise LayoutError(f"--scale {text[:40]}: dp must be a whole number from 1 to {MAX_DEGREE}")
    return int(value)


def workload_layout(document: Any, devices: int, overrides: Mapping[str, Any] | None = None,
                    where: str = "the workload's parallel section") -> RunLayout:
    """The layout a workload document's `parallel` section gives a term of `devices`
    devices (an explicit-cost document, or none: one pipeline), with `overrides`
    (`--parallel`'s pairs) over it."""
    from mpipe_core.workloads.analytic import parallel_section

    section = parallel_section(document) if isinstance(document, Mapping) and "model" in document else {}
    return RunLayout.from_parallel({**section, **(overrides or {})}, devices, where)


def runnable_workload_layout(document: Any, devices: int, where: str = "the workload's parallel section") -> RunLayout:
    """The layout a run of a saved workload executes: its `parallel` section as a whole, or,
    where that asks for tensor parallelism (a saved workload's tp is another model's deployment, and
    whether a model here can run it is the executor's to say, which enqueue cannot ask), one
    pipeline: another model's deployment (a 512-device plan launched on a small model) is
    not partly replicated, and the run says what it dropped (`run_identity`).  `--parallel`
    and a run spec ask for a layout outright and are checked, not dropped."""
    layout = workload_layout(document, devices, None, where)
    if layout.tp > 1:
        return RunLayout.from_parallel({}, devices, where)
    return layout
