"""The results panel: the status line and every view of a run, below the request editor."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass

import gradio as gr

from engine.knobs import KNOB
from engine.page.figures import mask_heatmaps
from engine.page.panels import knob_widgets, server_panels
from engine.page.panels.server_panels import plot
from engine.page.views import divergence_view, run_view, tables
from engine.page.views.run_view import RunResult

# The layer types' hover texts, by the label's first word (assets/page.js sets them as titles).
LAYER_HELP = {
    "global": "A global layer: each query attends to every earlier key of its own request.",
    "sliding": "A sliding-window layer (Mistral, Gemma's local layers): each query attends to "
    "the last W keys of its own request only; the older ones, light grey, are outside its window.",
}


@dataclass
class ResultsPanel:
    status_markdown: gr.Markdown
    x_axis_radio: gr.Radio
    static_timeline_plot: gr.Plot
    continuous_timeline_plot: gr.Plot
    step_slider: gr.Slider
    packed_mask_plot: gr.Plot
    static_mask_plot: gr.Plot
    block_map_plot: gr.Plot
    metrics_table: gr.Dataframe
    latency_cdf_plot: gr.Plot
    step_usage_plot: gr.Plot
    outputs_table: gr.Dataframe
    divergence: DivergencePanel
    servers_markdown: gr.Markdown | None = None  # the host's servers: starting, ready, failed
    server_timeline_plot: gr.Plot | None = None  # hidden without servers
    server_chart_plot: gr.Plot | None = None
    inside: server_panels.InsidePlots | None = None  # a server's own record; hidden without servers
    mask_layer_radio: gr.Radio | None = None  # the packed mask's layer type; hidden without windows
    mask_layer_state: gr.State | None = None  # the type the step views draw: no input of the API

    def step_views(self) -> list:
        """In ``run_view.STEP_VIEW_OUTPUTS`` order."""
        found = by_elem_id(self)
        return [found[name] for name in run_view.STEP_VIEW_OUTPUTS]

    def step_inputs(self, run_state: gr.State) -> list:
        """In ``playground.update_step``'s order."""
        return [run_state, self.step_slider, self.x_axis_radio, self.mask_layer_state]


def by_elem_id(*panels) -> dict:
    """Every component of ``panels`` (nested ones too) by ``elem_id``."""
    found = {}
    for panel in panels:
        for f in fields(panel):
            value = getattr(panel, f.name)
            if is_dataclass(value):
                found |= by_elem_id(value)
            elif getattr(value, "elem_id", None):
                found[value.elem_id] = value
    return found


EMPTY_STATUS = "Press Run to compare the two engines."  # the status line before a first Run


def results_panel(
    shown: RunResult | None = None, server_names: list[str] = (), empty_status: str | None = None
) -> ResultsPanel:
    """The results, showing ``shown`` until a Run (without one, ``empty_status`` says what to
    do; None: ``EMPTY_STATUS``); with ``server_names``, their line and charts."""
    empty_status = empty_status or EMPTY_STATUS
    status = gr.Markdown(
        shown.status if shown is not None else empty_status, elem_id="status_markdown"
    )
    servers_line = server_panels.servers_line(list(server_names))
    x_axis = knob_widgets.knob_component(KNOB["x_axis"])
    *step_views, mask_layer = _step_views(shown)
    inside = server_panels.inside_plots(shown, list(server_names))
    metrics = _metrics_table(shown)
    gr.Markdown(tables.METRICS_NOTE, elem_id="metrics_note")
    with gr.Row():
        latency_cdf = plot("latency_cdf_plot", shown and shown.latency_cdf)
        step_usage = plot("step_usage_plot", shown and shown.step_usage)
    server_plots = server_panels.server_plots(shown, list(server_names))
    engines = list(shown.state.traces()) if shown is not None else ["static", "continuous"]
    outputs = run_view.outputs_table(
        shown.outputs if shown is not None else None,
        engines,
        datatype="str",  # plain text: model output is never rendered as HTML or Markdown
        interactive=False,
        wrap=True,
        label="Outputs",
        elem_id="outputs_table",
    )
    return ResultsPanel(
        status,
        x_axis,
        *step_views,
        metrics,
        latency_cdf,
        step_usage,
        outputs,
        divergence_panel(shown),
        servers_line,
        *server_plots,
        inside,
        mask_layer,
        gr.State(mask_heatmaps.GLOBAL_LAYERS),
    )


def _metrics_table(shown: RunResult | None) -> gr.Dataframe:
    """The metrics table, its column names explained on hover (page.js)."""
    return gr.Dataframe(
        value=shown.metrics if shown is not None else None,
        headers=tables.METRICS_HEADERS,
        interactive=False,
        wrap=True,
        label="Metrics (hover a column's name for what it counts)",
        column_widths=tables.METRICS_COLUMN_WIDTHS,
        elem_id="metrics_table",
    )


@dataclass
class DivergencePanel:
    """For a request whose output differs: which one, where it split and why, both runs' top 5."""

    dropdown: gr.Dropdown
    markdown: gr.Markdown
    textbox: gr.Textbox  # the model's text: the common prefix and both next tokens, plain
    table: gr.Dataframe

    def views(self) -> list:
        """In ``divergence_view.divergence_event``'s order."""
        return [self.markdown, self.textbox, self.table]


def divergence_panel(shown: RunResult | None) -> DivergencePanel:
    picks, value, text, prefix, rows = divergence_view.first_view(shown and shown.state)
    with gr.Accordion("Where outputs differ", open=False, elem_id="divergence_accordion"):
        dropdown = gr.Dropdown(
            picks, value=value, label="Request and engine", elem_id="divergence_dropdown"
        )
        markdown = gr.Markdown(text, elem_id="divergence_markdown")
        textbox = gr.Textbox(
            prefix,
            label="Common prefix, then each run's next token",
            lines=4,
            interactive=False,
            elem_id="divergence_textbox",
        )
        table = gr.Dataframe(
            value=rows,
            headers=divergence_view.TOP_HEADERS,
            datatype="str",
            interactive=False,
            label="Top 5 at the split, in both runs",
            elem_id="divergence_table",
        )
    return DivergencePanel(dropdown, markdown, textbox, table)


def _step_views(shown: RunResult | None) -> tuple:
    """Both timelines, the slider, both masks and the block map, then the layer type."""
    v = shown.views if shown is not None else None
    with gr.Row():
        static_timeline = plot("static_timeline_plot", v and v.static_timeline)
        continuous_timeline = plot("continuous_timeline_plot", v and v.continuous_timeline)
    step_slider = gr.Slider(
        0,
        max(shown.state.num_steps - 1, 1) if shown is not None else 1,
        value=shown.step_index if shown is not None else 0,
        step=1,
        label=run_view.slider_label(shown.state) if shown else "Step (one forward pass)",
        elem_id="step_slider",
    )
    layers = list(mask_heatmaps.layer_types(shown.state.continuous)) if shown else []
    mask_layer = gr.Radio(
        layers or [mask_heatmaps.GLOBAL_LAYERS],
        value=mask_heatmaps.GLOBAL_LAYERS,
        label="Layers: the packed mask of a global or a sliding-window layer (hover for each)",
        visible=len(layers) > 1,
        elem_id="mask_layer_radio",
    )
    with gr.Row():
        packed_mask = plot("packed_mask_plot", v and v.packed_mask)
        static_mask = plot("static_mask_plot", v and v.static_mask)
    block_map = plot("block_map_plot", v and v.block_map)
    views = static_timeline, continuous_timeline, step_slider, packed_mask, static_mask, block_map
    return *views, mask_layer
