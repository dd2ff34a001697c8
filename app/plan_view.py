"""The Plan page's pieces: `mpipe plan` run in a child process that reports its
progress, its refusals in the page's words, and what the page draws of the
result (the candidates against peak memory, a layout's device map and step
time breakdown); the launch arguments are `launch_view`'s.

The search runs in a spawned child (as the app's big evaluations do,
`evaluation._in_child`): the page keeps drawing its progress bar and a rerun
(new inputs, leaving the page) ends the child at once.
"""
from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import plotly.graph_objects as go

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.units import seconds

from .figures import CAPACITY_DASH, OVER_COLOUR, OVER_MARK, plain_title

# The CLI's flags as the page's own controls (the core's messages name the flags).
PAGE_WORDS = (
    ("--memory-cap none searches without a cap", "“no cap” searches without one"),
    ("give --cluster (presets:", "pick a cluster (presets:"),
    ("--global-batch", "the global batch"),
    ("--devices", "devices"),
    ("--cluster", "the cluster"),
    ("--top", "top K"),
)
PROGRESS_EVERY_S = 0.2  # the child sends at most this often (and always the last one)
MAX_DEVICES = 65_536  # the most devices the page plans for


def page_message(message: str) -> str:
    for flag, words in PAGE_WORDS:
        message = message.replace(flag, words)
    return message


@dataclass(frozen=True)
class PlanInputs:
    """What one search is asked: compared to tell whether a shown result is for the inputs on screen."""

    document: str  # canonical JSON of the analytic workload document
    devices: int
    global_batch: int
    cluster: str | None  # a cluster preset, None: the workload's, else its device's
    memory_cap: float | str | None  # GB, "capacity" (the device's memory) or None (no cap)
    top: int
    evaluations: int  # the search budget in terms (`plan`'s max_evaluations): no answer depends on load


def devices_problem(devices: int) -> str | None:
    """Why the Devices input cannot be planned for (None: it can)."""
    if devices < 1:
        return f"Devices must be at least 1 (got {devices:,}): plan is disabled until it is."
    if devices > MAX_DEVICES:
        return f"Devices must be at most {MAX_DEVICES:,} (got {devices:,}): plan is disabled until it is."
    return None


def devices_words(document: dict, cluster: str | None, devices: int) -> str:
    """The count as the cluster's users say it: "512 devices (256 NPUs, 2 dies each)" on
    CloudMatrix384; "N devices" where the cluster is unknown or a device is a whole chip."""
    from mpipe_core.search.plan import dies_per_npu
    from mpipe_core.workloads.cluster import CLUSTERS, devices_text

    if cluster is not None:
        return devices_text(devices, CLUSTERS[cluster].get("dies_per_npu", 1) if cluster in CLUSTERS else 1)
    return devices_text(devices, dies_per_npu(document))


def search(inputs: PlanInputs, progress: Callable[[int, int, str], None] | None = None):
    """`plan` itself, on the inputs (what the child runs; the tests call it to compare)."""
    from mpipe_core.search.plan import plan

    doc = json.loads(inputs.document)
    if not isinstance(doc, dict) or "model" not in doc:
        raise MpipeError("plan needs an analytic workload (one that names a model and a device); this one "
                         "states its costs explicitly")
    return plan(doc, inputs.devices, inputs.global_batch, inputs.cluster, inputs.memory_cap, inputs.top,
                progress=progress, max_evaluations=inputs.evaluations)


def _child(inputs: PlanInputs, conn) -> None:
    last = [0.0]

    def progress(done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or (total and done == total):
            last[0] = now
            conn.send(("progress", (done, total, what)))

    try:
        conn.send(("ok", search(inputs, progress)))
    except MpipeError as error:
        conn.send(("error", error.message))


def run_plan(inputs: PlanInputs, on_progress: Callable[[int, int, str], None]):
    """The PlanResult of `inputs`, searched in a child process; `on_progress(done,
    total, what)` as it goes.  MpipeError (in the page's words) when plan refuses."""
    from .child_process import start_child

    receive, send = multiprocessing.get_context("spawn").Pipe(duplex=False)
    child = start_child(_child, (inputs, send))
    send.close()
    latest = (0, 0, "reading the layouts")
    try:
        while True:
            if not receive.poll(0.25):
                if not child.is_alive() and not receive.poll(0):
                    raise MpipeError("the plan process ended without an answer")
                on_progress(*latest)  # a Streamlit call: a rerun interrupts the page here
                continue
            kind, value = receive.recv()
            if kind == "progress":
                latest = value
                on_progress(*value)
            elif kind == "ok":
                return value
            else:
                raise MpipeError(page_message(value))
    finally:
        if child.is_alive():
            child.kill()
        child.join(timeout=5)
        receive.close()


# --- figures -----------------------------------------------------------------------------------

FAMILY_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
STEP_TIME, MFU = "step time", "MFU"


def family_colours(families) -> dict[str, str]:
    return {f: FAMILY_COLOURS[i % len(FAMILY_COLOURS)] for i, f in enumerate(sorted(families))}


def _y(c, measure: str) -> float:
    return c.step_time_s if measure == STEP_TIME else 100 * c.mfu


def candidates_figure(result, measure: str = STEP_TIME, chosen=None, show_over: bool = False) -> go.Figure:
    """Every candidate evaluated within the memory cap: its step time (or MFU)
    against its peak memory, one colour per encoder strategy (family), the
    Pareto front drawn over them, the cap as a vertical line, the chosen one
    ringed.  The axes fit what fits: candidates over the cap (crosses in their
    strategy's colour) are drawn only with `show_over`."""
    colours = family_colours({c.family for c in result.candidates})
    unit = "%" if measure == MFU else "s"
    hover = ("%{text}<br>" + ("step time %{y:.4g} s" if measure == STEP_TIME else "MFU %{y:.3g}%")
             + "<br>peak memory %{x:.4g} GB<extra></extra>")

    def points(cands, **kw) -> go.Scatter:
        return go.Scatter(x=[c.peak_memory for c in cands], y=[_y(c, measure) for c in cands],
                          text=[plain_title(f"{c.layout.label()} {c.term}") for c in cands],
                          hovertemplate=hover, **kw)

    fig = go.Figure()
    shown = [c for c in result.candidates if c.within_cap or show_over]
    for family, colour in colours.items():
        mine = [c for c in result.candidates if c.family == family and c.within_cap]
        if mine:
            fig.add_trace(points(mine, mode="markers", name=family, legendgroup=family,
                                 marker=dict(color=colour, size=9)))
        over = [c for c in result.candidates if c.family == family and not c.within_cap]
        if over and show_over:
            fig.add_trace(points(over, mode="markers", name=f"{family} {OVER_MARK} over the cap", legendgroup=family,
                                 marker=dict(color=colour, size=9, symbol="x", line=dict(width=1,
                                                                                          color=OVER_COLOUR))))
    front = result.pareto()
    fig.add_trace(points(front, mode="lines+markers", name="Pareto front",
                         line=dict(color="#111111", width=2.5, shape="hv"),
                         marker=dict(color="#111111", size=5, symbol="diamond")))
    if chosen is not None:
        fig.add_trace(points([chosen], mode="markers", name="chosen",
                             marker=dict(size=18, symbol="circle-open", color="black", line=dict(width=2))))
    if result.memory_cap is not None and shown:
        ys = [_y(c, measure) for c in shown]
        lo, hi = min(ys), max(ys)
        pad = 0.05 * (hi - lo or hi or 1.0)
        fig.add_trace(go.Scatter(x=[result.memory_cap] * 2, y=[lo - pad, hi + pad], mode="lines",
                                 name=f"memory cap {result.memory_cap:.4g} GB", hoverinfo="skip",
                                 line=dict(color=OVER_COLOUR, dash=CAPACITY_DASH)))
    hidden = len(result.candidates) - len(shown)
    title = f"Candidates: {measure} against peak memory"
    if hidden:
        title += f" ({hidden:,} over the memory cap not drawn)"
    fig.update_layout(height=420, title=title, legend=dict(orientation="h", y=-0.2),
                      margin=dict(t=50, l=60, r=20, b=40), plot_bgcolor="white")
    fig.update_xaxes(title_text="peak memory per device (GB): static + activations", gridcolor="#eeeeee")
    fig.update_yaxes(title_text=f"{measure} ({unit})", gridcolor="#eeeeee")
    return fig


BREAKDOWN = (("compute", "compute", "#4c78a8"), ("tp_comm", "TP", "#f58518"), ("cp_comm", "CP", "#e45756"),
             ("encoder_comm", "encoder comm", "#72b7b2"), ("dp_comm", "DP", "#54a24b"),
             ("bubble", "bubble", "#bab0ac"), ("optimizer", "optimizer", "#b279a2"))


def breakdown_figure(candidate) -> go.Figure:
    """The candidate's step time as one stacked bar: compute, TP, CP, encoder
    communication, DP, bubble and optimizer (the parts the core's step figures add up)."""
    b = candidate.breakdown
    fig = go.Figure([go.Bar(y=["step"], x=[b.get(key, 0.0)], name=label, orientation="h",
                            marker_color=colour, hovertemplate=f"{label} %{{x:.4g}} s<extra></extra>")
                     for key, label, colour in BREAKDOWN if b.get(key, 0.0) > 0 or key in ("compute", "bubble")])
    fig.update_layout(barmode="stack", height=190, title=f"Step time {seconds(candidate.step_time_s)}, by part",
                      margin=dict(t=40, l=50, r=20, b=30), legend=dict(orientation="h", y=-0.35),
                      plot_bgcolor="white")
    fig.update_xaxes(title_text="seconds", gridcolor="#eeeeee")
    return fig


GROUP_MARKS = {"tp": ("square-open", "#000000"), "cp": ("cross-thin-open", "#e45756"),
               "dp": ("circle-open", "#d62728"), "pp": ("diamond-open", "#2ca02c")}
GROUP_NAMES = {"tp": "TP", "cp": "CP", "dp": "DP", "pp": "PP"}


def group_of(dmap: dict, dim: str, rank: int) -> list[int]:
    return next(g for g in dmap["groups"][dim] if rank in g)


# Qualitative colours for pipeline stages (Plotly's Dark24 without its greys): neighbouring
# stages never share a shade, as they would on a continuous scale.
STAGE_COLOURS = ("#2E91E5", "#E15F99", "#1CA71C", "#FB0D0D", "#DA16FF", "#B68100", "#750D86", "#EB663B",
                 "#511CFB", "#00A08B", "#FB00D1", "#FC0080", "#B2828D", "#6C7C32", "#778AAE", "#862A16",
                 "#A777F1", "#620042", "#1616A7", "#DA60CA", "#6C4516", "#0D2A63", "#AF0038")


def stage_colorscale(stages: int) -> list[list]:
    """A stepped colour scale over stages 0..stages-1 (cmin -0.5, cmax stages - 0.5):
    one flat band per stage, the palette repeating beyond its length."""
    scale = []
    for k in range(stages):
        colour = STAGE_COLOURS[k % len(STAGE_COLOURS)]
        scale += [[k / stages, colour], [(k + 1) / stages, colour]]
    return scale


def device_map_figure(dmap: dict, rank: int = 0) -> go.Figure:
    """Every rank as a cell: its node a row, its place in the node a column,
    coloured by pipeline stage (one flat colour each); each supernode (domain) boxed; the TP, CP, DP
    and PP groups of `rank` marked (hover: every rank's coordinates)."""
    ranks = dmap["ranks"]
    per_node, per_domain = dmap["devices_per_node"], dmap["nodes_per_domain"]
    nodes = ranks[-1]["node"] + 1
    x = np.array([r["rank"] % per_node for r in ranks])
    y = np.array([r["node"] for r in ranks])
    size = max(4, min(22, int(600 / max(per_node, nodes))))
    text = [f"rank {r['rank']}<br>node {r['node']} · supernode {r['domain']}<br>tp {r['tp']} · cp {r['cp']} · "
            f"dp {r['dp']} · pp stage {r['pp']}" for r in ranks]
    stages = max(r["pp"] for r in ranks) + 1
    every = max(1, -(-stages // 16))  # colour bar ticks: at most 16 of them
    fig = go.Figure(go.Scatter(x=x, y=y, mode="markers", name="ranks (colour: pipeline stage)", text=text,
                               hovertemplate="%{text}<extra></extra>",
                               marker=dict(symbol="square", size=size, color=[r["pp"] for r in ranks],
                                           colorscale=stage_colorscale(stages), cmin=-0.5, cmax=stages - 0.5,
                                           colorbar=dict(title="PP stage", thickness=12, tickmode="array",
                                                         tickvals=list(range(0, stages, every))))))
    for dim, (symbol, colour) in GROUP_MARKS.items():
        members = group_of(dmap, dim, rank)
        if len(members) < 2:
            continue
        fig.add_trace(go.Scatter(x=[m % per_node for m in members], y=[ranks[m]["node"] for m in members],
                                 mode="markers", name=f"{GROUP_NAMES[dim]} group of rank {rank} ({len(members)})",
                                 hoverinfo="skip",
                                 marker=dict(symbol=symbol, size=size + 6, color=colour, line=dict(width=2))))
    domains = (nodes + per_domain - 1) // per_domain
    for d in range(domains):
        top = min(nodes, (d + 1) * per_domain) - 0.5
        fig.add_shape(type="rect", x0=-0.7, x1=per_node - 0.3, y0=d * per_domain - 0.5, y1=top,
                      line=dict(color="#555555", width=2, dash="dot"), fillcolor="rgba(0,0,0,0)")
        fig.add_annotation(x=per_node - 0.3, y=top, text=f"supernode {d}", showarrow=False, xanchor="right",
                           yanchor="bottom", font=dict(size=11, color="#555555"))
    every = max(1, nodes // 32)
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=list(range(0, nodes, every)),
                     ticktext=[f"node {n}" for n in range(0, nodes, every)], showgrid=False, zeroline=False)
    fig.update_xaxes(title_text="device in its node", tickmode="array", tickvals=list(range(per_node)),
                     showgrid=False, zeroline=False)
    fig.update_layout(height=min(1200, 140 + nodes * (size + 4)), plot_bgcolor="white",
                      title=f"{len(ranks)} ranks on {nodes} nodes of {per_node} ({domains} supernode"
                            f"{'s' if domains != 1 else ''} of {per_domain} nodes), rank order {dmap['order']}",
                      legend=dict(orientation="h", y=-0.08), margin=dict(t=50, l=70, r=20, b=40))
    return fig


GROUPS_LISTED = 4  # groups a row of the groups table names one by one


def groups_rows(dmap: dict, rank: int) -> list[dict[str, Any]]:
    """Per dimension: how many groups of how many ranks, the first few, and `rank`'s own."""
    rows = []
    for dim in ("tp", "cp", "dp", "pp"):
        groups = dmap["groups"][dim]
        first = ", ".join(str(g) for g in groups[:GROUPS_LISTED]) + (", …" if len(groups) > GROUPS_LISTED else "")
        rows.append({"group": GROUP_NAMES[dim], "groups": len(groups), "ranks each": len(groups[0]),
                     f"rank {rank}'s": str(group_of(dmap, dim, rank)), "first groups": first})
    return rows


def candidate_label(index: int, c) -> str:
    return f"#{index + 1}  {seconds(c.step_time_s)} · MFU {c.mfu:.1%} · {c.peak_memory:.4g} GB · {c.layout.label()} · " \
           f"{c.term}" + ("" if c.within_cap else f"  {OVER_MARK} over the cap")
