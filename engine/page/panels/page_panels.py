"""Panel builders: the page's components, built inside ``app.py``'s ``gr.Blocks``, one panel each.

``app.py`` calls these in page order and wires their components' events; each builder only lays
components out and returns them in a small dataclass named after the panel. Here: the header and
guided tour, the request editor, the downloads, and the lists of what Run reads and writes. The
two large panels have modules of their own: ``engine.page.panels.settings_panel`` and
``engine.page.panels.results_panel``. Element ids (``elem_id``) are a contract: the browser tests
and users' scripts find components by them.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.page.handlers import playground
from engine.page.panels import tour
from engine.page.panels.results_panel import ResultsPanel
from engine.page.panels.settings_panel import SettingsPanel

TITLE = "Continuous Batching Playground"
INTRO = (
    "The same requests run twice on the same model. **Static batching** pads a wave of B requests "
    "and runs it until its longest request is done; the other slots idle behind the batch "
    "barrier. **Continuous batching** refills a slot the step its request finishes, and packs "
    "every in-flight token into one forward pass, a new prompt's prefill riding along with the "
    "others' decode steps behind a block-diagonal causal mask. Edit the requests, pick the number "
    "of slots and press Run; then drag the step slider to see each step's attention mask."
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
    """What Run and Stop write, in ``engine.page.views.run_view.RUN_OUTPUTS`` order (tested)."""
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
