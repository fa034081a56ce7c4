"""Figure builders: the timelines, the two attention-mask heatmaps and the table rows of the page.

Everything here is built from an ``engine.trace.Trace`` alone, so what the page draws is what the
engine recorded. This module and ``engine.page.serving_figures`` (latency, token budget and KV block
views) are the only ones that import plotly.

Colours come from the Okabe–Ito palette (safe for the common kinds of colour blindness), one per
request through ``request_color``, so a request keeps its colour in every chart. Backgrounds are
transparent and text and grid lines a neutral grey, so the figures read in light and dark themes.
Heatmaps never hand the browser more than ``MAX_HEATMAP_CELLS`` cells: bigger masks are max-pooled
into tiles, and the title says so.
"""

from __future__ import annotations

import html
import json
import math
import re

import plotly.graph_objects as go
import torch

from engine.masks import block_diagonal_causal_mask, packed_layout, padded_wave_mask
from engine.trace import IDLE, PREFILL, SlotRun, StepRecord, Trace

# Okabe–Ito without black (black vanishes on a dark page).
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
IDLE_COLOR = "rgba(128,128,128,0.45)"  # timeline: a static row computed after its request finished
PAD_COLOR = "#c8c8c8"  # static mask: cells of left-padding tokens
IDLE_ROW_COLOR = "#6e6e6e"  # static mask: attention of a row whose request already finished
TEXT_COLOR = "#808080"  # mid grey: readable on white and on near-black
GRID_COLOR = "rgba(128,128,128,0.25)"
MAX_HEATMAP_CELLS = 512 * 4096
MAX_QUERY_CELLS, MAX_KEY_CELLS = 512, 4096  # tile sizes are chosen to fit this box
SMALL_GRID_CELLS = 80  # heatmaps up to this many cells a side get a 1-px gap between cells
PROMPT_HOVER_CHARS = 60
REPEAT_PATTERNS = ("", ".", "x", "+", "-", "|", "\\")  # by how many times the palette came round
TITLE_FONT_PX = 15


class PageFigure(go.Figure):
    """A plotly Figure that carries its Plotly config into the page.

    Gradio's Plot sends ``fig.to_json()`` to the browser and hands a ``config`` key found there to
    ``Plotly.react``; this adds one, so the modebar's camera button saves a PNG (drawn in the
    browser, offline) under a name taken from the chart's title.
    """

    def plotly_config(self) -> dict:
        """Plotly config: the PNG button's file name and scale, no Plotly logo."""
        image = {"format": "png", "filename": chart_filename(self.layout.title.text), "scale": 2}
        return {"displaylogo": False, "toImageButtonOptions": image}

    def to_json(self, *args, **kwargs) -> str:
        """The figure's JSON (``data``, ``layout``) plus ``config``."""
        text = super().to_json(*args, **kwargs)
        assert text.endswith("}"), "plotly JSON is one object"
        return f"{text[:-1]}, {json.dumps('config')}: {json.dumps(self.plotly_config())}}}"


def chart_filename(title: str | None) -> str:
    """A file name (no extension) from a chart title: "Static batching — 3 slots" ->
    "static-batching-3-slots"; at most 60 characters, "chart" when the title is empty."""
    words = re.findall(r"[a-z0-9]+", re.sub(r"<[^>]*>", " ", (title or "").lower()))
    return "-".join(words)[:60].strip("-") or "chart"


def request_color(request_id: int) -> str:
    """The colour of one request, the same in every chart."""
    return PALETTE[request_id % len(PALETTE)]


def request_pattern(request_id: int) -> str:
    """The bar pattern that marks a request whose colour an earlier request already has: none for
    R0–R6, dots for R7–R13, crosses for R14–R20, ... ("/" stays the idle rows' hatching)."""
    return REPEAT_PATTERNS[(request_id // len(PALETTE)) % len(REPEAT_PATTERNS)]


def _style(fig: go.Figure, title: str, subtitle: str | None = None) -> go.Figure:
    """Apply the shared theme-neutral look: transparent background, grey text and grid, the title
    left-aligned (it reads on a phone; the toolbar shows on the right, on hover only)."""
    lines = 1 + (subtitle or "").count("<br>") + bool(subtitle)
    fig.update_layout(
        template="plotly_white",
        title={
            "text": title,
            "subtitle": {"text": subtitle or ""},
            "x": 0,
            "xref": "container",
            "xanchor": "left",
            "pad": {"l": 12},
            "font": {"size": TITLE_FONT_PX},
        },
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font={"color": TEXT_COLOR},
        margin={"l": 90, "r": 20, "t": 40 + 18 * lines, "b": 50},
    )
    axis_style = {"gridcolor": GRID_COLOR, "zerolinecolor": GRID_COLOR, "linecolor": GRID_COLOR}
    fig.update_xaxes(**axis_style)
    fig.update_yaxes(**axis_style)
    return fig


def bottom_legend(fig: go.Figure, margin_bottom_px: int = 100) -> go.Figure:
    """The legend in a row at the figure's bottom edge, below the x axis's ticks and title (it
    may wrap on a narrow screen: the margin leaves it room)."""
    return fig.update_layout(
        legend={
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "y": 0,
            "yref": "container",
            "yanchor": "bottom",
        },
        margin={"b": margin_bottom_px},
    )


def _engine_title(trace: Trace) -> str:
    slots = "slot" if trace.num_slots == 1 else "slots"
    return f"{trace.engine.capitalize()} batching — {trace.num_slots} {slots}"


# --- timelines -----------------------------------------------------------------------------------


def x_extent(trace: Trace, x_axis: str = "time") -> float:
    """Right end of a trace on the timeline's x axis: last step's end (s) or number of steps."""
    if not trace.steps:
        return 0.0
    return trace.steps[-1].end_s if x_axis == "time" else float(len(trace.steps))


def _span(trace: Trace, run: SlotRun, x_axis: str) -> tuple[float, float]:
    """(start, end) of a run on the x axis."""
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
    return (
        f"<b>R{r.request_id}</b> · slot {run.slot}<br>{html.escape(prompt)}<br>"
        f"cap {r.max_new_tokens} · generated {len(r.output_token_ids)} tokens<br>"
        f"steps {run.first}–{run.last} · {times} · TTFT {ttft}"
    )


def _bar(runs: list[SlotRun], trace: Trace, x_axis: str, **style) -> go.Bar:
    """One horizontal bar trace holding the given runs."""
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
    """Slot lanes with one bar per request; static idle rows hatched grey, wave barriers dashed.

    ``x_axis`` is ``"time"`` (seconds since start) or ``"step"`` (step index). ``x_max`` fixes the
    x range so two engines share a scale; ``cursor`` (a step index) draws a vertical line there.
    """
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
                marker={"color": request_color(rid), "pattern": _repeat_mark(rid)},
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
    _add_barriers(fig, trace, x_axis)
    if cursor is not None and trace.steps:
        fig.add_vline(x=_cursor_x(trace, cursor, x_axis), name="cursor", line_color=TEXT_COLOR)
    _style(fig, _engine_title(trace))
    lanes = [f"slot {i}" for i in range(trace.num_slots)]
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=lanes)
    fig.update_yaxes(autorange="reversed")
    x_title = "seconds since start" if x_axis == "time" else "step (one forward pass each)"
    fig.update_xaxes(title_text=x_title, range=None if x_max is None else [0, x_max])
    fig.update_layout(barmode="overlay", height=190 + 45 * trace.num_slots)
    return bottom_legend(fig, 90)


def _repeat_mark(request_id: int) -> dict:
    """A bar's pattern: none for R0–R6, then a mark per round of the palette (see
    ``request_pattern``), drawn in the bar's text colour over its request colour."""
    shape = request_pattern(request_id)
    return {"shape": shape, "fgcolor": "#ffffff", "size": 6, "solidity": 0.35} if shape else {}


def _add_barriers(fig: go.Figure, trace: Trace, x_axis: str) -> None:
    """A dashed vertical line where a static wave ends and the next waits for it (the batch
    barrier); the run's end is no barrier. Its label sits left of the line, inside the plot."""
    for pos, step in enumerate(trace.steps[:-1]):
        if step.wave is None or trace.steps[pos + 1].wave == step.wave:
            continue
        x = step.end_s if x_axis == "time" else pos + 1
        fig.add_vline(
            x=x,
            name="barrier",
            line_dash="dash",
            line_color=TEXT_COLOR,
            annotation_text="barrier",
            annotation_position="top left",
        )


def _cursor_x(trace: Trace, cursor: int, x_axis: str) -> float:
    """Where the step cursor sits: that step's start, or the run's end if it had fewer steps."""
    if cursor >= len(trace.steps):
        return x_extent(trace, x_axis)
    return trace.steps[cursor].start_s if x_axis == "time" else float(cursor)


# --- heatmaps ------------------------------------------------------------------------------------


def _discrete_scale(colors: list[str]) -> list[list]:
    """A stepped colorscale: integer value i (with zmin=-0.5, zmax=n-0.5) gets colors[i]."""
    n = len(colors)
    return [pair for i, c in enumerate(colors) for pair in ([i / n, c], [(i + 1) / n, c])]


def _tile_factors(num_rows: int, num_cols: int) -> tuple[int, int]:
    """Rows and columns per tile so a heatmap fits MAX_HEATMAP_CELLS; (1, 1) if it does already."""
    if num_rows * num_cols <= MAX_HEATMAP_CELLS:
        return 1, 1
    return math.ceil(num_rows / MAX_QUERY_CELLS), math.ceil(num_cols / MAX_KEY_CELLS)


def _max_pool(codes: torch.Tensor, fq: int, fk: int) -> torch.Tensor:
    """Max over fq x fk tiles of an integer grid whose blank cells are -1.

    Shapes:
        codes: [T, T_kv] -> returns [ceil(T / fq), ceil(T_kv / fk)]
    """
    rows, cols = codes.shape
    padded = torch.full((math.ceil(rows / fq) * fq, math.ceil(cols / fk) * fk), -1)
    padded[:rows, :cols] = codes
    return padded.reshape(padded.shape[0] // fq, fq, padded.shape[1] // fk, fk).amax(dim=(1, 3))


def _tile_labels(n: int, factor: int) -> list[str]:
    """Axis labels of pooled tiles: "0–7", "8–15", ..."""
    return [f"{i}–{min(i + factor, n) - 1}" for i in range(0, n, factor)]


def _heatmap(codes: torch.Tensor, x: list, y: list, colors: list[str], hover: str) -> go.Heatmap:
    """A heatmap of integer codes (-1 = blank) drawn with one colour per code."""
    z = codes.to(torch.float32)
    z[codes < 0] = float("nan")
    gap = 1 if max(codes.shape) <= SMALL_GRID_CELLS else 0  # cell borders only where they show
    return go.Heatmap(
        z=z.numpy(),
        x=x,
        y=y,
        colorscale=_discrete_scale(colors),
        zmin=-0.5,
        zmax=len(colors) - 0.5,
        showscale=False,
        hoverongaps=False,
        xgap=gap,
        ygap=gap,
        hovertemplate=hover + "<extra></extra>",
    )


def mask_heatmap(trace: Trace, step_index: int) -> go.Figure:
    """The block-diagonal causal mask of one packed (continuous) step, coloured by request.

    Rows are query tokens in packed order, columns keys laid out ``[all cached | all new]`` as in
    ``engine.masks``; a cell is coloured by the sequence that owns it where attention is allowed.
    """
    step = trace.steps[step_index]
    layout = packed_layout(
        [s.num_cached_tokens for s in step.seqs], [s.num_new_tokens for s in step.seqs]
    )
    mask = block_diagonal_causal_mask(layout)  # (T, T_kv)
    num_q, num_kv = mask.shape
    codes = torch.where(mask, layout.q_seq[:, None].expand_as(mask), -1)  # (T, T_kv)
    names = [f"R{s.request_id}" for s in step.seqs]
    fq, fk = _tile_factors(num_q, num_kv)
    if (fq, fk) == (1, 1):
        y = [
            f"{names[s]} pos {p}"
            for s, p in zip(layout.q_seq.tolist(), layout.q_pos.tolist(), strict=True)
        ]
        x = [
            f"{names[s]} pos {p}"
            for s, p in zip(layout.k_seq.tolist(), layout.k_pos.tolist(), strict=True)
        ]
        hover, note = "query %{y} → key %{x}", None
    else:
        codes = _max_pool(codes, fq, fk)
        y, x = _tile_labels(num_q, fq), _tile_labels(num_kv, fk)
        hover = "queries %{y} → keys %{x}"
        note = f"aggregated: each cell is a {fq}×{fk} tile of tokens"
    colors = [request_color(s.request_id) for s in step.seqs]
    fig = PageFigure(_heatmap(codes, x, y, colors, hover))
    if layout.num_cached_keys > 0:
        fig.add_vline(
            x=layout.num_cached_keys / fk - 0.5,
            name="cached | new",
            line_color=TEXT_COLOR,
            annotation_text="cached | new",
            annotation_position="top",
        )
    n_prefill = sum(s.kind == PREFILL for s in step.seqs)
    title = f"Packed step {step_index}: T={num_q}, T_kv={num_kv}"
    subtitle = (
        f"{num_q} {'query' if num_q == 1 else 'queries'} × {num_kv} keys · "
        f"{n_prefill} prefill + {len(step.seqs) - n_prefill} decode"
    ) + (f"<br>{note}" if note else "")
    starts = [sum(q.num_new_tokens for q in step.seqs[:i]) for i in range(len(step.seqs))]
    _mark_repeated_colours(
        fig, [(q.request_id, a // fq) for q, a in zip(step.seqs, starts, strict=True)]
    )
    return _mask_axes(_style(fig, title, subtitle), "keys: cached | this step's new tokens")


def _mark_repeated_colours(fig: go.Figure, bands: list[tuple[int, int]]) -> None:
    """Where two requests in one heatmap share a colour (ids a palette apart), name each of them
    at the top of its band of query rows (``bands``: request id, first row)."""
    colours = [request_color(rid) for rid, _ in bands]
    for (rid, row), colour in zip(bands, colours, strict=True):
        if colours.count(colour) > 1:
            fig.add_annotation(
                x=0,
                xref="x domain",
                xanchor="left",
                y=row,
                yref="y",
                yanchor="top",
                text=f"<b>R{rid}</b>",
                showarrow=False,
                name="repeated colour",
                font={"size": 10, "color": "#000000"},
                bgcolor="rgba(255,255,255,0.8)",
            )


def _mask_axes(fig: go.Figure, x_title: str) -> go.Figure:
    """Category axes, queries read top-down."""
    fig.update_xaxes(type="category", title_text=x_title, showgrid=False)
    fig.update_yaxes(type="category", title_text="queries", showgrid=False, autorange="reversed")
    fig.update_layout(height=460)
    return fig


def _wave_start(trace: Trace, step_index: int) -> int:
    """Position of the first step (the prefill) of the static wave holding ``step_index``."""
    wave, pos = trace.steps[step_index].wave, step_index
    while pos > 0 and trace.steps[pos - 1].wave == wave:
        pos -= 1
    return pos


def _static_codes(step: StepRecord, pads: list[int], num_q: int, num_k: int) -> torch.Tensor:
    """Per-cell codes of a padded wave step: row b, B = pad, B + 1 = idle row, -1 = blocked.

    Shapes:
        returns: [B * num_q, num_k]
    """
    num_rows = len(step.seqs)
    mask = padded_wave_mask(pads, num_q, num_k)  # (B, Q, K)
    k = torch.arange(num_k)[None, None, :]  # (1, 1, K)
    q = torch.arange(num_k - num_q, num_k)[None, :, None]  # (1, Q, 1)
    p = torch.tensor(pads)[:, None, None]  # (B, 1, 1)
    pad = ((k < p) | (q < p)) & (k <= q)  # (B, Q, K)
    idle = torch.tensor([s.kind == IDLE for s in step.seqs])[:, None, None]  # (B, 1, 1)
    codes = torch.where(mask, torch.arange(num_rows)[:, None, None], -1)  # (B, Q, K)
    codes = torch.where(pad, num_rows, codes)
    codes = torch.where(mask & idle, num_rows + 1, codes)
    return codes.reshape(num_rows * num_q, num_k)


def static_mask_heatmap(trace: Trace, step_index: int) -> go.Figure:
    """The padded mask ``model.generate`` applies to one static step, rows stacked top-down.

    Each row of the wave is a block of its queries against all key columns (left padding first);
    pad cells and the attention of rows whose request already finished get neutral colours.
    """
    step = trace.steps[step_index]
    first = _wave_start(trace, step_index)
    prefill = trace.steps[first].seqs
    pad_of = {s.slot: s.num_padding_tokens for s in prefill}
    width = max(s.num_new_tokens + s.num_padding_tokens for s in prefill)
    num_q = width if step_index == first else 1
    num_k = width + step_index - first
    pads = [pad_of.get(s.slot, 0) for s in step.seqs]
    codes = _static_codes(step, pads, num_q, num_k)
    fq, fk = _tile_factors(*codes.shape)
    if (fq, fk) == (1, 1):
        y = [f"R{s.request_id} col {c}" for s in step.seqs for c in range(num_k - num_q, num_k)]
        x, hover, note = list(range(num_k)), "query %{y} → key col %{x}", None
    else:
        codes = _max_pool(codes, fq, fk)
        y, x = _tile_labels(codes.shape[0] * fq, fq), _tile_labels(num_k, fk)
        hover, note = "queries %{y} → keys %{x}", f"aggregated into {fq}×{fk} tiles"
    colors = [request_color(s.request_id) for s in step.seqs] + [PAD_COLOR, IDLE_ROW_COLOR]
    fig = PageFigure(_heatmap(codes, x, y, colors, hover))
    for b in range(1, len(step.seqs)) if num_q > 1 and (fq, fk) == (1, 1) else ():
        fig.add_hline(y=b * num_q - 0.5, name="row", line_color=TEXT_COLOR, line_width=1)
    num_idle = sum(s.kind == IDLE for s in step.seqs)
    title = f"Static step {step_index}: wave {step.wave}, its step {step_index - first}"
    subtitle = (
        f"{len(step.seqs)} rows × {num_q} {'query' if num_q == 1 else 'queries'} × {num_k} keys"
        f"<br>{sum(pads)} pad tokens (light grey)<br>{num_idle} idle "
        f"{'row' if num_idle == 1 else 'rows'} (dark grey: its request has ended)"
        + (f"<br>{note}" if note else "")
    )
    if (fq, fk) == (1, 1):
        _mark_repeated_colours(fig, [(s.request_id, b * num_q) for b, s in enumerate(step.seqs)])
    return _mask_axes(_style(fig, title, subtitle), "key column (left padding first)")


# --- tables --------------------------------------------------------------------------------------
