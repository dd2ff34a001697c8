"""Plotly figures: the Gantt chart and its companions.

Ops are drawn as `go.Bar(orientation="h", base=start, x=duration, y=device)`
over numpy arrays, one trace per (module, kind), never as layout shapes
(20k shapes take seconds to build; 20k bars in numpy arrays take milliseconds).
Idle time is a hatched trace of its own, so bubbles are visible, not blank.
Above `MAX_BARS` ops the chart shows busy time aggregated into time bins per
device instead, and says so.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mpipe_core.ir.ops import COLLECTIVE_KINDS, LLM, NO_MICROBATCH, R, base_module, replica_of
from mpipe_core.workloads.units import human, quantity

from .bars import Bars
from .formatting import BASELINE_NAMES

MAX_BARS = 25_000  # above this, aggregate (a 20k-op schedule is still drawn op by op)
LABEL_LIMIT = 3_000  # microbatch labels inside bars up to this many ops
KIND_ORDER = ("F", "B", "W", "BW", "R", "BCAST", "AR", "GATHER", "SCATTER")
KIND_NAMES = {"F": "forward", "B": "backward (input grad)", "W": "weight grad", "BW": "backward",
              "R": "recompute", "BCAST": "param broadcast", "AR": "grad all-reduce",
              "GATHER": "features gathered (barrier)", "SCATTER": "feature grads scattered (barrier)"}

# One hue family per module class; shades by kind (light forward, dark weight grad).
_FAMILIES = {
    "blue": {"F": "#9ecae1", "B": "#4292c6", "W": "#08519c", "BW": "#2171b5", "R": "#c6dbef"},
    "teal": {"F": "#99d8c9", "B": "#41ae76", "W": "#005824", "BW": "#238b45", "R": "#ccece6"},
    "orange": {"F": "#fdae6b", "B": "#f16913", "W": "#a63603", "BW": "#d94801", "R": "#fdd0a2"},
    "purple": {"F": "#bcbddc", "B": "#807dba", "W": "#54278f", "BW": "#6a51a3", "R": "#dadaeb"},
    "red": {"F": "#fc9272", "B": "#ef3b2c", "W": "#99000d", "BW": "#cb181d", "R": "#fcbba1"},
    "olive": {"F": "#d9d98c", "B": "#a6a63c", "W": "#5c5c0a", "BW": "#80801f", "R": "#eeeec4"},
}
_LLM_FAMILIES = ("blue", "teal")
_ENCODER_FAMILIES = ("orange", "purple", "red", "olive")
IDLE_COLOUR = "rgba(200, 200, 200, 0.35)"
IDLE_LINE = "#b0b0b0"


@dataclass(frozen=True)
class Style:
    colour: str
    pattern: str  # "" (solid), "x", "." ...


def module_families(modules: Sequence[str]) -> dict[str, str]:
    """Hue family of each module: LLM replicas blue then teal, encoders orange,
    purple, red, olive (replicas of an encoder share its family)."""
    out: dict[str, str] = {}
    encoders = sorted({base_module(m) for m in modules if base_module(m) != LLM})
    for m in modules:
        base = base_module(m)
        if base == LLM:
            out[m] = _LLM_FAMILIES[replica_of(m) % len(_LLM_FAMILIES)]
        else:
            out[m] = _ENCODER_FAMILIES[encoders.index(base) % len(_ENCODER_FAMILIES)]
    return out


def style(family: str, kind: str) -> Style:
    shades = _FAMILIES[family]
    if kind in COLLECTIVE_KINDS:
        return Style(shades["BW"], "x")
    if kind == R:
        return Style(shades["F"], ".")
    return Style(shades.get(kind, shades["BW"]), "")


OVER_COLOUR = "#cb181d"  # what is over the device's memory: device labels, curves, bars, candidates
OVER_MARK = "▲"
CAPACITY_DASH = "dash"


def _device_axis(fig: go.Figure, devices: int, row: int | None = None, label: str = "dev",
                 over: Collection[int] = ()) -> None:
    """Device rows top to bottom; a device in `over` (its peak memory is over the
    device's capacity) has its label in red with a mark."""
    kw = dict(row=row, col=1) if row is not None else {}
    text = [f'<span style="color:{OVER_COLOUR}"><b>{label} {d} {OVER_MARK}</b></span>' if d in over
            else f"{label} {d}" for d in range(devices)]
    fig.update_yaxes(tickmode="array", tickvals=list(range(devices)), ticktext=text,
                     range=[devices - 0.5, -0.5], zeroline=False, showgrid=False, **kw)


def over_capacity_key(over: Mapping[int, float], memory_unit: str = "") -> list[go.Bar]:
    """A legend entry (no bars) saying what the red device labels mean, with how far over each is."""
    if not over:
        return []
    worst = max(over, key=over.__getitem__)
    many = f"{len(over)} devices" if len(over) > 1 else "1 device"
    text = (f"{OVER_MARK} red device label: over the device's memory ({many}; dev {worst} by "
            f"{quantity(over[worst], memory_unit)})")
    return [go.Bar(orientation="h", x=[0.0], y=[0], base=[0.0], name=text, legendgroup="over capacity",
                   showlegend=True, visible="legendonly", hoverinfo="skip", marker=dict(color=OVER_COLOUR))]


def _groups(bars: Bars) -> list[tuple[str, str, np.ndarray]]:
    """(module, kind, row indices) per trace, LLM first, kinds in a fixed order."""
    if not len(bars):
        return []
    keys = np.char.add(np.char.add(bars.module.astype(str), "|"), bars.kind.astype(str))
    uniq, inverse = np.unique(keys, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
    out = []
    for i, key in enumerate(uniq):
        module, kind = str(key).split("|")
        out.append((module, kind, order[bounds[i]:bounds[i + 1]]))

    def rank(item):
        module, kind, _ = item
        return (base_module(module) != LLM, module,
                KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER))

    return sorted(out, key=rank)


# d3 number format for hover labels: 4 significant digits, no exponent, thousands separators.
HOVER_NUMBER = ",.4~r"
# Chunks of one module on one device alternate solid and hatched, so interleaved
# chunks (chunk 0 and chunk 1 of a V schedule on one device) can be told apart.
CHUNK_PATTERN = "\\"


def _second_chunk_on_device(device: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """True for ops of a device's 2nd, 4th... chunk of the module (in chunk
    order): where one device holds several chunks (interleaved, V shapes),
    its neighbouring chunks alternate solid and hatched."""
    if not len(chunk):
        return np.zeros(0, bool)
    pairs = np.unique(np.column_stack([device, chunk]), axis=0)  # sorted by device, then chunk
    first = np.ones(len(pairs), bool)
    first[1:] = pairs[1:, 0] != pairs[:-1, 0]
    starts = np.maximum.accumulate(np.where(first, np.arange(len(pairs)), 0))
    rank = np.arange(len(pairs)) - starts  # the chunk's position among its device's chunks
    lookup = {(int(d), int(c)): int(r) % 2 == 1 for (d, c), r in zip(pairs, rank)}
    return np.fromiter((lookup[(int(d), int(c))] for d, c in zip(device, chunk)), bool, len(chunk))


# What each hatch means, for the legend: (pattern, what it marks, in the legend's words).
HATCH_KEY = {
    "chunk": (CHUNK_PATTERN, "hatched ╲: a second chunk (or encoder shard) on the same device"),
    "collective": ("x", "hatched ×: parameter broadcast or gradient all-reduce"),
    "recompute": (".", "dotted: recompute (forward run again for a backward)"),
}


def hatches_used(bars: Bars) -> list[str]:
    """The HATCH_KEY entries the bars' ops show (the idle hatch has its own entry)."""
    if not len(bars):
        return []
    kinds = set(bars.kind.tolist())
    used = []
    second = False
    for module in set(bars.module.tolist()):
        mine = bars.module == module
        for kind in kinds:
            sel = mine & (bars.kind == kind)
            if kind not in COLLECTIVE_KINDS and kind != R and sel.any() and _second_chunk_on_device(
                    bars.device[sel], bars.chunk[sel]).any():
                second = True
                break
        if second:
            break
    if second:
        used.append("chunk")
    if kinds & set(COLLECTIVE_KINDS):
        used.append("collective")
    if R in kinds:
        used.append("recompute")
    return used


def hatch_key_traces(used: Sequence[str]) -> list[go.Bar]:
    """Legend entries (no bars) that say what each hatch in the chart means."""
    traces = []
    for name in used:
        shape, text = HATCH_KEY[name]
        # Plotly lists no trace without data: one point, in a legend-only trace (which draws nothing).
        traces.append(go.Bar(
            orientation="h", x=[0.0], y=[0], base=[0.0], name=text, legendgroup=f"hatch {name}", showlegend=True,
            visible="legendonly", hoverinfo="skip", marker=dict(color="#d9d9d9", line=dict(width=0.6, color="white"),
                                          pattern=dict(shape=shape, fgcolor="rgba(0,0,0,0.55)", size=6))))
    return traces


def op_traces(bars: Bars, *, name_prefix: str = "", y_offset: float = 0.0, width: float = 0.8,
              opacity: float = 1.0, labels: bool | None = None, legendgroup_prefix: str = "",
              showlegend: bool = True, families: dict[str, str] | None = None) -> list[go.Bar]:
    """One horizontal bar trace per (module, kind).  Hover data per bar:
    chunk, microbatch, step, start, end, duration, device."""
    families = families or module_families(list(dict.fromkeys(bars.module.tolist())))
    labels = len(bars) <= LABEL_LIMIT if labels is None else labels
    unit = bars.unit
    num = HOVER_NUMBER
    traces = []
    for module, kind, idx in _groups(bars):
        st_ = style(families[module], kind)
        start, end = bars.start[idx], bars.end[idx]
        mb, chunk = bars.mb[idx], bars.chunk[idx]
        collective = kind in COLLECTIVE_KINDS
        custom = np.column_stack([chunk, mb, bars.step[idx], start, end, end - start, bars.device[idx]])
        ident = (f"{module}:%{{customdata[0]}}{kind}" if collective
                 else f"{module}:%{{customdata[0]}}{kind}%{{customdata[1]}}")
        step = html.escape(bars.step_label) if bars.step_label else "step %{customdata[2]}"
        hover = (f"<b>{ident}</b> ({KIND_NAMES.get(kind, kind)}) on dev %{{customdata[6]}}<br>"
                 f"{'' if collective else 'chunk %{customdata[0]} · microbatch %{customdata[1]} · '}"
                 f"{step}<br>"
                 f"start %{{customdata[3]:{num}}} · end %{{customdata[4]:{num}}} · "
                 f"duration %{{customdata[5]:{num}}} {unit}<extra></extra>")
        text = None
        if labels and not collective:
            text = np.where(mb == NO_MICROBATCH, "", mb.astype(str))
        # A thin white edge keeps back-to-back ops of one kind from merging into one block.
        marker = dict(color=st_.colour, line=dict(width=0.6, color="white"))
        if st_.pattern:
            marker["pattern"] = dict(shape=st_.pattern, fgcolor="rgba(0,0,0,0.45)", size=6)
        else:
            second = _second_chunk_on_device(bars.device[idx], chunk)
            if second.any():
                marker["pattern"] = dict(shape=np.where(second, CHUNK_PATTERN, "").tolist(), fillmode="overlay",
                                         fgcolor="rgba(255,255,255,0.75)", size=6, solidity=0.35)
        name = f"{name_prefix}{module} {kind}"
        traces.append(go.Bar(
            orientation="h", base=start, x=end - start, y=bars.device[idx] + y_offset,
            width=width, name=name, legendgroup=f"{legendgroup_prefix}{module} {kind}",
            showlegend=showlegend, marker=marker, opacity=opacity, customdata=custom,
            hovertemplate=hover, text=text, textposition="inside" if text is not None else None,
            insidetextanchor="middle", textangle=0, textfont=dict(size=10),
        ))
    return traces


def idle_trace(bars: Bars, *, until: float | None = None, y_offset: float = 0.0, width: float = 0.8,
               showlegend: bool = True, name: str = "idle (bubble)") -> go.Bar:
    """Idle gaps; hover data per bar: start, end, duration, device."""
    dev, start, end = bars.gaps(until)
    num = HOVER_NUMBER
    return go.Bar(
        orientation="h", base=start, x=end - start, y=dev + y_offset, width=width, name=name,
        legendgroup="idle", showlegend=showlegend,
        marker=dict(color=IDLE_COLOUR, line=dict(width=0.5, color=IDLE_LINE),
                    pattern=dict(shape="/", fgcolor=IDLE_LINE, size=8, solidity=0.15)),
        customdata=np.column_stack([start, end, end - start, dev]) if len(start) else None,
        hovertemplate=(f"idle on dev %{{customdata[3]}}<br>from %{{customdata[0]:{num}}} to "
                       f"%{{customdata[1]:{num}}} · %{{customdata[2]:{num}}} {bars.unit}<extra></extra>"),
    )


def aggregate_traces(bars: Bars, max_bars: int = MAX_BARS, *, showlegend: bool = True,
                     families: dict[str, str] | None = None) -> list[go.Bar]:
    """Busy time in equal time bins per device: each bin coloured by the
    (module, kind) that kept the device busiest in it, its opacity the busy fraction."""
    devices = max(bars.devices, 1)
    bins = int(min(2000, max(20, max_bars // devices)))
    horizon = bars.makespan or 1.0
    edges = np.linspace(0.0, horizon, bins + 1)
    groups = _groups(bars)
    busy = np.zeros((len(groups), devices, bins))
    for g, (_, _, idx) in enumerate(groups):
        for d in np.unique(bars.device[idx]):
            sel = idx[bars.device[idx] == d]
            order = np.argsort(bars.start[sel])
            s, e = bars.start[sel][order], bars.end[sel][order]
            cum = np.concatenate([[0.0], np.cumsum(e - s)])
            # Busy time before t: whole ops that ended by t, plus the part of the op running at t.
            ended = np.searchsorted(e, edges, side="right")
            running = np.minimum(ended, len(s) - 1)
            partial = np.where((ended < len(s)) & (s[running] < edges), edges - s[running], 0.0)
            before = cum[ended] + partial
            busy[g, d] = np.diff(before)
    total = busy.sum(axis=0)
    width = edges[1] - edges[0]
    dominant = busy.argmax(axis=0)
    families = families or module_families([m for m, _, _ in groups])
    traces = []
    for g, (module, kind, _) in enumerate(groups):
        d_idx, b_idx = np.nonzero((dominant == g) & (total > 0))
        if not len(d_idx):
            continue
        util = np.clip(total[d_idx, b_idx] / width, 0.0, 1.0)
        st_ = style(families[module], kind)
        traces.append(go.Bar(
            orientation="h", base=edges[b_idx], x=np.full(len(b_idx), width), y=d_idx, width=0.8,
            name=f"{module} {kind} (mostly)", showlegend=showlegend,
            marker=dict(color=st_.colour, opacity=np.maximum(util, 0.08), line=dict(width=0)),
            customdata=np.column_stack([edges[b_idx], edges[b_idx] + width, util * 100]),
            hovertemplate=(f"dev %{{y}}, %{{customdata[0]:{HOVER_NUMBER}}}–%{{customdata[1]:{HOVER_NUMBER}}} "
                           f"{bars.unit}<br>"
                           f"busy %{{customdata[2]:.0f}}%, mostly {module} {kind}<extra></extra>"),
        ))
    return traces


def plain_title(text: str) -> str:
    """A chart title as typed: Plotly reads `<a href>`, `<b>` and entities in titles,
    and titles carry user text (terms, workload names)."""
    return html.escape(text, quote=False)


def _layout(fig: go.Figure, devices: int, unit: str, *, height: int | None, title: str | None,
            x_range: tuple[float, float] | None, rows: int = 1) -> None:
    per_row = max(160, min(720, 60 + 28 * devices))
    fig.update_layout(
        barmode="overlay", bargap=0, height=height or min(1400, 100 + per_row * rows),
        margin=dict(l=10, r=10, t=80 if title else 50, b=40),
        title=dict(text=plain_title(title), x=0, xanchor="left", y=0.99, yanchor="top", yref="container")
        if title else None,
        legend=dict(orientation="h", yanchor="bottom", y=1.01, xanchor="left", x=0, font=dict(size=11)),
        uniformtext=dict(minsize=8, mode="hide"), plot_bgcolor="white", hovermode="closest",
    )
    fig.update_xaxes(title_text=f"time ({unit})", showgrid=True, gridcolor="#eeeeee", zeroline=False,
                     range=list(x_range) if x_range else None)


# Communication (`mpipe_core.simulation.comm_timeline`): one trace per group, colours
# apart from the modules' hues; what runs inside an op is a strip along the op's lower
# edge, a pipeline send that does not hold its device one along the upper edge, the
# gradient sync and the optimizer after the pipeline full bars of their own.
COMM_STYLES = {
    "tp": ("#e7298a", "tp collectives (inside the op)"),
    "cp": ("#66a61e", "cp K/V exchange (inside the op)"),
    "pp": ("#e6ab02", "pipeline exchange"),
    "dp": ("#252525", "dp gradient sync (after the pipeline)"),
    "optimizer": ("#a6761d", "optimizer step (after the pipeline)"),
}
COMM_STRIP = 0.22


def _bytes(n: float) -> str:
    for scale, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return f"{human(n / scale, 3)} {name}"
    return f"{human(n, 3)} B"


def comm_hover(c, unit: str) -> str:
    """What a communication slice's hover says: the collective, how many, bytes, link class,
    ranks, seconds and the exposed part, and the op it is part of."""
    ms = lambda seconds: quantity(seconds * 1e3, "ms")  # noqa: E731
    where = f" of {html.escape(str(c.op))}" if c.op is not None else " after the pipeline"
    if c.group == "optimizer":
        what = (f"<b>optimizer step</b> on dev {c.device}{where}<br>"
                f"{_bytes(c.moved_bytes)} of HBM traffic ({c.link})<br>")
    else:
        count = f" ×{c.count}" if c.count > 1 else ""
        each = " each" if c.count > 1 else ""
        what = (f"<b>{html.escape(c.group)} {html.escape(c.collective)}</b>{count} on dev {c.device}{where}<br>"
                f"bytes {_bytes(c.buffer_bytes)}{each} (moved per rank {_bytes(c.moved_bytes)}) · "
                f"link {html.escape(c.link)} · {c.ranks} ranks<br>")
    hidden = " (asynchronous: the device goes on)" if getattr(c, "asynchronous", False) else ""
    return (what + f"{ms(c.seconds)} in all · exposed {ms(c.exposed)}{hidden}<br>"
            f"from {human(c.start, 4)} to {human(c.end, 4)} {unit}")


def comm_traces(comm: Sequence, unit: str, *, showlegend: bool = True) -> list[go.Bar]:
    """One bar trace per communication group (`CommSlice`s), hover text per bar."""
    traces = []
    for group, (colour, label) in COMM_STYLES.items():
        mine = [c for c in comm if c.group == group]
        if not mine:
            continue
        start = np.array([c.start for c in mine], float)
        end = np.array([c.end for c in mine], float)
        inside = np.array([c.op is not None for c in mine], bool)
        detached = np.array([bool(getattr(c, "asynchronous", False)) for c in mine], bool)
        offset = np.where(inside, np.where(detached, -1.0, 1.0) * (0.4 - COMM_STRIP / 2), 0.0)
        traces.append(go.Bar(
            orientation="h", base=start, x=end - start, y=np.array([c.device for c in mine]) + offset,
            width=np.where(inside, COMM_STRIP, 0.8), name=label, legendgroup=f"comm {group}",
            showlegend=showlegend, marker=dict(color=colour, line=dict(width=0.4, color="white")),
            hovertext=[comm_hover(c, unit) for c in mine], hovertemplate="%{hovertext}<extra></extra>"))
    return traces


def gantt_figure(bars: Bars, *, title: str | None = None, x_range: tuple[float, float] | None = None,
                 height: int | None = None, max_bars: int = MAX_BARS, show_idle: bool = True,
                 until: float | None = None, over: Mapping[int, float] | None = None,
                 memory_unit: str = "", comm: Sequence = ()) -> tuple[go.Figure, str | None]:
    """The Gantt chart and, when it had to aggregate, the notice to show with it.
    `over`: device -> how far its peak memory is over the device's capacity
    (those devices' labels are marked, and the legend says so); `comm`: the
    evaluation's communication slices (`Evaluation.comm`), drawn over the ops."""
    fig = go.Figure()
    notice = None
    if len(bars) > max_bars:
        fig.add_traces(aggregate_traces(bars, max_bars))
        notice = (f"{len(bars):,} ops are more than the {max_bars:,} bars drawn one by one: this chart "
                  f"shows busy time in time bins per device (colour: what kept the device busiest "
                  f"in the bin; shade: how busy it was). Metrics below are exact.")
        if comm:
            notice += " Communication is not drawn at this size (the step figures count it)."
    else:
        if show_idle:
            fig.add_trace(idle_trace(bars, until=until))
        fig.add_traces(op_traces(bars))
        if comm and len(bars) + len(comm) > max_bars:
            notice = (f"{len(comm):,} communication slices would make more than {max_bars:,} bars: only "
                      f"the gradient sync and the optimizer after the pipeline are drawn.")
            comm = [c for c in comm if c.op is None]
        fig.add_traces(comm_traces(comm, bars.unit))
        fig.add_traces(hatch_key_traces(hatches_used(bars)))
    fig.add_traces(over_capacity_key(over or {}, memory_unit))
    _layout(fig, bars.devices, bars.unit, height=height, title=title, x_range=x_range)
    _device_axis(fig, bars.devices, over=over or ())
    return fig, notice


STEP_LABELS_MAX = 60  # step boundaries drawn (and labelled) up to this many steps


def add_step_boundaries(fig: go.Figure, bars: Bars, *, first_label: str = "") -> None:
    """A dashed line where each step starts, labelled with its number (a few
    layout shapes, set at once: shapes added one by one take quadratic time)."""
    starts = bars.step_starts()
    if len(starts) > STEP_LABELS_MAX:
        return
    shapes, notes = [], []
    for i, (step, at) in enumerate(starts):
        if i:
            shapes.append(dict(type="line", xref="x", yref="paper", x0=at, x1=at, y0=0, y1=1,
                               line=dict(color="#555555", width=1.2, dash="dash")))
        notes.append(dict(x=at, y=0, xref="x", yref="paper", xanchor="left", yanchor="bottom", showarrow=False,
                          text=f"start of step {step}" + (first_label if i == 0 else ""),
                          font=dict(size=11, color="#222"),
                          bgcolor="rgba(255,255,255,0.85)"))
    fig.update_layout(shapes=list(fig.layout.shapes) + shapes, annotations=list(fig.layout.annotations) + notes)


def stacked_gantts(panels: Sequence[tuple[str, Bars]], *, max_bars: int = MAX_BARS,
                   height: int | None = None, over: Sequence[Mapping[int, float]] | None = None,
                   memory_units: Sequence[str] | None = None) -> tuple[go.Figure, list[str]]:
    """Several timelines one above the other on one shared time axis; `over`
    (per panel, device -> how far over its capacity) marks devices over memory,
    in each panel's own memory unit (`memory_units`, one per panel)."""
    titles = [plain_title(t) for t, _ in panels]
    heights = [max(b.devices, 1) + 1 for _, b in panels]
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=titles,
                        vertical_spacing=min(0.12, 0.3 / max(1, len(panels))), row_heights=heights)
    families = module_families(list(dict.fromkeys(
        m for _, b in panels for m in b.module.tolist())))
    seen: set[str] = set()
    notices = []
    per_panel_bars = max(1000, max_bars // max(1, len(panels)))
    for row, (title, bars) in enumerate(panels, start=1):
        if len(bars) > per_panel_bars:
            traces = aggregate_traces(bars, per_panel_bars, families=families)
            notices.append(f"{title}: {len(bars):,} ops, shown as busy time per time bin")
        else:
            traces = [idle_trace(bars)] + op_traces(
                bars, families=families) + hatch_key_traces(hatches_used(bars))
        marked = over[row - 1] if over else {}
        for tr in traces + over_capacity_key(marked, memory_units[row - 1] if memory_units else ""):
            tr.showlegend = tr.name not in seen
            seen.add(tr.name)
            fig.add_trace(tr, row=row, col=1)
        _device_axis(fig, bars.devices, row=row, over=marked)
    devices = sum(heights)
    unit = panels[0][1].unit if panels else ""
    _layout(fig, devices, unit, height=height, title=None, x_range=None, rows=1)
    fig.update_xaxes(title_text=None)
    fig.update_xaxes(title_text=f"time ({unit})", row=len(panels), col=1)
    fig.update_layout(legend=dict(y=1.02 + 0.04 * len(panels)), margin=dict(t=60))
    return fig, notices


def overlay_figure(measured: Bars, predicted: Bars, *, title: str | None = None,
                   other_label: str = "predicted") -> go.Figure:
    """Measured and another timeline (`other_label`: predicted, or another run)
    on the same device rows: the other in the upper half of each row (faded),
    measured in the lower half."""
    families = module_families(list(dict.fromkeys(measured.module.tolist() + predicted.module.tolist())))
    fig = go.Figure()
    fig.add_traces(op_traces(predicted, name_prefix=f"{other_label} ", y_offset=-0.21, width=0.4,
                             opacity=0.45, labels=False, legendgroup_prefix="p ", families=families))
    fig.add_traces(op_traces(measured, name_prefix="measured ", y_offset=0.21, width=0.4,
                             legendgroup_prefix="m ", families=families))
    used = hatches_used(measured) + [h for h in hatches_used(predicted) if h not in hatches_used(measured)]
    fig.add_traces(hatch_key_traces(used))
    devices = max(measured.devices, predicted.devices)
    _layout(fig, devices, measured.unit, height=None, title=title, x_range=None)
    _device_axis(fig, devices)
    fig.update_layout(height=min(1400, max(300, 130 + 50 * devices)))
    return fig


LEGEND_ABOVE_MAX = 8  # more entries than this: a scrolling legend at the right, not rows above


def _small_layout(title: str, entries: int = 2) -> dict:
    """Title on its own line; a short legend under it, above the plot, a long
    one at the right (it scrolls there instead of squashing the plot)."""
    legend = (dict(orientation="h", y=1.02, yanchor="bottom", x=0, xanchor="left") if entries <= LEGEND_ABOVE_MAX
              else dict(orientation="v", y=1, yanchor="top", x=1.02, xanchor="left", font=dict(size=10)))
    return dict(margin=dict(l=10, r=10, t=75, b=30), plot_bgcolor="white",
                title=dict(text=plain_title(title), x=0, xanchor="left", y=0.98, yanchor="top", yref="container"),
                legend=legend)


def idle_figure(busy: Sequence[float], idle: Sequence[float], unit: str = "units") -> go.Figure:
    num = HOVER_NUMBER
    """Busy and idle time per device, stacked."""
    devices = [f"dev {d}" for d in range(len(busy))]
    fig = go.Figure([
        go.Bar(x=devices, y=list(busy), name="busy", marker_color="#4292c6",
               hovertemplate=f"%{{x}} busy %{{y:{num}}} {unit}<extra></extra>"),
        go.Bar(x=devices, y=list(idle), name="idle", marker=dict(
            color=IDLE_COLOUR, line=dict(width=0.5, color=IDLE_LINE),
            pattern=dict(shape="/", fgcolor=IDLE_LINE, size=8, solidity=0.15)),
            hovertemplate=f"%{{x}} idle %{{y:{num}}} {unit}<extra></extra>"),
    ])
    fig.update_layout(barmode="stack", height=320, **_small_layout("Busy and idle time per device"))
    fig.update_yaxes(title_text=unit, gridcolor="#eeeeee")
    return fig


MEMORY_CURVES_MAX = 16  # up to this many devices, one curve each; above, peaks as bars + one curve
# Curves of devices that fit: no red among them (red marks a device over its memory).
_CURVE_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2",
                  "#ff7f0e", "#393b79", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#31a354", "#756bb1")
_OVER_COLOURS = (OVER_COLOUR, "#a50f15", "#ef3b2c", "#fb6a4a", "#67000d")
STATIC_COLOUR = "#969696"


def memory_peaks(series: Sequence[Sequence[tuple[float, float]]]) -> list[float]:
    """Each device's peak memory (the largest value of its step function)."""
    return [max((v for _, v in s), default=0.0) for s in series]


def over_capacity(peaks: Sequence[float], capacity: float | None) -> dict[int, float]:
    """Device -> how far its peak is over `capacity` (the core's `memory_fit`)."""
    from mpipe_core.simulation.metrics import memory_fit

    fit = memory_fit(list(peaks), capacity)
    return dict(fit.over) if fit is not None else {}


def _capacity_line(x0: float, x1: float, capacity: float, memory_unit: str, *, name: str | None = None,
                   showlegend: bool = True, dash: str = CAPACITY_DASH) -> go.Scatter:
    label = name or f"capacity {quantity(capacity, memory_unit)}"
    return go.Scatter(x=[x0, x1], y=[capacity, capacity], mode="lines", name=label, showlegend=showlegend,
                      legendgroup=label, line=dict(color=OVER_COLOUR, dash=dash, width=2),
                      hovertemplate=f"{html.escape(label)}<extra></extra>")


def memory_figure(series: Sequence[Sequence[tuple[float, float]]], unit: str = "units",
                  memory_unit: str = "", device: int | None = None, *, static: Sequence[float] | None = None,
                  capacity: float | None = None) -> go.Figure:
    """Memory over time (static + activations: `series` start at each device's
    `static` memory): one step function per device, each device's static level
    dotted, and the device's `capacity` as a line, devices over it in red with
    how far over in their name.  Above `MEMORY_CURVES_MAX` devices (where curves
    would make a band) the peak of every device as stacked bars (static,
    activations), and the curve of `device` (default: the highest peak)."""
    static = list(static) if static is not None else [0.0] * len(series)
    if len(series) > MEMORY_CURVES_MAX:
        return _memory_peaks_figure(series, unit, memory_unit, device, static, capacity)
    num = HOVER_NUMBER
    mem = f" {memory_unit}" if memory_unit else ""
    over = over_capacity(memory_peaks(series), capacity)
    points = sum(len(s) for s in series)
    scatter = go.Scattergl if points > 20_000 else go.Scatter
    fig = go.Figure()
    end = max((s[-1][0] for s in series if len(s)), default=1.0)
    fitting, reds = iter(_CURVE_COLOURS * (1 + len(series) // len(_CURVE_COLOURS))), 0
    for d, s in enumerate(series):
        arr = np.asarray(s, dtype=float).reshape(-1, 2)
        note = ""
        if d in over:
            colour, reds = _OVER_COLOURS[reds % len(_OVER_COLOURS)], reds + 1
            name = f"dev {d} {OVER_MARK} +{quantity(over[d], memory_unit)}"
            note = (f"<br><b>{OVER_MARK} its peak is over the {quantity(capacity, memory_unit)} capacity by "
                    f"{quantity(over[d], memory_unit)}</b>")
        else:
            colour, name = next(fitting), f"dev {d}"
        parts = (f" (static {human(static[d])} + activations %{{customdata:{num}}})" if static[d] else "")
        fig.add_trace(scatter(x=arr[:, 0], y=arr[:, 1], mode="lines", line_shape="hv", name=name,
                              legendgroup=f"dev {d}", customdata=arr[:, 1] - static[d] if static[d] else None,
                              line=dict(color=colour, width=2.5 if d in over else 1.5),
                              hovertemplate=(f"dev {d}: %{{y:{num}}}{mem}{parts} at t=%{{x:{num}}} {unit}{note}"
                                             f"<extra></extra>")))
    entries = len(series)
    if any(static):
        fig.add_trace(_static_levels(static, end, memory_unit))
        entries += 1
    if capacity is not None:
        fig.add_trace(_capacity_line(0.0, end, capacity, memory_unit))
        entries += 1
    fig.update_layout(height=360, **_small_layout("Memory over time (static + activations)", entries))
    fig.update_xaxes(title_text=f"time ({unit})", gridcolor="#eeeeee")
    fig.update_yaxes(title_text=f"memory ({memory_unit})" if memory_unit else "memory", gridcolor="#eeeeee",
                     rangemode="tozero")
    return fig


def _static_levels(static: Sequence[float], end: float, memory_unit: str, devices: Sequence[int] | None = None,
                   showlegend: bool = True) -> go.Scatter:
    """Each device's static memory as a dotted level (one trace: segments apart)."""
    devices = list(range(len(static))) if devices is None else list(devices)
    x, y, who = [], [], []
    for d in devices:
        x += [0.0, end, None]
        y += [static[d], static[d], None]
        who += [d, d, d]
    mem = f" {memory_unit}" if memory_unit else ""
    return go.Scatter(x=x, y=y, customdata=who, mode="lines", name="static (dotted)",
                      showlegend=showlegend, line=dict(color=STATIC_COLOUR, dash="dot", width=1.5),
                      hovertemplate=f"dev %{{customdata}} static memory %{{y:{HOVER_NUMBER}}}{mem}<extra></extra>")


def _memory_peaks_figure(series, unit: str, memory_unit: str, device: int | None, static: list[float],
                         capacity: float | None) -> go.Figure:
    num = HOVER_NUMBER
    mem = f" {memory_unit}" if memory_unit else ""
    peaks = memory_peaks(series)
    over = over_capacity(peaks, capacity)
    n = len(series)
    picked = int(np.argmax(peaks)) if device is None or not 0 <= device < n else device
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.22, subplot_titles=(
        plain_title(f"Peak memory of each of {n} devices" + (" (static + activations)" if any(static) else "")),
        plain_title(f"dev {picked} over time")))
    if any(static):
        fig.add_trace(go.Bar(x=list(range(n)), y=static, marker_color=STATIC_COLOUR, name="static memory",
                             hovertemplate=f"dev %{{x}}: static %{{y:{num}}}{mem}<extra></extra>"), row=1, col=1)
    activations = [max(0.0, p - s) for p, s in zip(peaks, static)]
    for name, mine, colour, dark in (("activations (peak)", [d for d in range(n) if d not in over], "#9ecae1",
                                      "#08519c"),
                                     (f"activations, {OVER_MARK} over the device's memory",
                                      sorted(over), OVER_COLOUR, "#67000d")):
        if not mine:
            continue
        note = [f"<br><b>{OVER_MARK} over the {quantity(capacity, memory_unit)} capacity by "
                f"{quantity(over[d], memory_unit)}</b>" if d in over else "" for d in mine]
        parts = [f" = static {human(static[d])} + activations {human(activations[d])}" if static[d] else ""
                 for d in mine]
        fig.add_trace(go.Bar(
            x=mine, y=[activations[d] for d in mine], name=name,
            marker_color=[dark if d == picked else colour for d in mine],
            customdata=np.array([[human(peaks[d]), parts[i], note[i]] for i, d in enumerate(mine)], dtype=object),
            hovertemplate=f"dev %{{x}}: peak %{{customdata[0]}}{mem}%{{customdata[1]}}%{{customdata[2]}}"
                          f"<extra></extra>"), row=1, col=1)
    if capacity is not None:
        fig.add_trace(_capacity_line(-0.5, n - 0.5, capacity, memory_unit), row=1, col=1)
    arr = np.asarray(series[picked], dtype=float).reshape(-1, 2)
    scatter = go.Scattergl if len(arr) > 20_000 else go.Scatter
    colour = OVER_COLOUR if picked in over else "#08519c"
    fig.add_trace(scatter(x=arr[:, 0], y=arr[:, 1], mode="lines", line_shape="hv", name=f"dev {picked}",
                          line=dict(color=colour), showlegend=False,
                          hovertemplate=f"dev {picked}: %{{y:{num}}}{mem} at t=%{{x:{num}}} {unit}<extra></extra>"),
                  row=2, col=1)
    end = float(arr[-1, 0]) if len(arr) else 1.0
    if static[picked]:
        fig.add_trace(_static_levels(static, end, memory_unit, [picked], showlegend=False), row=2, col=1)
    if capacity is not None:
        fig.add_trace(_capacity_line(0.0, end, capacity, memory_unit, showlegend=False), row=2, col=1)
    legend = any(static) or capacity is not None
    fig.update_layout(height=520 if legend else 460, showlegend=legend, barmode="stack",
                      **_small_layout("Memory over time (static + activations)"))
    if legend:  # two rows of legend between the title and the first panel's own title
        fig.update_layout(margin=dict(t=125), legend=dict(y=1.12))
    axis = f"memory ({memory_unit})" if memory_unit else "memory"
    fig.update_xaxes(tickprefix="dev ", gridcolor="#eeeeee", row=1, col=1)
    fig.update_xaxes(title_text=f"time ({unit})", gridcolor="#eeeeee", row=2, col=1)
    fig.update_yaxes(title_text=axis, gridcolor="#eeeeee", row=1, col=1)
    fig.update_yaxes(title_text=axis, gridcolor="#eeeeee", rangemode="tozero", row=2, col=1)
    return fig


# Each of tune's baselines on the chart: (symbol, colour).
BASELINE_MARKERS = {"fused": ("x", "#d94801"), "balanced": ("diamond", "#6a51a3"),
                    "colocated": ("square", "#238b45"), "disaggregated": ("triangle-up", "#8c510a"),
                    "transpose": ("star", "#e7298a")}


def pareto_figure(result, unit: str = "", memory_unit: str = "") -> go.Figure:
    """Tune's candidates: makespan against peak memory (static + activations),
    the front of those that fit joined by a line, every baseline marked, the
    memory cap and the device's memory as lines, and
    candidates over either in red (hover: by how much)."""
    num = HOVER_NUMBER
    mem = f" {memory_unit}" if memory_unit else ""
    cap, capacity = result.memory_cap, result.capacity

    def note(c) -> str:
        """What the hover adds for a point over the cap or the device's memory."""
        if result.over_cap_by(c) > 0:
            return f"<br><b>{OVER_MARK} over the memory cap by {quantity(result.over_cap_by(c), memory_unit)}</b>"
        if c.fits is False and capacity is not None:
            return (f"<br><b>{OVER_MARK} over the device's memory by "
                    f"{quantity(c.peak_memory - capacity, memory_unit)}</b>")
        return ""

    hover = (f"%{{text}}<br>makespan %{{x:{num}}} {unit}<br>peak memory %{{y:{num}}}{mem} "
             f"(static up to %{{customdata[1]:{num}}}{mem})%{{customdata[0]}}<extra></extra>")

    def points(cands, **kw) -> go.Scatter:
        return go.Scatter(x=[c.makespan for c in cands], y=[c.peak_memory for c in cands],
                          text=[plain_title(c.term) for c in cands],
                          customdata=np.array([[note(c), c.static_memory] for c in cands], dtype=object)
                          if cands else None, hovertemplate=hover, **kw)

    fitting = [c for c in result.candidates if c.fits is not False]
    over_device = [c for c in result.candidates if c.fits is False]  # within the cap, over the device
    front_terms = result.fitting_front
    on_front = sorted((c for c in fitting if c.term in front_terms), key=lambda c: c.makespan)
    fig = go.Figure([
        points(fitting, mode="markers", name="candidates", marker=dict(color="#9ecae1", size=8)),
        points(on_front, mode="lines+markers", name="Pareto front" + (" (of those that fit)" if over_device else ""),
               line_shape="hv", marker=dict(color="#08519c", size=10)),
    ])
    if over_device:
        fig.add_trace(points(over_device, mode="markers", name=f"{OVER_MARK} over the device's memory",
                             marker=dict(color=OVER_COLOUR, size=9, symbol="circle-open", line=dict(width=2))))
    if result.over_cap:
        fig.add_trace(points(result.over_cap, mode="markers", name=f"{OVER_MARK} over the memory cap (left out)",
                             marker=dict(color=OVER_COLOUR, size=9, symbol="x")))
    baselines = {name: c for name, c in result.baselines().items() if c is not None}
    for name, c in baselines.items():
        symbol, colour = BASELINE_MARKERS[name]
        fig.add_trace(points([c], mode="markers", name=f"{BASELINE_NAMES[name]} baseline",
                             marker=dict(symbol=symbol, size=14, color=colour)))
    everything = result.candidates + result.over_cap + list(baselines.values())
    lo, hi = min(c.makespan for c in everything), max(c.makespan for c in everything)
    pad = 0.03 * (hi - lo or hi or 1.0)
    lines = 0
    if cap is not None:
        same = capacity is not None and abs(cap - capacity) <= 1e-12 * max(1.0, abs(capacity))
        fig.add_trace(_capacity_line(lo - pad, hi + pad, cap, memory_unit, name=(
            f"memory cap {quantity(cap, memory_unit)}" + (" (the device's memory)" if same else ""))))
        lines += 1
    if capacity is not None and (cap is None or abs(cap - capacity) > 1e-12 * max(1.0, abs(capacity))):
        fig.add_trace(_capacity_line(lo - pad, hi + pad, capacity, memory_unit, dash="dot",
                                     name=f"device memory {quantity(capacity, memory_unit)}"))
        lines += 1
    entries = 2 + len(baselines) + bool(over_device) + bool(result.over_cap) + lines
    fig.update_layout(height=440, **_small_layout("Makespan against peak memory", entries))
    if entries > 5:  # the legend takes two rows under the title
        fig.update_layout(margin=dict(t=100))
    fig.update_xaxes(title_text=f"makespan ({unit or 'units'})", gridcolor="#eeeeee")
    fig.update_yaxes(title_text=f"peak memory ({memory_unit}): static + activations" if memory_unit else
                     "peak memory: static + activations", gridcolor="#eeeeee")
    return fig
