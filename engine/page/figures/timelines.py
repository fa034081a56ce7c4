"""The engines' timelines: a lane per slot, a bar per request, wave barriers and a step cursor."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from engine.page.figures.style import (
    TEXT_COLOR,
    TITLE_LINE_PX,
    PageFigure,
    bottom_legend,
    counted,
    request_color,
    request_pattern,
    style_figure,
)
from engine.trace import SlotRun, Trace

IDLE_COLOR = "rgba(128,128,128,0.45)"  # timeline: a static row computed after its request finished
PROMPT_HOVER_CHARS = 60
# A barrier label's width as a share of the x range: "barrier" at the 12 px annotation font is
# 38 px, about a sixth of a phone's timeline (230 px wide). Labels are kept this far apart.
BARRIER_LABEL_SHARE = 0.2
# A barrier label's look: black on a near-opaque white box reads on the light and the dark theme
# alike, over the grey hatching of idle rows too (grey text on it did not, on the dark theme).
BARRIER_LABEL = {"annotation_font_color": "#000000", "annotation_bgcolor": "rgba(255,255,255,0.85)"}


def x_extent(trace: Trace, x_axis: str = "time") -> float:
    """Right end of a trace on the x axis: last step's end (s) or number of steps."""
    if not trace.steps:
        return 0.0
    return trace.steps[-1].end_s if x_axis == "time" else float(len(trace.steps))


def _shared_axis_line(end: float, x_max: float | None, x_axis: str) -> str:
    """E.g. "... · this run ends at 12.00 s" on a shared x axis; "" otherwise."""
    if x_max is None:
        return ""
    own = f"ends at {end:.2f} s" if x_axis == "time" else f"takes {counted(round(end), 'step')}"
    return f"x axis shared with the other timelines · this run {own}"


def _span(trace: Trace, run: SlotRun, x_axis: str) -> tuple[float, float]:
    if x_axis == "time":
        return trace.steps[run.first].start_s, trace.steps[run.last].end_s
    return float(run.first), float(run.last + 1)


def _request_hover(trace: Trace, run: SlotRun) -> str:
    """Hover text of one request bar (HTML-escaped: prompts are user text)."""
    r = trace.request(run.request_id)
    prompt = (
        r.prompt if len(r.prompt) <= PROMPT_HOVER_CHARS else r.prompt[:PROMPT_HOVER_CHARS] + "…"
    )
    ttft = "—" if r.ttft_s is None else f"{r.ttft_s:.2f} s"
    times = f"{trace.steps[run.first].start_s:.2f}–{trace.steps[run.last].end_s:.2f} s"
    cached = ""
    if r.num_cached_tokens:  # the prefix cache's share, on (first) admission
        cached = f"<br>{counted(r.num_cached_tokens, 'prompt token')} from the prefix cache"
    return (
        f"<b>R{r.request_id}</b> · slot {run.slot}<br>{html.escape(prompt)}<br>"
        f"cap {r.max_new_tokens} · generated "
        f"{counted(len(r.output_token_ids), 'token')}{cached}<br>"
        f"steps {run.first}–{run.last} · {times} · TTFT {ttft}"
    )


def _bar(runs: list[SlotRun], trace: Trace, x_axis: str, **style) -> go.Bar:
    spans = [_span(trace, run, x_axis) for run in runs]
    return go.Bar(
        orientation="h",
        y=[f"slot {run.slot}" for run in runs],
        base=[a for a, _ in spans],
        x=[b - a for a, b in spans],
        hovertemplate="%{hovertext}<extra></extra>",
        marker_line_width=0,
        **style,
    )


def timeline_figure(
    trace: Trace, x_axis: str = "time", x_max: float | None = None, cursor: int | None = None
) -> go.Figure:
    """Slot lanes, a bar per request; idle rows hatched, wave barriers dashed. ``x_axis``: "time"
    (s) or "step"; ``x_max`` fixes the range; ``cursor``: a step's line."""
    runs = trace.slot_runs()
    fig = PageFigure()
    for rid in sorted({r.request_id for r in runs if not r.idle}):
        mine = [r for r in runs if r.request_id == rid and not r.idle]
        hover = [_request_hover(trace, r) for r in mine]
        fig.add_trace(
            _bar(
                mine,
                trace,
                x_axis,
                name=f"R{rid}",
                text=[f"R{rid}"] * len(mine),
                marker={"color": request_color(rid), "pattern": request_pattern(rid)},
                hovertext=hover,
                showlegend=False,
                textposition="inside",
                insidetextanchor="middle",
            )
        )
    idle = [r for r in runs if r.idle]
    if idle:
        hover = [
            f"slot {r.slot} idle: R{r.request_id} finished, row still computed (padding)"
            for r in idle
        ]
        fig.add_trace(
            _bar(
                idle,
                trace,
                x_axis,
                name="idle row (padding)",
                hovertext=hover,
                marker={"color": IDLE_COLOR, "pattern": {"shape": "/", "fgcolor": TEXT_COLOR}},
            )
        )
    _add_barriers(fig, trace, x_axis, x_max if x_max is not None else x_extent(trace, x_axis))
    if cursor is not None and trace.steps:
        fig.add_vline(x=_cursor_x(trace, cursor, x_axis), name="cursor", line_color=TEXT_COLOR)
    shared = _shared_axis_line(x_extent(trace, x_axis), x_max, x_axis)
    title = f"{trace.engine.capitalize()} batching — {counted(trace.num_slots, 'slot')}"
    style_figure(fig, title, shared or None)
    lanes = [f"slot {i}" for i in range(trace.num_slots)]
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=lanes)
    fig.update_yaxes(autorange="reversed")
    x_title = "seconds since start" if x_axis == "time" else "step (one forward pass each)"
    fig.update_xaxes(title_text=x_title, range=None if x_max is None else [0, x_max])
    subtitle_px = TITLE_LINE_PX if shared else 0  # the plot keeps its height
    fig.update_layout(barmode="overlay", height=190 + 45 * trace.num_slots + subtitle_px)
    return bottom_legend(fig, 90)


def _add_barriers(fig: go.Figure, trace: Trace, x_axis: str, x_span: float) -> None:
    """A dashed line where a static wave ends and the next waits for it (not at the run's end)."""
    ends = [
        step.end_s if x_axis == "time" else pos + 1
        for pos, step in enumerate(trace.steps[:-1])
        if step.wave is not None and trace.steps[pos + 1].wave != step.wave
    ]
    for x, side in zip(ends, _barrier_label_sides(ends, x_span), strict=True):
        label = {"annotation_text": "barrier", "annotation_position": f"top {side}"} if side else {}
        label |= BARRIER_LABEL if side else {}
        fig.add_vline(x=x, name="barrier", line_dash="dash", line_color=TEXT_COLOR, **label)


def _barrier_label_sides(xs: list[float], x_span: float) -> list[str | None]:
    """Each barrier's label side (``"left"``, ``"right"`` or None), so labels never touch."""
    width, taken, sides = BARRIER_LABEL_SHARE * x_span, 0.0, []  # taken: the last label's end
    for x in xs:
        if x - width >= taken:
            side, taken = "left", x
        elif x >= taken and x + width <= x_span:
            side, taken = "right", x + width
        else:
            side = None
        sides.append(side)
    return sides


def _cursor_x(trace: Trace, cursor: int, x_axis: str) -> float:
    if cursor >= len(trace.steps):
        return x_extent(trace, x_axis)
    return trace.steps[cursor].start_s if x_axis == "time" else float(cursor)
