"""The page's shared figure look: colours, titles, legends and the PNG button, for every chart.

Okabe–Ito colours (safe for common colour blindness), one per request in every chart;
transparent backgrounds and grey text for light and dark themes; titles left-aligned for phones.
"""

from __future__ import annotations

import html
import json
import re
import textwrap

import plotly.graph_objects as go
import plotly.io as pio

# Every chart's template, applied when the figure is serialised (docs/page.md, "Gradio's costs").
pio.templates.default = "plotly_white"

# Okabe–Ito without black (black vanishes on a dark page).
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
TEXT_COLOR = "#808080"  # mid grey: readable on white and on near-black
GRID_COLOR = "rgba(128,128,128,0.25)"
REPEAT_PATTERNS = ("", ".", "x", "+", "-", "|", "\\")  # by how many times the palette came round
TITLE_FONT_PX = 15
TITLE_TOP_PX = 10  # every title's top, below the figure's top edge
TITLE_LINE_PX = 18  # each line of a title and its subtitle takes this much of the top margin
MESSAGE_LINE_CHARS = 44  # a message's line: whole on a 390-px phone (Plotly never wraps text)

# Engine line colours (Okabe–Ito, distinct from each other) and dashes, so lines differ in
# shape as well as hue.
ENGINE_STYLE = {
    "static": ("#D55E00", "dot"),
    "continuous": ("#0072B2", "solid"),
    "hf_continuous": ("#009E73", "dash"),
}
# Server engines (named by the host) in the order a run lists them.
SERVER_STYLES = (
    ("#CC79A7", "dashdot"),
    ("#E69F00", "longdash"),
    ("#56B4E9", "longdashdot"),
    ("#F0E442", "dot"),
)


def engine_styles(names: list[str]) -> dict[str, tuple[str, str]]:
    servers = [n for n in names if n not in ENGINE_STYLE]
    styles = {n: SERVER_STYLES[i % len(SERVER_STYLES)] for i, n in enumerate(servers)}
    return {n: ENGINE_STYLE.get(n) or styles[n] for n in names}


class PageFigure(go.Figure):
    """A plotly Figure whose JSON carries ``config`` for Gradio's Plot (the PNG button's name)."""

    def plotly_config(self) -> dict:
        """The PNG button's file name and scale, no logo (also ``export.charts_html``'s)."""
        image = {"format": "png", "filename": chart_filename(self.layout.title.text), "scale": 2}
        return {"displaylogo": False, "toImageButtonOptions": image}

    def to_json(self, *args, **kwargs) -> str:
        text = super().to_json(*args, **kwargs)
        assert text.endswith("}"), "plotly JSON is one object"
        return f"{text[:-1]}, {json.dumps('config')}: {json.dumps(self.plotly_config())}}}"


def chart_filename(title: str | None) -> str:
    """A file name from a title: "Static batching — 3 slots" -> "static-batching-3-slots"."""
    words = re.findall(r"[a-z0-9]+", re.sub(r"<[^>]*>", " ", (title or "").lower()))
    return "-".join(words)[:60].strip("-") or "chart"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def request_ids(ids: list[int]) -> str:
    return ", ".join(f"R{i}" for i in ids)


def request_color(request_id: int) -> str:
    return PALETTE[request_id % len(PALETTE)]


def request_pattern(request_id: int) -> dict:
    """Pattern of a request whose colour an earlier one has: dots for R7–R13, crosses next, ..."""
    shape = REPEAT_PATTERNS[(request_id // len(PALETTE)) % len(REPEAT_PATTERNS)]
    return {"shape": shape, "fgcolor": "#ffffff", "size": 6, "solidity": 0.35} if shape else {}


def style_figure(fig: go.Figure, title: str, subtitle: str | None = None) -> go.Figure:
    """Apply the shared look; titles sit ``TITLE_TOP_PX`` below the top, aligned side by side."""
    fig.update_layout(figure_style(title, subtitle))
    fig.update_xaxes(AXIS_STYLE)
    fig.update_yaxes(AXIS_STYLE)
    return fig


AXIS_STYLE = {"gridcolor": GRID_COLOR, "zerolinecolor": GRID_COLOR, "linecolor": GRID_COLOR}


def figure_style(title: str, subtitle: str | None = None) -> dict:
    """The shared look as a layout dict (axes aside), for a figure built in one call."""
    lines = 1 + (subtitle or "").count("<br>") + bool(subtitle)
    return {
        "title": {
            "text": title,
            "subtitle": {"text": subtitle or ""},
            "x": 0,
            "xref": "container",
            "xanchor": "left",
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"l": 12, "t": TITLE_TOP_PX},
            "font": {"size": TITLE_FONT_PX},
        },
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"color": TEXT_COLOR},
        "margin": {"l": 90, "r": 20, "t": 40 + TITLE_LINE_PX * lines, "b": 50},
    }


def bottom_legend(fig: go.Figure, margin_bottom_px: int = 100) -> go.Figure:
    """The legend in a row at the bottom edge, below the x axis (room left for it to wrap)."""
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


def discrete_colors(colors: list[str]) -> dict:
    n = len(colors)
    scale = [pair for i, c in enumerate(colors) for pair in ([i / n, c], [(i + 1) / n, c])]
    return {"colorscale": scale, "zmin": -0.5, "zmax": n - 0.5, "showscale": False}


def message_figure(title: str, text: str, height_px: int = 200) -> go.Figure:
    """An empty chart that says why, in lines a phone shows whole (one constructor call: plotly's
    ``update_*`` calls are slow, and a run's first update sends nine of these)."""
    lines = textwrap.wrap(text, MESSAGE_LINE_CHARS, break_on_hyphens=False)
    note = "<br>".join(html.escape(line, quote=False) for line in lines)
    hidden_axis = {**AXIS_STYLE, "visible": False}
    layout = figure_style(title) | {
        "annotations": [{"text": note, "showarrow": False}],
        "xaxis": hidden_axis,
        "yaxis": hidden_axis,
        "height": max(height_px, 120 + TITLE_LINE_PX * len(lines)),  # every line inside the chart
    }
    return PageFigure(layout=layout)
