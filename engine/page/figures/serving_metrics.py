"""Serving figures: latency CDFs, per-step token budget and KV block use, and the queue-wait and
preemption marks laid over a timeline."""

from __future__ import annotations

import bisect

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.page.figures import block_map
from engine.page.figures.kv_pools import kv_pool_size
from engine.page.figures.style import (
    PALETTE,
    TEXT_COLOR,
    bottom_legend,
    engine_styles,
    request_ids,
    style_figure,
)
from engine.trace import PREFILL, StepRecord, Trace

CDF_METRICS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("latency_s", "end-to-end"))
QUEUE_ROW = "queue"  # the timeline's row of queue waits, above the lanes: no lane itself
QUEUE_COLOR = "rgba(128,128,128,0.35)"
QUEUE_BAR_WIDTH = 0.4  # of its row: half a lane's request bar (plotly's default, 0.8)
MIN_QUEUE_S = 1e-3  # shorter waits (the engine loop's own start-up) are not drawn
# Per-step chart: a prefill bar's outline, so the few steps with a prefill stay in sight where a
# step is under a pixel wide (300 steps on a phone); decode bars, side by side, need none.
PREFILL_OUTLINE_PX = 2


# --- latency CDFs ---------------------------------------------------------------------------------


def latency_cdf_figure(traces: list[Trace]) -> go.Figure:
    """TTFT, TPOT and end-to-end latency CDFs, one panel each, one line per engine."""
    titles = [title for _, title in CDF_METRICS]
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, subplot_titles=titles)
    styles = engine_styles([t.engine for t in traces])
    for col, (metric, _) in enumerate(CDF_METRICS, start=1):
        for trace in traces:
            line = _cdf_line(trace, metric, col == 1, styles[trace.engine])
            fig.add_trace(line, row=1, col=col)
        fig.update_xaxes(title_text="seconds", rangemode="tozero", row=1, col=col)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.04])
    fig.update_yaxes(title_text="share of requests", col=1)
    fig.update_annotations(font_size=12)  # the panel titles: short, so they fit a phone's third
    style_figure(
        fig, "Latency distributions", "Left and steep is better: most requests served fast."
    )
    fig.update_layout(height=380, margin={"l": 60, "t": 100})
    return bottom_legend(fig, 90)


def _cdf_line(trace: Trace, metric: str, show_legend: bool, style: tuple) -> go.Scatter:
    points = sorted((v, r.request_id) for r in trace.requests if (v := getattr(r, metric)))
    n = len(points)
    color, dash = style
    return go.Scatter(
        x=[v for v, _ in points],
        y=[(i + 1) / n for i in range(n)],
        mode="lines+markers",
        line={"shape": "hv", "color": color, "dash": dash},
        marker={"size": 5, "color": color},
        name=trace.engine,
        legendgroup=trace.engine,
        showlegend=show_legend,
        customdata=[f"R{rid}" for _, rid in points],
        hovertemplate=f"{trace.engine} · %{{customdata}}: %{{x:.3f}} s · %{{y:.0%}} of requests"
        "<extra></extra>",
    )


# --- token budget and KV blocks per step ----------------------------------------------------------


OFF_SCALE = 4  # a token budget over this many times the busiest step's tokens is not drawn


def step_usage_figure(trace: Trace) -> go.Figure:
    """Per step: prefill and decode tokens against the budget; KV blocks (or tokens) in use."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12)
    steps = list(range(len(trace.steps)))
    for kind, color in ((PREFILL, PALETTE[4]), ("decode", PALETTE[1])):
        outline = {"width": PREFILL_OUTLINE_PX if kind == PREFILL else 0, "color": color}
        fig.add_trace(
            go.Bar(
                x=steps,
                y=[_num_tokens(step, kind) for step in trace.steps],
                name=f"{kind} tokens",
                marker={"color": color, "line": outline},
                hovertemplate=f"step %{{x}}: %{{y}} {kind} tokens<extra></extra>",
            ),
            row=1,
            col=1,
        )
    budget = trace.info.get("token_budget")
    peak = max((step.num_scheduled_tokens for step in trace.steps), default=0)
    if budget and budget <= OFF_SCALE * max(peak, 1):
        fig.add_hline(y=budget, line_dash="dash", line_color=TEXT_COLOR, row=1, col=1)
        fig.add_annotation(**_line_label(budget, f"token budget {budget}"), row=1, col=1)
    elif budget:  # drawn, the line would flatten the steps' bars into the axis
        label = _line_label(peak, f"token budget {budget}: off this scale")
        fig.add_annotation(**label, row=1, col=1)
    _add_kv_use(fig, trace, steps)
    fig.update_layout(barmode="stack", bargap=0, height=460)  # steps side by side
    fig.update_yaxes(title_text="tokens / step", row=1, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    return bottom_legend(style_figure(fig, "Token budget and KV cache per step"), 100)


def _num_tokens(step: StepRecord, kind: str) -> int | None:
    """A step's new tokens of ``kind``; None (no bar, no outline) for a step with no prefill."""
    num_tokens = sum(s.num_new_tokens for s in step.seqs if s.kind == kind)
    return None if kind == PREFILL and not num_tokens else num_tokens


def _add_kv_use(fig: go.Figure, trace: Trace, steps: list[int]) -> None:
    """The paged pool's blocks in use against its 100 % (reserved left out), or cached tokens."""
    total = trace.info.get("kv_blocks")
    if total:
        total -= block_map.num_reserved_blocks(trace.info)
        used = [st.kv_blocks_used for st in trace.steps]
        name, unit = "KV blocks in use", "blocks"
        share = [100.0 * (u or 0) / total for u in used]
        hover = f"step %{{x}}: %{{y}} of {total} blocks, %{{customdata:.0f}} % of the pool"
    else:
        used = [st.num_cached_tokens + st.num_scheduled_tokens for st in trace.steps]
        name, unit, share = "KV tokens in use", "tokens", None
        hover = f"step %{{x}}: %{{y}} {unit}"
    fig.add_trace(
        go.Scatter(
            x=steps,
            y=used,
            name=name,
            mode="lines",
            fill="tozeroy",
            line={"color": PALETTE[2], "shape": "hv"},
            customdata=share,
            hovertemplate=f"{hover}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    if total:
        fig.add_hline(y=total, line_dash="dash", line_color=TEXT_COLOR, row=2, col=1)
        # Two lines: on one, the label ran past the plot's left edge on a phone (390 px wide).
        label = f"the whole pool, 100 %:<br>{kv_pool_size(trace)}"
        fig.add_annotation(**_line_label(total, label), row=2, col=1)
    preempt = [(i, used[i]) for i, st in enumerate(trace.steps) if st.preempted]
    if preempt:
        fig.add_trace(
            go.Scatter(
                x=[i for i, _ in preempt],
                y=[u for _, u in preempt],
                mode="markers",
                name="preemption",
                marker={"symbol": "x", "size": 10, "color": PALETTE[5]},
                customdata=[request_ids(trace.steps[i].preempted) for i, _ in preempt],
                hovertemplate="step %{x}: preempted %{customdata}<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_yaxes(title_text=unit, rangemode="tozero", row=2, col=1)


def _line_label(y: float, text: str) -> dict:
    return {
        "x": 1,
        "xref": "x domain",
        "y": y,
        "text": text,
        "showarrow": False,
        "xanchor": "right",
        "yanchor": "bottom",
        "align": "right",  # a label of two lines ends both at the plot's right edge
    }


# --- queue waits and preemptions on a timeline ----------------------------------------------------


def add_serving_marks(fig: go.Figure, trace: Trace, x_axis: str = "time") -> go.Figure:
    """Queue waits (on a ``queue`` row above the lanes) and preemptions (crosses) on a timeline."""
    _add_preemptions(fig, trace, x_axis)
    waits = [w for w in queue_waits(trace) if w[2] - w[1] > MIN_QUEUE_S]
    if not waits:
        return fig
    spans = [(_x(trace, start, x_axis), _x(trace, end, x_axis)) for _, start, end, _ in waits]
    fig.add_trace(
        go.Bar(
            orientation="h",
            y=[QUEUE_ROW] * len(waits),
            base=[a for a, _ in spans],
            x=[b - a for a, b in spans],
            width=QUEUE_BAR_WIDTH,
            marker={"color": QUEUE_COLOR, "line": {"color": TEXT_COLOR, "width": 1}},
            name="queue wait",
            hovertext=[
                f"R{rid} waited {end - start:.2f} s for a slot" + (" (preempted)" if again else "")
                for rid, start, end, again in waits
            ],
            hovertemplate="%{hovertext}<extra></extra>",
        )
    )
    rows = [QUEUE_ROW] + [f"slot {i}" for i in range(trace.num_slots)]
    fig.update_yaxes(categoryarray=rows)
    # Between the queue's row (category 0) and the first lane (1).
    fig.add_hline(y=0.5, line_dash="dot", line_width=1, line_color=TEXT_COLOR)
    return fig.update_layout(height=(fig.layout.height or 300) + 45)


def queue_waits(trace: Trace) -> list[tuple[int, float, float, bool]]:
    """Every wait for a slot: (request id, start s, end s, after a preemption?)."""
    waits = [
        (r.request_id, r.arrival_s, r.admit_s, False)
        for r in trace.requests
        if r.admit_s is not None
    ]
    for pos, step in enumerate(trace.steps):
        for rid in step.preempted:
            back = next(
                (s.start_s for s in trace.steps[pos:] if rid in {q.request_id for q in s.seqs}),
                trace.wall_s,
            )
            waits.append((rid, step.start_s, back, True))
    return waits


def _add_preemptions(fig: go.Figure, trace: Trace, x_axis: str) -> None:
    last_slot: dict[int, int] = {}
    marks = []  # (x, slot, request id)
    for pos, step in enumerate(trace.steps):
        for rid in step.preempted:
            x = step.start_s if x_axis == "time" else float(pos)
            marks.append((x, last_slot.get(rid), rid))
        last_slot.update({s.request_id: s.slot for s in step.seqs})
    if not marks:
        return
    fig.add_trace(
        go.Scatter(
            x=[x for x, _, _ in marks],
            y=[f"slot {slot}" for _, slot, _ in marks],
            mode="markers",
            name="preemption",
            marker={"symbol": "x", "size": 12, "color": PALETTE[5], "line": {"width": 2}},
            hovertext=[
                f"R{rid} preempted: its KV blocks freed, back to the queue" for *_, rid in marks
            ],
            hovertemplate="%{hovertext}<extra></extra>",
        )
    )


def _x(trace: Trace, time_s: float, x_axis: str) -> float:
    if x_axis == "time":
        return time_s
    return float(bisect.bisect_right([s.end_s for s in trace.steps], time_s))
