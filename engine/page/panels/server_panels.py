"""Panel builders for the host's servers: the checkboxes, the servers line, their charts, and a
scheduler's own record (``InsidePlots``). Left out or hidden without servers."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.page.figures import server_lanes
from engine.page.run import shared_model
from engine.page.views import inside_view, server_view

STARTING_PERIOD_S = 1.0
STEADY_PERIOD_S = 5.0


# What ticking a server costs: said under the box and on each choice's hover (assets/page.js).
SERVERS_COST = (
    "None ticked by default: each ticked server runs after our engines, and a run with one "
    "waits for it, its start included (minutes for vLLM the first time), and so does everyone "
    "in line after you, as the servers share this host's CPUs. Our engines' results show as "
    "soon as they are ready; each server's follow as it finishes."
)


def servers_checkbox(server_names: list[str]) -> gr.CheckboxGroup:
    """The host's servers to run too, none ticked (``SERVERS_COST`` says why)."""
    return gr.CheckboxGroup(
        server_names,
        value=[],
        label=f"{server_lanes.SERVERS_BOX} (after our engines, same requests)",
        info=f"Set up by whoever runs this page (app.py --vllm, --llamacpp, --endpoint NAME=URL). "
        f"{SERVERS_COST}",
        visible=bool(server_names),
        elem_id="servers_checkbox",
    )


def servers_line(server_names: list[str]) -> gr.Markdown:
    """The servers line, with the timer that keeps it fresh (none without servers)."""
    line = gr.Markdown(
        server_view.servers_markdown(shared_model.page_servers()) if server_names else "",
        visible=bool(server_names),
        elem_id="servers_markdown",
    )
    if server_names:
        timer = gr.Timer(STARTING_PERIOD_S)
        timer.tick(refresh, None, [line, timer], queue=False, api_visibility="undocumented")
    return line


def refresh() -> tuple[str, gr.Timer]:
    """The servers line now, and the timer's next period (fast while a server starts)."""
    servers = shared_model.page_servers()
    starting = servers is not None and servers.starting()
    period_s = STARTING_PERIOD_S if starting else STEADY_PERIOD_S
    return server_view.servers_markdown(servers), gr.Timer(period_s)


def server_plots(shown, server_names: list[str]) -> tuple[gr.Plot, gr.Plot]:
    with gr.Column(visible=bool(server_names)):
        timeline = plot("server_timeline_plot", shown and shown.server_timeline)
        chart = plot("server_chart_plot", shown and shown.server_chart)
    return timeline, chart


@dataclass
class InsidePlots:
    timeline: gr.Plot
    mask: gr.Plot
    block_map: gr.Plot
    usage: gr.Plot
    column: gr.Column  # hidden without servers until a run draws transformers' record


def inside_plots(shown, server_names: list[str]) -> InsidePlots:
    """The record's source, timeline, packed mask, block map and per-step use (hidden till
    drawn)."""
    views = shown.views if shown is not None else None
    visible = bool(server_names) or bool(shown is not None and shown.inside_shown)
    with gr.Column(visible=visible, elem_id="inside_column") as column:
        gr.Markdown(inside_view.INSIDE_NOTE, elem_id="inside_markdown")
        with gr.Row():
            timeline = plot("inside_timeline_plot", views and views.inside_timeline)
            mask = plot("inside_mask_plot", views and views.inside_mask)
        with gr.Row():
            block_map = plot("inside_block_map_plot", views and views.inside_block_map)
            usage = plot("inside_usage_plot", shown and shown.inside_usage)
    return InsidePlots(timeline, mask, block_map, usage, column)


def plot(elem_id: str, figure) -> gr.Plot:
    return gr.Plot(figure, show_label=False, elem_id=elem_id)
