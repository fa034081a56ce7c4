"""Panel builders: the page's components, built inside ``app.py``'s ``gr.Blocks``, one panel each.

``app.py`` calls these in page order and wires their components' events; each builder only lays
components out and returns them in a small dataclass named after the panel. Element ids
(``elem_id``) are a contract: the browser tests and users' scripts find components by them.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.page import (
    divergence_view,
    page_io,
    playground,
    presets,
    run_view,
    server_panels,
    tables,
    tour,
)
from engine.page.run_view import RunResult

TITLE = "Continuous Batching Playground"
INTRO = (
    "The same requests run twice on the same model. **Static batching** pads a wave of B requests "
    "and runs it until its longest request is done; the other slots idle behind the batch "
    "barrier. **Continuous batching** refills a slot the step its request finishes, and packs "
    "every in-flight token into one forward pass, a new prompt's prefill riding along with the "
    "others' decode steps behind a block-diagonal causal mask. Edit the requests, pick the number "
    "of slots and press Run; then drag the step slider to see each step's attention mask."
)
KV_MODES = [
    ("paged: blocks from a memory budget, preemption (vLLM)", "paged"),
    ("in place, per slot", "slots"),
    ("article's concatenation (slow, O(n²))", "concat"),
]
POLICIES = [("decode first", "decode_first"), ("prefill first", "prefill_first")]
PREFIX_CACHING_INFO = (
    "A prompt's full blocks that an earlier request computed are shared, not prefilled again "
    "(vLLM's automatic prefix caching); the block map shows shared blocks and the mask the keys "
    "taken from the cache. Paged KV mode only. The static engine cannot share: its waves "
    "prefill every prompt in full."
)
REQUESTS_LABEL = (
    "Requests (arrival_s: seconds after Run, 0 = at once; temperature, top_k, top_p, seed: "
    "all empty = greedy, any one set = sampled from the row's own seeded generator)"
)


def header(model_label: str) -> None:
    """Title, introduction, the loaded model's label and the guided tour."""
    gr.Markdown(f"# {TITLE}\n\n{INTRO}")
    gr.Markdown(model_label)
    with gr.Accordion("Guided tour: what to look at", open=False, elem_id="tour_accordion"):
        steps = tour.load_tour()
        with gr.Walkthrough(selected=1, elem_id="tour_walkthrough") as walkthrough:
            for number, step in enumerate(steps, start=1):
                with gr.Step(step.title, id=number):
                    gr.Markdown(step.markdown())
                    if number < len(steps):  # visited steps' headers lead back
                        gr.Button("Next", size="sm", elem_id=f"tour_next_{number}").click(
                            tour.step_selector(number + 1),
                            None,
                            walkthrough,
                            queue=False,
                            api_visibility="undocumented",
                        )


@dataclass
class RequestsPanel:
    """The request table, its upload and download buttons, and the preset's explanation."""

    table: gr.Dataframe
    upload_button: gr.UploadButton
    table_button: gr.Button
    table_file: gr.File
    preset_markdown: gr.Markdown


def requests_panel(rows: list[list], preset_text: str) -> RequestsPanel:
    """The request editor, filled with the default preset's ``rows``."""
    table = gr.Dataframe(
        value=rows,
        headers=playground.REQUEST_HEADERS,
        # the seed is text: a browser number loses digits past 2^53, and seeds go to 2^63 - 1
        datatype=["str", "number", "number", "number", "number", "number", "str"],
        type="array",
        interactive=True,
        column_count=len(playground.REQUEST_HEADERS),  # column_limits: not implemented in 6.31
        label=REQUESTS_LABEL,
        column_widths=["46%", "11%", "9%", "10%", "7%", "7%", "10%"],
        elem_id="requests_table",
    )
    with gr.Row():
        upload_button = gr.UploadButton(
            "Upload CSV or JSONL",
            file_types=[".csv", ".jsonl", ".json"],
            size="sm",
            elem_id="upload_button",
        )
        table_button = gr.Button(
            "Download the table (CSV, JSONL)", size="sm", elem_id="table_button"
        )
    table_file = gr.File(
        label="The table: workload.csv · workload.jsonl",
        file_count="multiple",
        interactive=False,
        visible=False,
        elem_id="table_file",
    )
    preset_markdown = gr.Markdown(preset_text, elem_id="preset_markdown")
    return RequestsPanel(table, upload_button, table_button, table_file, preset_markdown)


@dataclass
class SettingsPanel:
    """Preset, slots, checks, the engine settings, Run and Stop, and the setup link."""

    preset_dropdown: gr.Dropdown
    slots_slider: gr.Slider
    chat_checkbox: gr.Checkbox
    reference_checkbox: gr.Checkbox
    kv_mode_dropdown: gr.Dropdown
    kv_budget_number: gr.Number
    block_size_number: gr.Number
    prefix_caching_checkbox: gr.Checkbox
    token_budget_number: gr.Number
    policy_radio: gr.Radio
    arrival_rate_number: gr.Number
    compare_hf_checkbox: gr.Checkbox
    dtype_dropdown: gr.Dropdown
    batch_invariant_checkbox: gr.Checkbox
    precision_markdown: gr.Markdown  # what batch-invariant mode does, and where it does not reach
    run_button: gr.Button
    stop_button: gr.Button
    link_button: gr.Button
    link_textbox: gr.Textbox
    stop_reply_textbox: gr.Textbox  # hidden: what Stop found ("running", "queued", "idle")
    leave_queue_button: gr.Button  # hidden: clicked by the page to take a queued run out
    servers_checkbox: gr.CheckboxGroup | None = None  # the host's servers (hidden if none)


def settings_panel(
    chat_template: bool,
    server_names: list[str] = (),
    dtypes: list[str] = ("float32", "bfloat16"),
    dtype: str = "float32",
) -> SettingsPanel:
    """The right-hand column of settings; the engine knobs sit in a closed accordion, the
    precision (one of ``dtypes``, ``dtype`` first chosen) and batch-invariant mode last in it."""
    preset_dropdown = gr.Dropdown(
        choices=list(presets.load_presets()),
        value=presets.DEFAULT_PRESET,
        label="Preset",
        elem_id="preset_dropdown",
    )
    slots_slider = gr.Slider(
        1,
        page_io.MAX_SLOTS,
        value=page_io.DEFAULT_SLOTS,
        step=1,
        label="Slots (B)",
        elem_id="slots_slider",
    )
    chat_checkbox = gr.Checkbox(
        value=chat_template, label="Use chat template", elem_id="chat_checkbox"
    )
    reference_checkbox = gr.Checkbox(
        value=True, label="Check outputs against model.generate", elem_id="reference_checkbox"
    )
    servers = server_panels.servers_checkbox(list(server_names))
    with gr.Accordion("Engine settings", open=False):
        knobs = _engine_knobs()
        precision = _precision_knobs(dtypes, dtype)
    with gr.Row():
        run_button = gr.Button("Run", variant="primary", elem_id="run_button")
        stop_button = gr.Button("Stop", variant="stop", elem_id="stop_button")
    link_button = gr.Button("Copy link to this setup", size="sm", elem_id="link_button")
    link_textbox = gr.Textbox(
        label="Link: preset, slots and step (an edited table is not in it)",
        interactive=False,
        buttons=["copy"],
        elem_id="link_textbox",
    )
    stop_reply = gr.Textbox(visible="hidden", elem_id="stop_reply_textbox")
    leave_queue = gr.Button("Leave the queue", visible="hidden", elem_id="leave_queue_button")
    return SettingsPanel(
        preset_dropdown,
        slots_slider,
        chat_checkbox,
        reference_checkbox,
        *knobs,
        *precision,
        run_button,
        stop_button,
        link_button,
        link_textbox,
        stop_reply,
        leave_queue,
        servers_checkbox=servers,
    )


def _precision_knobs(dtypes: list[str], dtype: str) -> tuple:
    """The dtype, the batch-invariant toggle and its note, in ``SettingsPanel`` field order."""
    with gr.Row():
        dtype_dropdown = gr.Dropdown(
            dtypes, value=dtype, label="Precision (dtype)", elem_id="dtype_dropdown"
        )
        invariant = gr.Checkbox(
            value=False, label="Batch-invariant mode", elem_id="batch_invariant_checkbox"
        )
    return dtype_dropdown, invariant, gr.Markdown("", elem_id="precision_markdown")


def _engine_knobs() -> tuple:
    """The engine settings accordion's components, in ``SettingsPanel`` field order."""
    kv_mode = gr.Dropdown(
        KV_MODES, value="paged", label="Continuous engine's KV cache", elem_id="kv_mode_dropdown"
    )
    with gr.Row():
        kv_budget = gr.Number(
            value=0,
            label="Paged: KV budget, MiB (0 = room for every slot)",
            elem_id="kv_budget_number",
        )
        block_size = gr.Number(  # no precision=0: it rounds 7.5 quietly
            value=16, label="Paged: tokens per block (1 to 256)", elem_id="block_size_number"
        )
    prefix_caching = gr.Checkbox(
        value=False,
        label="Paged: prefix caching",
        info=PREFIX_CACHING_INFO,
        elem_id="prefix_caching_checkbox",
    )
    token_budget = gr.Number(
        value=0, label="Token budget per step (0 = no limit)", elem_id="token_budget_number"
    )
    policy = gr.Radio(
        POLICIES, value="decode_first", label="Who gets the budget first", elem_id="policy_radio"
    )
    arrival_rate = gr.Number(
        value=0,
        label="Arrivals: Poisson rate, requests/s (0 = the table's arrival_s)",
        elem_id="arrival_rate_number",
    )
    compare_hf = gr.Checkbox(
        value=False,
        label="Also run transformers' built-in continuous batching",
        elem_id="compare_hf_checkbox",
    )
    knobs = (kv_mode, kv_budget, block_size, prefix_caching, token_budget, policy, arrival_rate)
    return (*knobs, compare_hf)


@dataclass
class ResultsPanel:
    """The status line and every view of a run: timelines, masks, block map, tables, charts."""

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

    def step_views(self) -> list:
        """The views a step or an x-axis change redraws, in ``run_view.STEP_VIEW_OUTPUTS`` order."""
        return [
            self.static_timeline_plot,
            self.continuous_timeline_plot,
            self.packed_mask_plot,
            self.static_mask_plot,
            self.block_map_plot,
        ]


def results_panel(shown: RunResult | None = None, server_names: list[str] = ()) -> ResultsPanel:
    """The results, below the editor, showing ``shown`` (the shipped recording) until a Run;
    with the host's servers (``server_names``), their line and charts too."""
    status = gr.Markdown(
        shown.status if shown is not None else "Press Run to compare the two engines.",
        elem_id="status_markdown",
    )
    servers_line = server_panels.servers_line(list(server_names))
    x_axis = gr.Radio(
        [("seconds", "time"), ("step index", "step")],
        value="time",
        label="Timeline x axis",
        elem_id="x_axis_radio",
    )
    step_views = _step_views(shown)
    metrics = gr.Dataframe(
        value=shown.metrics if shown is not None else None,
        headers=tables.METRICS_HEADERS,
        interactive=False,
        wrap=True,
        label="Metrics (hover a column's name for what it counts)",
        column_widths=tables.METRICS_COLUMN_WIDTHS,
        elem_id="metrics_table",
    )
    gr.Markdown(tables.METRICS_NOTE, elem_id="metrics_note")
    with gr.Row():
        latency_cdf = _plot("latency_cdf_plot", shown and shown.latency_cdf)
        step_usage = _plot("step_usage_plot", shown and shown.step_usage)
    server_plots = server_panels.server_plots(shown, list(server_names))
    engines = list(shown.state.traces()) if shown is not None else ["static", "continuous"]
    outputs = gr.Dataframe(
        value=shown.outputs if shown is not None else None,
        headers=tables.outputs_headers(engines),
        datatype="str",  # plain text: model output is never rendered as HTML or Markdown
        interactive=False,
        wrap=True,
        label="Outputs",
        column_widths=run_view.output_column_widths(engines),
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
    )


@dataclass
class DivergencePanel:
    """For a request whose output differs: which one, where it split and why, both runs' top 5."""

    dropdown: gr.Dropdown
    markdown: gr.Markdown
    textbox: gr.Textbox  # the model's text: the common prefix and both next tokens, plain
    table: gr.Dataframe

    def views(self) -> list:
        """What a pick redraws (``divergence_view.divergence_event``'s order)."""
        return [self.markdown, self.textbox, self.table]


def divergence_panel(shown: RunResult | None) -> DivergencePanel:
    """A closed accordion under the outputs: pick an (engine, request) that differs."""
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
    """Both timelines, the step slider, both masks and the block map, in ``ResultsPanel`` order."""
    v = shown.views if shown is not None else None
    with gr.Row():
        static_timeline = _plot("static_timeline_plot", v and v.static_timeline)
        continuous_timeline = _plot("continuous_timeline_plot", v and v.continuous_timeline)
    step_slider = gr.Slider(
        0,
        max(shown.state.num_steps - 1, 1) if shown is not None else 1,
        value=shown.step_index if shown is not None else 0,
        step=1,
        label=run_view.slider_label(shown.state) if shown else "Step (one forward pass)",
        elem_id="step_slider",
    )
    with gr.Row():
        packed_mask = _plot("packed_mask_plot", v and v.packed_mask)
        static_mask = _plot("static_mask_plot", v and v.static_mask)
    block_map = _plot("block_map_plot", v and v.block_map)
    return static_timeline, continuous_timeline, step_slider, packed_mask, static_mask, block_map


def _plot(elem_id: str, figure) -> gr.Plot:
    return gr.Plot(figure, show_label=False, elem_id=elem_id)


def downloads_panel() -> gr.File:
    """The run's files: requests, traces, a Perfetto trace and the charts."""
    return gr.File(
        label=(
            "Downloads: requests.csv · traces.json · trace.perfetto.json (ui.perfetto.dev) · "
            "charts.html (each chart's camera button also saves a PNG)"
        ),
        file_count="multiple",
        interactive=False,
        elem_id="downloads_file",
    )


def run_outputs(run_state: gr.State, results: ResultsPanel, downloads: gr.File) -> list:
    """What Run and Stop write, in ``engine.page.run_view.RUN_OUTPUTS`` order (tested)."""
    return [
        run_state,
        results.static_timeline_plot,
        results.continuous_timeline_plot,
        results.packed_mask_plot,
        results.static_mask_plot,
        results.step_slider,
        results.metrics_table,
        results.outputs_table,
        results.status_markdown,
        downloads,
        results.block_map_plot,
        results.latency_cdf_plot,
        results.step_usage_plot,
        results.server_timeline_plot,
        results.server_chart_plot,
        results.divergence.dropdown,
        *results.divergence.views(),
    ]


def run_inputs(requests: RequestsPanel, settings: SettingsPanel, results, run_state, handle):
    """What Run reads, in ``playground.run_event``'s argument order (the states are not in the
    /run API; the inputs after each keep the API's earlier positions)."""
    s = settings
    return [
        requests.table,
        s.slots_slider,
        s.chat_checkbox,
        s.reference_checkbox,
        s.kv_mode_dropdown,
        s.token_budget_number,
        s.policy_radio,
        s.compare_hf_checkbox,
        s.arrival_rate_number,
        results.x_axis_radio,
        run_state,  # the previous run, put back if this one is stopped
        s.kv_budget_number,  # after the state: the API's earlier inputs keep their places
        s.block_size_number,
        s.prefix_caching_checkbox,
        handle,  # for Stop
        s.servers_checkbox,  # the host's servers to run too (names only)
        s.dtype_dropdown,
        s.batch_invariant_checkbox,
    ]
