"""Server figures: each server's requests as lanes, and what its ``/metrics`` said over the run.

A server hides its slots, so its timeline has one lane per request, from the client's records::

    R0 |░░░▓▓▓▓▓▓▓▓▓▓▓|           ░ sent, waiting for the first token
    R1 |  ░░░░░▓▓▓▓▓▓▓▓▓▓▓▓|      ▓ decoding: first token to last
    R2 |        ░░░░░░░░░▓▓▓▓|

Both are the view from outside; its own record is ``engine.page.views.inside_view``'s.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.page.figures.kv_pools import kv_pool_size, kv_pool_whole
from engine.page.figures.style import (
    TEXT_COLOR,
    TITLE_LINE_PX,
    PageFigure,
    bottom_legend,
    counted,
    engine_styles,
    message_figure,
    request_color,
    style_figure,
)
from engine.trace import Trace

WAITING_OPACITY = 0.35  # a request's colour, pale: sent, no token yet
LANE_PX = 24
OUTSIDE = "View from outside"  # the first words of both figures' subtitles
SERVERS_BOX = "Also run on the host's servers"  # the servers' checkboxes' label (server_panels)
NO_SERVER = f"No server ran in this run: tick one under “{SERVERS_BOX}” and press Run."


# --- request lanes -------------------------------------------------------------------------------


def server_timeline_figure(servers: dict[str, Trace], x_max: float | None = None) -> go.Figure:
    """One panel per server, a lane per request; ``x_max`` (s): the other timelines' scale."""
    if not servers:
        return message_figure("Servers: one lane per request", NO_SERVER)
    names = list(servers)
    titles = [f"{n} — {_requests_line(t)}" for n, t in servers.items()]
    heights = [max(len(t.requests), 1) for t in servers.values()]
    fig = make_subplots(
        rows=len(names),
        cols=1,
        shared_xaxes=True,
        subplot_titles=titles,
        row_heights=heights,
        vertical_spacing=min(0.12, 0.3 / len(names)),
    )
    fig = PageFigure(fig)
    for row, name in enumerate(names, start=1):
        for bar in _lane_bars(servers[name], show_legend=row == 1):
            fig.add_trace(bar, row=row, col=1)
        lanes = [f"R{r.request_id}" for r in servers[name].requests]
        fig.update_yaxes(type="category", categoryarray=lanes, autorange="reversed", row=row, col=1)
    fig.update_xaxes(range=None if x_max is None else [0, x_max])
    fig.update_xaxes(title_text="seconds since start", row=len(names), col=1)
    fig.update_annotations(font_size=12)
    subtitle = f"{OUTSIDE}: a server hides its slots; one lane per request, the client's clock"
    height_px = 170 + 60 * len(names) + LANE_PX * sum(heights)
    if x_max is not None:  # in seconds even when our timelines are drawn by step index
        end_s = max(t.wall_s for t in servers.values())
        subtitle += (
            "<br>x axis in seconds, on our timelines' time scale, so lengths compare · "
            f"the servers end by {end_s:.2f} s"
        )
        height_px += TITLE_LINE_PX  # the plot keeps its height
    style_figure(fig, "Servers: one lane per request", subtitle)
    fig.update_layout(barmode="overlay", height=height_px)
    return bottom_legend(fig, 90)


def _requests_line(trace: Trace) -> str:
    done = sum(r.finish_s is not None for r in trace.requests)
    return f"{done}/{len(trace.requests)} requests done · {trace.wall_s:.2f} s"


def _lane_bars(trace: Trace, show_legend: bool) -> list[go.Bar]:
    waiting, decoding = [], []
    for r in trace.requests:
        if r.admit_s is None:
            continue
        last_s = r.finish_s or (r.token_times_s[-1] if r.token_times_s else None)
        first_s = r.first_token_s if r.first_token_s is not None else last_s
        waiting.append((r, r.admit_s, first_s if first_s is not None else r.admit_s))
        if r.first_token_s is not None and last_s is not None:
            decoding.append((r, r.first_token_s, last_s))
    kinds = (
        ("waiting for the first token", waiting, WAITING_OPACITY),
        ("decoding", decoding, 1.0),
    )
    return [
        go.Bar(
            orientation="h",
            y=[f"R{r.request_id}" for r, _, _ in spans],
            base=[a for _, a, _ in spans],
            x=[max(b - a, 0.0) for _, a, b in spans],
            marker={"color": [request_color(r.request_id) for r, _, _ in spans], "line_width": 0},
            opacity=opacity,
            name=kind,
            legendgroup=kind,
            showlegend=show_legend,
            hovertext=[_lane_hover(trace, r) for r, _, _ in spans],
            hovertemplate="%{hovertext}<extra></extra>",
        )
        for kind, spans, opacity in kinds
    ]


def _lane_hover(trace: Trace, r) -> str:
    ttft = "—" if r.ttft_s is None else f"{r.ttft_s:.2f} s"
    last = "—" if r.finish_s is None else f"{r.finish_s:.2f} s"
    return (
        f"<b>{html.escape(trace.engine)} · R{r.request_id}</b><br>sent {r.admit_s:.2f} s · "
        f"TTFT {ttft} · last token {last}<br>"
        f"{counted(len(r.token_times_s), 'token')} streamed · cap {r.max_new_tokens}"
    )


# --- the servers' own gauges ---------------------------------------------------------------------


def server_chart_figure(servers: dict[str, Trace], ours: Trace | None = None) -> go.Figure:
    """Running and waiting requests and KV use over time per server, beside ``ours`` per step."""
    title = "Servers' /metrics: requests and KV use"  # whole on a phone (its 324-px chart)
    sampled = {n: t for n, t in servers.items() if t.server_samples}
    notes = [f"{n}: {_metrics_note(t)}" for n, t in servers.items() if n not in sampled]
    if not sampled:
        text = " · ".join(notes) if notes else NO_SERVER
        return message_figure(title, text)
    fig = PageFigure(make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12))
    styles = engine_styles(list(sampled))
    for name, trace in sampled.items():
        _add_gauges(fig, name, trace, styles[name])
    if ours is not None and ours.steps:
        _add_ours(fig, ours)
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="KV use, % of its own pool", range=[0, 105], row=2, col=1)
    fig.update_xaxes(title_text="seconds since start", row=2, col=1)
    subtitle = (
        f"{OUTSIDE}: running and waiting requests (top), KV cache use (bottom), from /metrics"
    )
    subtitle += f"<br>{html.escape(_pools_line(sampled, ours), quote=False)}"
    subtitle += f"<br>{html.escape(' · '.join(notes))}" if notes else ""
    style_figure(fig, title, subtitle)
    return bottom_legend(fig.update_layout(height=520), 110)


def _pools_line(servers: dict[str, Trace], ours: Trace | None) -> str:
    """The subtitle's line on KV use: 100 % is each engine's own pool, and how big each is."""
    traces = dict(servers)
    if ours is not None and ours.info.get("kv_blocks"):
        traces[f"{ours.engine} (ours)"] = ours
    sizes = [f"{n}: {kv_pool_size(t) or 'size not published'}" for n, t in traces.items()]
    return "KV use %: each of its own pool, whose 100 % differs · " + " · ".join(sizes)


def _metrics_note(trace: Trace) -> str:
    note = (trace.info.get("server") or {}).get("metrics_note")
    return note or "no /metrics samples"


def _add_gauges(fig: go.Figure, name: str, trace: Trace, style: tuple[str, str]) -> None:
    color, dash = style
    series = (
        ("num_requests_running", "running", 1, "solid"),
        ("num_requests_waiting", "waiting", 1, "dot"),
        ("kv_cache_usage_pct", "KV use %", 2, dash),
    )
    for key, label, row, line_dash in series:
        points = [(s.t_s, s.values[key]) for s in trace.server_samples if key in s.values]
        if not points:
            continue
        whole = kv_pool_whole(trace) if row == 2 else None
        fig.add_trace(_line(points, f"{name}: {label}", color, line_dash, whole), row=row, col=1)


def _add_ours(fig: go.Figure, trace: Trace) -> None:
    """Our continuous engine per step: running, waiting, and paged blocks in use."""
    running, waiting, kv = [], [], []
    total = trace.info.get("kv_blocks")
    for step in trace.steps:
        seated = {s.request_id for s in step.seqs}
        arrived = [r for r in trace.requests if r.arrival_s <= step.start_s]
        queued = [
            r
            for r in arrived
            if r.request_id not in seated and (r.finish_s is None or r.finish_s > step.start_s)
        ]
        running.append((step.start_s, len(seated)))
        waiting.append((step.start_s, len(queued)))
        if total and step.kv_blocks_used is not None:
            kv.append((step.start_s, 100.0 * step.kv_blocks_used / total))
    name = trace.engine
    fig.add_trace(_line(running, f"{name} (ours): running", TEXT_COLOR, "solid"), row=1, col=1)
    fig.add_trace(_line(waiting, f"{name} (ours): waiting", TEXT_COLOR, "dot"), row=1, col=1)
    if kv:
        label, whole = f"{name} (ours): KV blocks %", kv_pool_whole(trace)
        fig.add_trace(_line(kv, label, TEXT_COLOR, "dash", whole), row=2, col=1)


def _line(
    points: list[tuple[float, float]], name: str, color: str, dash: str, whole: str | None = None
) -> go.Scatter:
    """A gauge over time; ``whole``: what 100 % is, said on hover."""
    whole = f"<br>{html.escape(whole, quote=False)}" if whole else ""
    return go.Scatter(
        x=[t for t, _ in points],
        y=[v for _, v in points],
        mode="lines",
        name=name,
        line={"color": color, "dash": dash, "shape": "hv"},
        hovertemplate=f"{html.escape(name)}: %{{y:.3g}} at %{{x:.2f}} s{whole}<extra></extra>",
    )
