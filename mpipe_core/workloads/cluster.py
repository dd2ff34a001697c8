"""The cluster an analytic workload runs on: nodes, scale-up domains, their links,
and where each rank sits.

A cluster has `devices_per_node` devices on the node's scale-up network (NVLink,
HCCS), `nodes_per_domain` nodes on a wider scale-up domain (CloudMatrix384's UB
network; 1 = none) and a scale-out network between nodes or domains
(InfiniBand, RoCE).  Each link class is a per-device unidirectional bandwidth,
a latency and the achieved fraction of that bandwidth.

Ranks are laid out by `order`, fastest-varying first: Megatron-LM's default
"tp-cp-dp-pp" puts a tensor-parallel group on consecutive ranks, then context,
data and pipeline parallelism (`--use-tp-pp-dp-mapping` would be "tp-cp-pp-dp").
Rank r sits on node r // devices_per_node, in domain node // nodes_per_domain.
A group (every rank varying one coordinate, the others fixed) or a pipeline hop
is priced on the slowest link class it crosses: the scale-up link inside a
node, the domain link between nodes of one domain, the scale-out link beyond;
the slowest over every such group of the layout.

Pure data and arithmetic (imports nothing of the core but its errors).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping

from mpipe_core.errors import WorkloadError

LEVELS = ("scale_up", "domain", "scale_out")
DIMENSIONS = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"
MAX_DEVICES_PER_NODE = 1_000_000


@dataclass(frozen=True)
class LinkClass:
    """One class of link: per-device unidirectional GB/s (1e9 bytes), per-hop
    latency in microseconds, and the achieved fraction of the bandwidth.  As a
    group's link (`group_link`) it also carries what its ring collectives pay
    in latency (`collectives`): the cluster's per-collective base, and for a
    group over `nodes` nodes the latency of the hops inside a node."""

    name: str
    gbps: float
    latency_us: float
    efficiency: float = 1.0
    base_latency_us: float = 0.0  # once per collective (NCCL's baseLat)
    nodes: int = 1  # nodes (or domains) the group's ring spans: its hops between them pay latency_us
    inner_latency_us: float | None = None  # its other hops' (inside a node); None: latency_us

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth in bytes per second."""
        return self.gbps * 1e9 * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    @property
    def inner_latency_s(self) -> float:
        return (self.latency_us if self.inner_latency_us is None else self.inner_latency_us) * 1e-6

    def as_dict(self) -> dict[str, float]:
        return {"GBps": self.gbps, "latency_us": self.latency_us, "efficiency": self.efficiency}


@dataclass(frozen=True)
class Cluster:
    name: str
    devices_per_node: int
    nodes_per_domain: int
    scale_up: LinkClass
    domain: LinkClass
    scale_out: LinkClass
    order: tuple[str, ...] = tuple(DEFAULT_ORDER.split("-"))
    nodes: int | None = None  # how many nodes there are (None: as many as a layout needs)
    collective_latency_us: float = 0.0  # every ring collective's fixed latency (NCCL's baseLat)
    # Dies per NPU package: CloudMatrix384's device is one die of a 910C, two to an NPU (1: a
    # device is the whole chip, as a GPU).
    dies_per_npu: int = 1

    def count_text(self, devices: int) -> str:
        """`devices_text` on this cluster: "512 devices (256 NPUs, 2 dies each)"."""
        return devices_text(devices, self.dies_per_npu)

    def link(self, level: str) -> LinkClass:
        return {"scale_up": self.scale_up, "domain": self.domain, "scale_out": self.scale_out}[level]

    def level_between(self, first: int, last: int) -> str:
        """The outermost level ranks first..last (a contiguous span) cross."""
        a, b = first // self.devices_per_node, last // self.devices_per_node
        if a == b:
            return "scale_up"
        if self.nodes_per_domain > 1 and a // self.nodes_per_domain == b // self.nodes_per_domain:
            return "domain"
        return "scale_out"

    def slowest(self, levels: set[str], per_node: int = 1) -> LinkClass:
        """The slowest link among the classes a group crosses (crossing nodes inside
        a domain also uses the scale-up link, and so on outwards).  A group with
        `per_node` ranks on each node reaches per_node x the per-device bandwidth
        of the links between nodes (NCCL runs a ring through each rank's own
        NIC), never more than the scale-up link."""
        crossed = {"scale_up"}
        if "domain" in levels:
            crossed.add("domain")
        if "scale_out" in levels:
            crossed |= {"domain", "scale_out"} if self.nodes_per_domain > 1 else {"scale_out"}
        links = [self.link(level) for level in reversed(LEVELS) if level in crossed]  # outer first: ties go out
        outer = [replace(link, gbps=min(link.gbps * per_node, self.scale_up.gbps)) if link.name != "scale_up"
                 and per_node > 1 else link for link in links]
        return min(outer, key=lambda link: link.bytes_per_s)

    def as_dict(self) -> dict[str, Any]:
        return {"preset": self.name, "devices_per_node": self.devices_per_node,
                "nodes_per_domain": self.nodes_per_domain,
                "links": {level: self.link(level).as_dict() for level in LEVELS},
                "order": "-".join(self.order), **({"nodes": self.nodes} if self.nodes is not None else {}),
                **({"collective_latency_us": self.collective_latency_us} if self.collective_latency_us else {}),
                **({"dies_per_npu": self.dies_per_npu} if self.dies_per_npu != 1 else {})}


def devices_text(devices: int, dies_per_npu: int = 1) -> str:
    """A device count as a user reads it: where a device is one die of a
    multi-die NPU, the NPUs too ("512 devices (256 NPUs, 2 dies each)"); else
    "8 devices"."""
    word = "device" if devices == 1 else "devices"
    if dies_per_npu <= 1:
        return f"{devices:,} {word}"
    npus = devices / dies_per_npu
    npu_text = f"{devices // dies_per_npu:,}" if devices % dies_per_npu == 0 else f"{npus:,.1f}"
    return f"{devices:,} {word} ({npu_text} NPU{'' if npus == 1 else 's'}, {dies_per_npu} dies each)"


@dataclass(frozen=True)
class Placement:
    """Where a tp x cp x dp x pp layout's groups sit on a cluster: per dimension the
    slowest link class one of its groups crosses ("" for a group of one), and
    the pipeline hop's."""

    sizes: Mapping[str, int]
    group_level: Mapping[str, str]
    hop_level: str
    notes: tuple[str, ...] = ()
    per_node: Mapping[str, int] | None = None  # ranks of one group on one node

    @property
    def devices_total(self) -> int:
        return math.prod(self.sizes.values())


def strides(order: tuple[str, ...], sizes: Mapping[str, int]) -> dict[str, int]:
    """Rank stride of each dimension: 1 for the first in `order`, then the product of those before."""
    out, stride = {}, 1
    for dim in order:
        out[dim] = stride
        stride *= sizes[dim]
    return out


def _span_levels(cluster: Cluster, world: int, stride: int, count: int, dim_stride_span: int) -> set[str]:
    """Levels crossed by the spans base .. base + (count-1)*stride over every
    base whose coordinate of that dimension is 0 (the pattern repeats every
    lcm(span, domain size) ranks, so only those bases are visited)."""
    if count <= 1:
        return set()
    domain = cluster.devices_per_node * cluster.nodes_per_domain
    period = min(world, math.lcm(dim_stride_span, domain))
    levels = set()
    for base in range(period):
        if (base // stride) % count:  # not the group's first rank
            continue
        levels.add(cluster.level_between(base, base + (count - 1) * stride))
        if len(levels) == 3:
            break
    return levels


def place(cluster: Cluster, tp: int, cp: int, dp: int, pp: int, check: bool = True) -> Placement:
    """Where the groups of a tp x cp x dp x pp layout sit (`Placement`); `check`:
    refuse a layout beyond one node that does not fill whole nodes, or beyond
    the cluster's declared `nodes` (off when
    only the tp and cp groups are asked for, before pp is known)."""
    return _place(cluster, tp, cp, dp, pp, check)


@lru_cache(maxsize=256)
def _place(cluster: Cluster, tp: int, cp: int, dp: int, pp: int, check: bool) -> Placement:
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    world = tp * cp * dp * pp
    n = cluster.devices_per_node
    if check and world > n and world % n:
        raise WorkloadError(f"cluster: {world} devices (tp·cp·dp·pp = {tp}·{cp}·{dp}·{pp}) is not a multiple "
                            f"of devices_per_node ({n}): a layout beyond one node needs whole nodes")
    if check and cluster.nodes is not None and world > cluster.nodes * n:
        raise WorkloadError(f"cluster: {world} devices (tp·cp·dp·pp = {tp}·{cp}·{dp}·{pp}) do not fit "
                            f"the cluster's {cluster.nodes} node{'s' if cluster.nodes != 1 else ''} of {n} "
                            f"({cluster.nodes * n} devices)")
    st = strides(cluster.order, sizes)
    group_level = {}
    for dim in DIMENSIONS:
        levels = _span_levels(cluster, world, st[dim], sizes[dim], st[dim] * sizes[dim])
        group_level[dim] = _outermost(levels)
    # A hop: rank r (stage s < pp - 1) sends to r + stride(pp), for every such r.
    levels = set()
    if pp > 1:
        period = min(world, math.lcm(st["pp"] * pp, n * cluster.nodes_per_domain))
        for base in range(period):
            if (base // st["pp"]) % pp < pp - 1:
                levels.add(cluster.level_between(base, base + st["pp"]))
    hop = _outermost(levels)
    per_node = {dim: max(1, min(sizes[dim], n // st[dim])) if st[dim] < n else 1 for dim in DIMENSIONS}
    notes = ()
    if group_level["tp"] not in ("", "scale_up"):
        notes = (f"the tensor-parallel group of {tp} spans nodes ({n} devices per node): "
                 f"priced on the {group_level['tp'].replace('_', '-')} link",)
    return Placement(sizes, group_level, hop, notes, per_node)


def _outermost(levels: set[str]) -> str:
    for level in reversed(LEVELS):
        if level in levels:
            return level
    return "scale_up" if levels else ""


def group_link(cluster: Cluster, placement: Placement, dim: str) -> LinkClass | None:
    """The link a dimension's collectives run on (None: a group of one), with the
    latencies its ring pays: the cluster's per-collective base, and for a group
    spanning nodes the scale-up latency on its hops inside a node."""
    level = placement.group_level[dim]
    if not level:
        return None
    per_node = placement.per_node[dim] if placement.per_node else 1
    link = replace(cluster.slowest({level}, per_node), base_latency_us=cluster.collective_latency_us)
    size = placement.sizes[dim]
    if level != "scale_up" and per_node < size:
        # the hops between nodes pay the latency of the links they cross, whichever is slowest in bandwidth
        outer = ("domain",) if level == "domain" else ("domain", "scale_out") if cluster.nodes_per_domain > 1 \
            else ("scale_out",)
        link = replace(link, nodes=math.ceil(size / per_node), inner_latency_us=cluster.scale_up.latency_us,
                       latency_us=max(cluster.link(x).latency_us for x in outer))
    return link


@lru_cache(maxsize=4096)
def stage_level(cluster: Cluster, tp: int, cp: int, dp: int, pp: int, a: int, b: int) -> str:
    """The outermost level a send from pipeline stage a to stage b crosses, over
    every rank of stage a ("" when a == b)."""
    if a == b:
        return ""
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    world = tp * cp * dp * pp
    stride = strides(cluster.order, sizes)["pp"]
    period = min(world, math.lcm(stride * pp, cluster.devices_per_node * cluster.nodes_per_domain))
    levels = set()
    for block in range(0, period, stride * pp):  # the ranks of stage a, block by block
        for x in range(stride):
            base = block + a * stride + x
            other = base + (b - a) * stride
            levels.add(cluster.level_between(min(base, other), max(base, other)))
        if len(levels) == 3:
            break
    return _outermost(levels)


def hop_link(cluster: Cluster, placement: Placement) -> LinkClass | None:
    """The link a pipeline send runs on (None: one stage)."""
    return cluster.slowest({placement.hop_level}) if placement.hop_level else None


# ------------------------------------------------------------------ presets
# Figures and sources: docs/cluster.md.  GB/s per device, one direction.
CLUSTERS: dict[str, dict[str, Any]] = {
    # DGX A100: NVLink 3 600 GB/s total = 300 each way; 8 x 200 Gb/s HDR IB per node = 25 GB/s per GPU.
    # collective_latency_us: NCCL's ring/Simple base latency (src/graph/tuning.cc baseLat, 8.4 us).
    "dgx-a100": {"devices_per_node": 8, "nodes_per_domain": 1, "collective_latency_us": 8.4,
                 "links": {"scale_up": {"GBps": 300, "latency_us": 3, "efficiency": 0.8},
                           "domain": {"GBps": 25, "latency_us": 5, "efficiency": 0.8},
                           "scale_out": {"GBps": 25, "latency_us": 5, "efficiency": 0.8}}},
    # DGX H100: NVLink 4 900 GB/s total = 450 each way; 8 x 400 Gb/s NDR IB per node = 50 GB/s per GPU.
    "dgx-h100": {"devices_per_node": 8, "nodes_per_domain": 1, "collective_latency_us": 8.4,
                 "links": {"scale_up": {"GBps": 450, "latency_us": 3, "efficiency": 0.8},
                           "domain": {"GBps": 50, "latency_us": 5, "efficiency": 0.8},
                           "scale_out": {"GBps": 50, "latency_us": 5, "efficiency": 0.8}}},
    # Atlas 800T A2 (910B): 8 NPUs, HCCS 196 GB/s in the node, 25 GB/s RoCE out (vendor msmodeling, 0.7).
    "atlas-910b": {"devices_per_node": 8, "nodes_per_domain": 1,
                   "links": {"scale_up": {"GBps": 196, "latency_us": 0.5, "efficiency": 0.7},
                             "domain": {"GBps": 25, "latency_us": 1.5, "efficiency": 0.7},
                             "scale_out": {"GBps": 25, "latency_us": 1.5, "efficiency": 0.7}}},
    # CloudMatrix384: a device is one 910C die (two per NPU, 16 per 8-NPU node), 48 nodes per UB
    # domain; UB 392 GB/s per NPU each way = 196 per die; 400 Gb/s RDMA per NPU = 25 GB/s per die.
    "cloudmatrix384": {"devices_per_node": 16, "nodes_per_domain": 48, "dies_per_npu": 2,
                       "links": {"scale_up": {"GBps": 196, "latency_us": 0.5, "efficiency": 0.7},
                                 "domain": {"GBps": 196, "latency_us": 5.5, "efficiency": 0.7},
                                 "scale_out": {"GBps": 25, "latency_us": 10, "efficiency": 0.7}}},
}

CLUSTER_KEYS = {"preset", "devices_per_node", "nodes_per_domain", "links", "order", "nodes", "collective_latency_us",
                "dies_per_npu"}
LINK_KEYS = {"GBps", "latency_us", "efficiency"}


def parse_order(value: Any) -> tuple[str, ...]:
    """`order`: tp, cp, dp and pp once each, joined by '-', fastest-varying first."""
    parts = value.split("-") if isinstance(value, str) else None
    if parts is None or sorted(parts) != sorted(DIMENSIONS):
        raise WorkloadError(f"cluster.order: expected tp, cp, dp and pp once each joined by '-' "
                            f"(e.g. \"{DEFAULT_ORDER}\"), got {value!r}")
    if parts.index("pp") < max(parts.index("tp"), parts.index("cp")):
        raise WorkloadError(f"cluster.order: {value!r} puts pipeline stages inside a tensor- or "
                            "context-parallel group; tp and cp must come before pp")
    return tuple(parts)


def _positive(doc: Mapping[str, Any], key: str, where: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise WorkloadError(f"{where}.{key}: expected a positive finite number, got {value!r}")
    return float(value)


def _link(doc: Any, level: str) -> LinkClass:
    where = f"cluster.links.{level}"
    if not isinstance(doc, dict):
        raise WorkloadError(f'{where}: expected {{"GBps": ..., "latency_us": ..., "efficiency": ...}}')
    unknown = sorted(set(doc) - LINK_KEYS)
    if unknown:
        raise WorkloadError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(LINK_KEYS))})")
    latency = doc.get("latency_us", 0)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not 0 <= latency < math.inf:
        raise WorkloadError(f"{where}.latency_us: expected a finite number >= 0, got {latency!r}")
    efficiency = doc.get("efficiency", 1.0)
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise WorkloadError(f"{where}.efficiency: expected a fraction in (0, 1], got {efficiency!r}")
    return LinkClass(level, _positive(doc, "GBps", where), float(latency), float(efficiency))


def _count(doc: Mapping[str, Any], key: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEVICES_PER_NODE:
        raise WorkloadError(f"cluster.{key}: expected an integer from 1 to {MAX_DEVICES_PER_NODE}, got {value!r}")
    return value


def parse_cluster(doc: Any, default: str | None = None) -> Cluster:
    """A cluster section: a preset name, or {"preset": NAME, ...overrides} (the
    device's default cluster when no preset is named), or a full object."""
    if isinstance(doc, str):
        doc = {"preset": doc}
    if not isinstance(doc, dict):
        raise WorkloadError('cluster: expected a preset name or {"preset": ..., "devices_per_node": ..., '
                            '"nodes_per_domain": ..., "links": {...}, "order": ...}')
    unknown = sorted(set(doc) - CLUSTER_KEYS)
    if unknown:
        raise WorkloadError(f"cluster: unknown key '{unknown[0]}' (known: {', '.join(sorted(CLUSTER_KEYS))})")
    name = doc.get("preset", default)
    base: dict[str, Any] = {}
    if name is not None:
        if not isinstance(name, str) or name not in CLUSTERS:
            raise WorkloadError(f"cluster: unknown preset {str(name)[:40]!r} (known: {', '.join(sorted(CLUSTERS))})")
        base = {k: (dict(v) if isinstance(v, dict) else v) for k, v in CLUSTERS[name].items()}
    merged = {**base, **{k: v for k, v in doc.items() if k not in ("preset", "links")}}
    links = dict(base.get("links", {}))
    extra = doc.get("links", {})
    if not isinstance(extra, dict):
        raise WorkloadError("cluster.links: expected {\"scale_up\": {...}, \"domain\": {...}, \"scale_out\": {...}}")
    unknown = sorted(set(extra) - set(LEVELS))
    if unknown:
        raise WorkloadError(f"cluster.links: unknown link class '{unknown[0]}' (known: {', '.join(LEVELS)})")
    for level, spec in extra.items():
        links[level] = {**links.get(level, {}), **spec} if isinstance(spec, dict) else spec
    for key in ("devices_per_node",):
        if key not in merged:
            raise WorkloadError(f"cluster: missing required key '{key}'")
    merged.setdefault("nodes_per_domain", 1)
    for level in ("scale_up", "scale_out"):
        if level not in links:
            raise WorkloadError(f"cluster.links: missing required link class '{level}'")
    links.setdefault("domain", links["scale_out"])
    return Cluster(
        name=name or "custom",
        devices_per_node=_count(merged, "devices_per_node"),
        nodes_per_domain=_count(merged, "nodes_per_domain"),
        scale_up=_link(links["scale_up"], "scale_up"),
        domain=_link(links["domain"], "domain"),
        scale_out=_link(links["scale_out"], "scale_out"),
        order=parse_order(merged.get("order", DEFAULT_ORDER)),
        nodes=_count(merged, "nodes") if merged.get("nodes") is not None else None,
        collective_latency_us=_latency(merged.get("collective_latency_us", 0), "cluster.collective_latency_us"),
        dies_per_npu=_count(merged, "dies_per_npu") if merged.get("dies_per_npu") is not None else 1,
    )


def _latency(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise WorkloadError(f"{where}: expected a finite number >= 0, got {value!r}")
    return float(value)


def with_link(cluster: Cluster, level: str, **changes: float) -> Cluster:
    """The cluster with one link class changed (tests, what-ifs)."""
    renamed = {"GBps": "gbps"}
    link = replace(cluster.link(level), **{renamed.get(k, k): v for k, v in changes.items()})
    return replace(cluster, **{level: link})
